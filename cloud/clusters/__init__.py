"""Clusters with schedulers of their own (Slurm today; Kubernetes next) as places
greenfed runs work: docs/backends.md.

| question | file |
|---|---|
| what a back-end must answer and do | `backend.py` |
| how a cluster's machines become nodes, and documents become cluster jobs | `bridge.py` |
| which accelerator model a cluster's GPU type is | `gres.py` |
| what an admin registers (REST shapes) | `views.py` |
| the registered clusters of a running control plane | `runtime.py` |
| Slurm | `slurm/` |
"""
