#!/usr/bin/env bash
# Install and enrol a greenfed edge agent on a Debian/Ubuntu device.
#
#   sudo deploy/edge/install.sh --api https://cloud.example.com:8700 --token gfj_... \
#        [--ca ca.crt] [--node-id orin-1]
#
# The token comes from an admin: `greenfed nodes join-token create` (see docs/cli.md).
# Installs greenfed[edge] into /opt/greenfed/venv, enrols the node (`greenfed edge
# enrol` writes /etc/greenfed/agent.toml, mode 0600, owned by the greenfed user: its
# MQTT credentials, the control plane's public key, site/zone/region from the token),
# and enables the systemd service so the agent survives reboots. Re-running it on an
# enrolled node changes nothing.
set -euo pipefail

api="" token="" ca_file="" node_id=""
source_spec="${GREENFED_SOURCE:-greenfed[edge]}"
while [ $# -gt 0 ]; do
  case "$1" in
    --api) api="$2"; shift 2 ;;
    --token) token="$2"; shift 2 ;;
    --ca) ca_file="$2"; shift 2 ;;
    --node-id) node_id="$2"; shift 2 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done
for required in api token; do
  if [ -z "${!required}" ]; then echo "missing --${required}" >&2; exit 2; fi
done
[ "$(id -u)" -eq 0 ] || { echo "run as root (sudo)" >&2; exit 2; }

id greenfed >/dev/null 2>&1 || useradd --system --home /var/lib/greenfed --shell /usr/sbin/nologin greenfed
[ -x /opt/greenfed/venv/bin/greenfed ] || python3 -m venv /opt/greenfed/venv
/opt/greenfed/venv/bin/pip install --quiet --upgrade "$source_spec"

# The agent's user owns its settings: the file holds its broker password (mode 0600).
install -d -m 0700 -o greenfed -g greenfed /etc/greenfed
enrol=(/opt/greenfed/venv/bin/greenfed edge enrol --api "$api" --token "$token"
       --config /etc/greenfed/agent.toml)
if [ -n "$ca_file" ]; then
  install -m 0644 "$ca_file" /etc/greenfed/ca.crt
  enrol+=(--ca /etc/greenfed/ca.crt)
fi
[ -z "$node_id" ] || enrol+=(--node-id "$node_id")
sudo -u greenfed "${enrol[@]}"  # a node enrolled before: "nothing changed"

# Fail here, not in a restart loop, if the file or the hardware probes are broken.
sudo -u greenfed /opt/greenfed/venv/bin/greenfed edge discover --config /etc/greenfed/agent.toml

install -m 0644 "$(dirname "$0")/greenfed-agent.service" /etc/systemd/system/greenfed-agent.service
systemctl daemon-reload
systemctl enable --now greenfed-agent.service
echo "greenfed agent installed and enrolled; logs: journalctl -u greenfed-agent -f"
