"""How a training worker is contained on its node (docs/isolation.md).

============  ================================================================
probe.py      what this node can do: switch users, cgroups, namespaces, containers
setup.py      the node's sandbox set up once from the agent's settings
launcher.py   one worker's launch plan: user, work directory, cgroups, command line
users.py      whom a worker runs as (a uid per tenant, or a configured user)
cgroups.py    a cgroup per worker: memory, CPU, pids, devices; OOM counts; clean-up
bubblewrap.py the sandbox's command line (namespaces, the agent's files hidden)
containers.py podman and docker: image steps and the container's command line
devices.py    the device nodes of the accelerators a worker was given
============  ================================================================

The plan goes to the worker's wrapper (edge/training/wrapper.py), which carries it out.
"""
