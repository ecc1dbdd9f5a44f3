"""What the agent hands a worker's wrapper, and what the wrapper leaves for the agent.

The agent decides everything about how a worker runs (edge/sandbox/launcher.py): the
full command line of each of its processes (sandbox or container included), each
one's exact environment, working directory and cgroups, the image steps before them
and the clean-up after. The wrapper (edge/training/wrapper.py), which outlives the
agent, only carries that out: `LaunchPlan` reaches it on its standard input (never
on disk, never on a command line: environments hold the job's secrets), and it
leaves `ExitStatus` in the exit file when the worker is over.
"""

from __future__ import annotations

import msgspec


class PrepareStep(msgspec.Struct, frozen=True, kw_only=True):
    """Before any process starts: `check` (if given) tells whether the step is done
    already; otherwise `run` (if given) does it; failing that, the worker cannot
    start and `error` says why (with the last line the command printed)."""

    check: tuple[str, ...] = ()
    run: tuple[str, ...] = ()
    env: dict[str, str] = {}
    error: str


class ProcessPlan(msgspec.Struct, frozen=True, kw_only=True):
    rank: int  # the gang rank it is (or, launched per node, starts at)
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    # Joined before exec: whatever it starts stays in them (one file per hierarchy).
    cgroup_procs: tuple[str, ...] = ()
    # Its leaf's count of out-of-memory kills (memory.events or memory.oom_control).
    oom_file: str | None = None
    # cgroup v1 counts a kill in the victim's own group, which a container runtime
    # removes with the container: the most memory the leaf held (reaching its limit)
    # tells instead, when the process ended by a SIGKILL nobody else sent.
    memory_peak_file: str | None = None
    # A runtime that keeps its own cgroups says whether it killed the container for
    # memory: this prints "true" then.
    oom_query: tuple[str, ...] = ()
    memory_limit_bytes: int | None = None


class LaunchPlan(msgspec.Struct, frozen=True, kw_only=True):
    processes: tuple[ProcessPlan, ...]
    grace_period_s: float  # SIGTERM to SIGKILL when stopped, or when another one failed
    started_file: str  # written once every process has started (a `Started`)
    prepare: tuple[PrepareStep, ...] = ()
    # The run's groups: signalled on stop, emptied and removed at the end.
    cgroup_dirs: tuple[str, ...] = ()
    # Commands run at the end whatever happened (removing containers).
    cleanup: tuple[tuple[str, ...], ...] = ()
    # Files and directories removed at the end (the work directory, an auth file),
    # and files removed as soon as `prepare` is over (credentials).
    remove_paths: tuple[str, ...] = ()
    remove_after_prepare: tuple[str, ...] = ()
    # More than one process: each line of output says whose it is ("[rank 3] ...").
    label_output: bool = False


class ExitStatus(msgspec.Struct, frozen=True, kw_only=True):
    """How the worker ended: the first of its processes to fail, or 0 for all."""

    returncode: int | None
    error: str = ""  # it could not start (a step failed, a command was not found)
    rank: int | None = None  # the process whose end decided it
    oom_killed: bool = False
    memory_limit_bytes: int | None = None
    finished_at: float = 0.0


class Started(msgspec.Struct, frozen=True, kw_only=True):
    """The started file: when, and the process groups of the worker's processes (what
    an agent kills should the wrapper itself be gone, where no cgroup holds them)."""

    started_at: float
    process_groups: tuple[int, ...] = ()


PLAN_DECODER = msgspec.json.Decoder(LaunchPlan)
STARTED_DECODER = msgspec.json.Decoder(Started)
EXIT_DECODER = msgspec.json.Decoder(ExitStatus)
