#!/usr/bin/env bash
# Builds greenfed's release artefacts into dist/ (or --out DIR): the wheel and the sdist
# (`python -m build`), with --wheelhouse the wheels of everything the edge agent needs
# (dist/wheelhouse/, for installing devices with no package index:
# `deploy/edge/install.sh --source dist/greenfed-<version>-py3-none-any.whl`), and
# SHA256SUMS of every file. The version is pyproject.toml's, the only place it is set.
#
#   deploy/release.sh [--out DIR] [--wheelhouse]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
out="$repo/dist"
wheelhouse=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --wheelhouse) wheelhouse=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
python="${PYTHON:-python3}"
"$python" -m build --version >/dev/null 2>&1 || {
  echo "python -m build is missing: pip install build" >&2; exit 2;
}
rm -rf "$out"
mkdir -p "$out"
"$python" -m build --sdist --wheel --outdir "$out" "$repo" >&2
wheel="$(ls "$out"/greenfed-*.whl)"
if [ "$wheelhouse" -eq 1 ]; then
  # The agent's wheel with its edge extra and every dependency, as binary wheels for
  # this platform and Python (build one wheelhouse per device platform).
  "$python" -m pip download --quiet --only-binary=:all: --dest "$out/wheelhouse" "$wheel[edge]" >&2
fi
(cd "$out" && find . -type f ! -name SHA256SUMS -printf '%P\n' | sort | xargs sha256sum > SHA256SUMS)
echo "$out"
