"""Agent upgrades over the air: `versions.py` the versions a node keeps and what the
supervisor and the agent say to each other, `supervisor.py` the parent process that
starts the agent in a version and rolls a failed one back; the agent's side (fetch,
verify, unpack, ask for a restart) is edge/agent/upgrades.py."""
