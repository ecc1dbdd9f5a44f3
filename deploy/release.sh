#!/usr/bin/env bash
# Builds greenfed's release artefacts into dist/ (or --out DIR): the wheel and the sdist
# (`python -m build`), with --wheelhouse the wheels of everything the edge agent needs
# (dist/wheelhouse/, for installing devices with no package index:
# `deploy/edge/install.sh --source dist/greenfed-<version>-py3-none-any.whl`), and
# SHA256SUMS of those files. The version is pyproject.toml's, the only place it is set.
# DIR may hold earlier releases and anything else: they stay, and only the files this
# build makes replace those of the same names.
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
# Built apart, so that nothing of DIR is read or removed: this build's files are then
# moved in one by one, SHA256SUMS last.
work="$(mktemp -d "${TMPDIR:-/tmp}/greenfed-release.XXXXXX")"
trap 'rm -rf "$work"' EXIT
build="$work/dist"
"$python" -m build --sdist --wheel --outdir "$build" "$repo" >&2
wheel="$(ls "$build"/greenfed-*.whl)"
if [ "$wheelhouse" -eq 1 ]; then
  # The agent's wheel with its edge extra and every dependency, as binary wheels for
  # this platform and Python (build one wheelhouse per device platform).
  "$python" -m pip download --quiet --only-binary=:all: --dest "$build/wheelhouse" "$wheel[edge]" >&2
fi
(cd "$build" && find . -type f -printf '%P\n' | sort > "$work/files")
(cd "$build" && xargs -d '\n' sha256sum < "$work/files" > SHA256SUMS)
echo SHA256SUMS >> "$work/files"
mkdir -p "$out"
while IFS= read -r file; do
  mkdir -p "$out/$(dirname "$file")"
  mv -f "$build/$file" "$out/$file"
done < "$work/files"
echo "$out"
