"""What the agent hands a worker's wrapper, and what the wrapper leaves for the agent.

The agent decides everything about how a worker runs (edge/sandbox/launcher.py): the
full command line of each of its processes (sandbox or container included), each
one's exact environment, working directory and cgroups, the image steps before them
and the clean-up after. The wrapper (edge/training/wrapper.py), which outlives the
agent, only carries that out: `LaunchPlan` reaches it on its standard input as JSON
(never on disk, never on a command line: environments hold the job's secrets), and
it leaves `Started` and `ExitStatus` in files for the agent.

Plain typed dictionaries, so that the wrapper reads and writes them with the standard
library's json alone: it starts on every worker's critical path, and a serialization
library's import would cost it more than the rest of its start together. The agent,
which reads what the wrapper wrote, checks it on the way in (edge/training/process.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NotRequired, TypedDict


class PrepareStep(TypedDict):
    """Before any process starts: `check` (if not empty) tells whether the step is done
    already; otherwise `run` (if not empty) does it; failing that, the worker cannot
    start and `error` says why (with the last line the command printed)."""

    check: Sequence[str]
    run: Sequence[str]
    env: dict[str, str]
    error: str


class ProcessPlan(TypedDict):
    rank: int  # the gang rank it is (or, launched per node, starts at)
    argv: Sequence[str]
    env: dict[str, str]
    cwd: str
    # Joined before exec: whatever it starts stays in them (one file per hierarchy).
    cgroup_procs: Sequence[str]
    # Its leaf's count of out-of-memory kills (memory.events or memory.oom_control).
    oom_file: str | None
    # cgroup v1 counts a kill in the victim's own group, which a container runtime
    # removes with the container: the most memory the leaf held (reaching its limit)
    # tells instead, when the process ended by a SIGKILL nobody else sent.
    memory_peak_file: str | None
    # A runtime that keeps its own cgroups says whether it killed the container for
    # memory: this prints "true" then.
    oom_query: Sequence[str]
    memory_limit_bytes: int | None
    # Its own process is a sandbox's outer bubblewrap, which a SIGTERM kills, and the
    # sandbox with it (--die-with-parent): a stop's SIGTERM goes to the rest of its
    # cgroup only. Absent: false.
    sandboxed: NotRequired[bool]


class LaunchPlan(TypedDict):
    processes: Sequence[ProcessPlan]
    grace_period_s: float  # SIGTERM to SIGKILL when stopped, or when another one failed
    started_file: str  # written once every process has started (a `Started`)
    prepare: Sequence[PrepareStep]
    # The run's groups: signalled on stop, emptied and removed at the end.
    cgroup_dirs: Sequence[str]
    # Commands run at the end whatever happened (removing containers).
    cleanup: Sequence[Sequence[str]]
    # Files and directories removed at the end (the work directory, an auth file),
    # and files removed as soon as `prepare` is over (credentials).
    remove_paths: Sequence[str]
    remove_after_prepare: Sequence[str]
    # More than one process: each line of output says whose it is ("[rank 3] ...").
    label_output: bool


class Started(TypedDict):
    """The started file: when, and the process groups of the worker's processes (what
    an agent kills should the wrapper itself be gone, where no cgroup holds them)."""

    started_at: float
    process_groups: Sequence[int]


class ExitStatus(TypedDict):
    """How the worker ended: the first of its processes to fail, or 0 for all."""

    returncode: int | None
    error: str  # it could not start (a step failed, a command was not found)
    finished_at: float
    rank: NotRequired[int | None]  # the process whose end decided it
    oom_killed: NotRequired[bool]
    memory_limit_bytes: NotRequired[int | None]
