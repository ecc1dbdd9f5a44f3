#!/usr/bin/env bash
# Install and enrol a greenfed edge agent on a Debian/Ubuntu device.
#
#   sudo deploy/edge/install.sh --node-id orin-1 --zone CA-ON --region northamerica-northeast2 \
#        --mqtt-url mqtts://broker.example.com:8883 --password SECRET [--ca-file ca.crt] [--site edge]
#
# Installs greenfed[edge] into /opt/greenfed/venv, writes /etc/greenfed/agent.toml,
# and enables the systemd service so the agent survives reboots.
set -euo pipefail

node_id="" zone="" region="" mqtt_url="" password="" ca_file="" site="edge"
source_spec="${GREENFED_SOURCE:-greenfed[edge]}"
while [ $# -gt 0 ]; do
  case "$1" in
    --node-id) node_id="$2"; shift 2 ;;
    --zone) zone="$2"; shift 2 ;;
    --region) region="$2"; shift 2 ;;
    --mqtt-url) mqtt_url="$2"; shift 2 ;;
    --password) password="$2"; shift 2 ;;
    --ca-file) ca_file="$2"; shift 2 ;;
    --site) site="$2"; shift 2 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done
for required in node_id zone region mqtt_url; do
  if [ -z "${!required}" ]; then echo "missing --${required//_/-}" >&2; exit 2; fi
done
[ "$(id -u)" -eq 0 ] || { echo "run as root (sudo)" >&2; exit 2; }

id greenfed >/dev/null 2>&1 || useradd --system --home /var/lib/greenfed --shell /usr/sbin/nologin greenfed
python3 -m venv /opt/greenfed/venv
/opt/greenfed/venv/bin/pip install --upgrade "$source_spec"

install -d -m 0750 -o root -g greenfed /etc/greenfed
ca_line=""
if [ -n "$ca_file" ]; then
  install -m 0640 -o root -g greenfed "$ca_file" /etc/greenfed/ca.crt
  ca_line='tls_ca_file = "/etc/greenfed/ca.crt"'
fi
umask 027
cat > /etc/greenfed/agent.toml <<TOML
[mqtt]
url = "${mqtt_url}"
username = "${node_id}"
password = "${password}"
${ca_line}

[agent]
node_id = "${node_id}"
site = "${site}"
zone = "${zone}"
region = "${region}"

[log]
format = "json"
TOML
chgrp greenfed /etc/greenfed/agent.toml

# Fail here, not in a restart loop, if the file or the hardware probes are broken.
sudo -u greenfed /opt/greenfed/venv/bin/greenfed edge discover --config /etc/greenfed/agent.toml

install -m 0644 "$(dirname "$0")/greenfed-agent.service" /etc/systemd/system/greenfed-agent.service
systemctl daemon-reload
systemctl enable --now greenfed-agent.service
echo "greenfed agent ${node_id} installed; logs: journalctl -u greenfed-agent -f"
