#!/bin/sh
# Give greenfed's control plane its broker account, once, on a Mosquitto that runs
# the dynamic security plugin (mosquitto-dynsec.conf). Afterwards the control plane
# creates, resets and disables every node's account itself.
#
#   mosquitto_ctrl dynsec init /etc/mosquitto/dynamic-security.json admin   # once, broker stopped
#   systemctl restart mosquitto
#   GREENFED_CLOUD_PASSWORD=... deploy/mosquitto/dynsec-bootstrap.sh -h 127.0.0.1 -p 1883 -u admin
#
# Arguments are mosquitto_ctrl's connect options (-h, -p, -u, -P, --cafile, ...), for
# the admin account made by `dynsec init`. Environment:
#   GREENFED_CLOUD_USER      the control plane's [mqtt] username (default greenfed-cloud)
#   GREENFED_CLOUD_PASSWORD  its password (unset: mosquitto_ctrl asks for it)
#   GREENFED_CLOUD_PASSWORD_FILE  a file holding it instead (greenfed-mosquitto-dynsec.service
#                            hands it over as a systemd credential)
#   GREENFED_TOPIC_ROOT      [mqtt] topic_root (default greenfed)
#
# Several fleets (topic roots) on one broker: run it once per root, each with a
# control-plane account of its own (GREENFED_CLOUD_USER).
set -eu

user="${GREENFED_CLOUD_USER:-greenfed-cloud}"
root="${GREENFED_TOPIC_ROOT:-greenfed}"
# The default root keeps the name it always had; another root's role carries the root,
# as the control plane names node roles (cloud/broker_accounts/dynsec_protocol.py
# role_for_root), so that a second root's bootstrap does not find its role taken.
if [ "$root" = greenfed ]; then
    role=greenfed-control-plane
else
    role="greenfed-control-plane@$root"
fi

ctrl() {
    if [ -t 0 ]; then  # a person at a terminal: mosquitto_ctrl may ask for a password
        mosquitto_ctrl "$@"
        return
    fi
    # mosquitto_ctrl exits 0 even when the broker refused: its output says so, and a
    # refusal must stop the bootstrap (the one-shot unit would record it as done).
    out="$(mosquitto_ctrl "$@" 2>&1)" || { printf '%s\n' "$out" >&2; return 1; }
    printf '%s\n' "$out"
    case "$out" in *[Ee]rror*) return 1 ;; esac
}

# The control plane writes every node's desired state; the `admin` role of
# `dynsec init` already lets it subscribe to and receive everything, and administer
# accounts on $CONTROL/dynamic-security/v1.
ctrl "$@" dynsec createRole "$role"
ctrl "$@" dynsec addRoleACL "$role" publishClientSend "$root/#" allow
if [ -z "${GREENFED_CLOUD_PASSWORD:-}" ] && [ -n "${GREENFED_CLOUD_PASSWORD_FILE:-}" ]; then
    GREENFED_CLOUD_PASSWORD="$(cat "$GREENFED_CLOUD_PASSWORD_FILE")"
fi
if [ -n "${GREENFED_CLOUD_PASSWORD:-}" ]; then
    ctrl "$@" dynsec createClient "$user" -p "$GREENFED_CLOUD_PASSWORD"
else
    ctrl "$@" dynsec createClient "$user"
fi
ctrl "$@" dynsec addClientRole "$user" admin
ctrl "$@" dynsec addClientRole "$user" "$role"
