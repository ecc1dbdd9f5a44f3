"""Agent upgrades over the air, the control plane's side: `views.py` what the API takes
and gives, `packages.py` publishing a wheel (checked and signed), `rollout.py` how a
rollout moves through the fleet in waves, `controller.py` the loop's step that drives
it and names the version in each asked node's `desired` document. The agent's side is
edge/agent/upgrades.py and edge/upgrade/."""
