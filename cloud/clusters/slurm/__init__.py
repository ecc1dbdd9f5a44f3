"""Slurm as a greenfed back-end.

| question | file |
|---|---|
| how the commands are run (here, or on a login node over SSH) | `commands.py` |
| what Slurm's nodes, jobs, states and reasons mean to greenfed | `records.py` |
| how a gang becomes one `sbatch` job, and its env contract | `script.py` |
| the back-end itself: capacity, jobs, submit, cancel, output | `backend.py` |
| whether the cluster keeps job accounting, and why a read of it failed | `accounting_reads.py` |
"""
