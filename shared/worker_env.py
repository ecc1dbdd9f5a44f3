"""The environment contract of a training worker: what greenfed sets in every worker's
environment, which a job's `env` and `secret_env` may therefore not set.

The agent builds each worker's environment from nothing but these, the job's own
variables and a few neutral defaults (edge/training/environment.py): nothing of the
agent's own environment reaches a worker. docs/rest.md#the-worker-environment lists
what each means.
"""

from __future__ import annotations

from typing import Final

# Set for every worker, whatever the job says.
RUNNER_VARIABLES: Final = frozenset(
    {
        # torch.distributed (env:// rendezvous) and torchrun's own contract
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "NNODES",
        "NPROC_PER_NODE",
        "MASTER_ADDR",
        "MASTER_PORT",
        # torchrun's own options (launch = "per-node": a plain `torchrun train.py` works)
        "PET_NNODES",
        "PET_NPROC_PER_NODE",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
        # the devices it was given
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        # greenfed's own
        "GREENFED_JOB_ID",
        "GREENFED_ATTEMPT",
        "GREENFED_TENANT",
        "GREENFED_CPU_CORES",
        "GREENFED_WORK_DIR",
    }
)

# Set for every worker of a task of a job array (Slurm's SLURM_ARRAY_*), as part of
# the task's own env: greenfed writes them into each task's spec when it creates the
# tasks, so a submitted env may not set them.
ARRAY_VARIABLES: Final = frozenset(
    {
        "GREENFED_ARRAY_JOB_ID",  # the array's id
        "GREENFED_ARRAY_TASK_ID",  # this task's index
        "GREENFED_ARRAY_TASK_COUNT",  # how many tasks the array has
        "GREENFED_ARRAY_TASK_MIN",  # its lowest index
        "GREENFED_ARRAY_TASK_MAX",  # its highest index
    }
)

# Set for every worker unless the job's `env` sets them (their defaults are neutral).
DEFAULT_VARIABLES: Final = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
