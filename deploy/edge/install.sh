#!/usr/bin/env bash
# Install (or uninstall) the greenfed edge agent on a Debian/Ubuntu device.
#
#   sudo deploy/edge/install.sh --api https://cloud.example.com:8700 --token gfj_... \
#        [--ca ca.crt] [--node-id orin-1] [--source WHEEL|PATH|REQUIREMENT] [--upgrade]
#   sudo deploy/edge/install.sh --uninstall [--purge]
#
# The token comes from an admin: `greenfed nodes join-token create` (see docs/cli.md).
# Installs only greenfed's edge extra into /opt/greenfed/venv, enrols the node
# (`greenfed edge enrol` writes /etc/greenfed/agent.toml, mode 0600, owned by root: its
# MQTT credentials, the control plane's public key, site, zone and region from the
# token; and makes the node's sealing key in /var/lib/greenfed/state), checks the
# hardware probes, and enables the systemd unit so the agent survives reboots. The
# agent runs as root so that every training worker runs as an unprivileged user of its
# own, sandboxed and held by cgroups (docs/isolation.md); install bubblewrap (and
# podman, runc and catatonit for work that names an image) from the distribution. Idempotent: re-running it on an installed, enrolled node
# changes nothing (`--upgrade` reinstalls the package; an enrolled node needs no
# --api/--token). `--uninstall` stops and removes the unit and the venv and keeps the
# settings and the agent's state (/etc/greenfed, /var/lib/greenfed) unless `--purge`.
#
# What it installs, in this order: `--source` (a wheel file, a local path, or a
# requirement for the package index); else a greenfed wheel beside this script (an
# unpacked release); else the checkout this script is part of; else greenfed from the
# index. A wheel with a `wheelhouse/` beside it (deploy/release.sh --wheelhouse) installs
# with no index at all.
#
# `--root DIR` installs into DIR instead of / (an image being built, or a test): no
# user is created, files belong to whoever runs it, and systemd is not touched.
set -euo pipefail

api="" token="" ca_file="" node_id="" root="" upgrade=0 uninstall=0 purge=0
source_spec="${GREENFED_SOURCE:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --api) api="$2"; shift 2 ;;
    --token) token="$2"; shift 2 ;;
    --ca) ca_file="$2"; shift 2 ;;
    --node-id) node_id="$2"; shift 2 ;;
    --source) source_spec="$2"; shift 2 ;;
    --root) root="${2%/}"; shift 2 ;;
    --upgrade) upgrade=1; shift ;;
    --uninstall) uninstall=1; shift ;;
    --purge) purge=1; shift ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done

venv="$root/opt/greenfed/venv"
etc="$root/etc/greenfed"
config="$etc/agent.toml"
state="$root/var/lib/greenfed"
unit="$root/etc/systemd/system/greenfed-agent.service"
here="$(cd "$(dirname "$0")" && pwd)"
if [ -z "$root" ]; then
  [ "$(id -u)" -eq 0 ] || { echo "run as root (sudo)" >&2; exit 2; }
  owner=(-o root -g root)
else
  owner=()
fi
# Where the agent keeps its state, as the unit tells it (enrolment makes the node's
# sealing key there).
as_agent=(env "GREENFED_AGENT__DATA_DIR=$state")
say() { echo "greenfed install: $*"; }

if [ "$uninstall" -eq 1 ]; then
  if [ -z "$root" ] && systemctl list-unit-files greenfed-agent.service >/dev/null 2>&1; then
    systemctl disable --now greenfed-agent.service 2>/dev/null || true
  fi
  rm -f "$unit"
  [ -n "$root" ] || systemctl daemon-reload 2>/dev/null || true
  rm -rf "$root/opt/greenfed"
  if [ "$purge" -eq 1 ]; then
    rm -rf "$etc" "$state"
    # (the greenfed user of earlier versions, which ran the agent, is removed too)
    [ -n "$root" ] || ! id greenfed >/dev/null 2>&1 || userdel greenfed
    say "removed, settings and state included"
  else
    say "removed; kept $etc and $state (--purge removes them)"
  fi
  exit 0
fi

enrolled=0
[ -f "$config" ] && head -n1 "$config" | grep -q '^# greenfed enrolment:' && enrolled=1
if [ "$enrolled" -eq 0 ]; then
  for required in api token; do
    if [ -z "${!required}" ]; then echo "missing --${required} (the node is not enrolled)" >&2; exit 2; fi
  done
fi

# What to install, in this order: the --source given (a wheel file, a local path, or a
# requirement for the index); else a greenfed wheel beside this script (an unpacked
# release); else the checkout this script is part of; else greenfed from the index.
if [ -z "$source_spec" ]; then
  here="$(cd "$(dirname "$0")" && pwd)"
  beside="$(ls "$here"/greenfed-*.whl 2>/dev/null | sort -V | tail -n 1 || true)"
  if [ -n "$beside" ]; then
    source_spec="$beside"
  elif grep -qs '^name = "greenfed"' "$here/../../pyproject.toml"; then
    source_spec="$(cd "$here/../.." && pwd)"
  else
    source_spec="greenfed"
  fi
fi
pip_options=(--quiet --upgrade)
case "$source_spec" in
  *.whl)
    [ -f "$source_spec" ] || { echo "no wheel file $source_spec" >&2; exit 2; }
    # A release's wheelhouse beside the wheel holds every dependency: no index needed.
    wheels="$(dirname "$source_spec")/wheelhouse"
    [ -d "$wheels" ] && pip_options+=(--no-index --find-links "$wheels")
    ;;
esac
if [ ! -x "$venv/bin/greenfed" ] || [ "$upgrade" -eq 1 ]; then
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  # Only the edge extra: no database stack or control plane on a device.
  spec="$source_spec"
  case "$spec" in *\[*) ;; *) spec="$spec[edge]" ;; esac
  "$venv/bin/pip" install "${pip_options[@]}" "$spec"
  say "installed $spec into $venv"
fi

# Root owns the settings: the file holds the node's broker password (mode 0600). Others
# may pass through the state directory to their own work directory, never list it.
[ -d "$etc" ] || install -d -m 0700 "${owner[@]}" "$etc"
[ -d "$state" ] || install -d -m 0711 "${owner[@]}" "$state"
if [ "$enrolled" -eq 0 ]; then
  enrol=("$venv/bin/greenfed" edge enrol --api "$api" --token "$token" --config "$config")
  if [ -n "$ca_file" ]; then
    install -m 0644 "$ca_file" "$etc/ca.crt"
    enrol+=(--ca "$etc/ca.crt")
  fi
  [ -z "$node_id" ] || enrol+=(--node-id "$node_id")
  "${as_agent[@]}" "${enrol[@]}"
fi

# Fail here, not in a restart loop, if the file or the hardware probes are broken.
"${as_agent[@]}" "$venv/bin/greenfed" edge discover --config "$config" >/dev/null

if ! cmp -s "$here/greenfed-agent.service" "$unit"; then
  install -D -m 0644 "$here/greenfed-agent.service" "$unit"
  say "installed $unit"
  [ -n "$root" ] || systemctl daemon-reload
fi
if [ -z "$root" ]; then
  systemctl is-enabled --quiet greenfed-agent.service || systemctl enable greenfed-agent.service
  if systemctl is-active --quiet greenfed-agent.service; then
    # A new package or unit takes effect now; training workers outlive the restart.
    [ "$upgrade" -eq 0 ] || systemctl try-restart greenfed-agent.service
  else
    systemctl start greenfed-agent.service
  fi
fi
say "done; check the node with: ${as_agent[*]} $venv/bin/greenfed edge doctor --config $config"
