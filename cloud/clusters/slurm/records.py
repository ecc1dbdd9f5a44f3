"""Slurm's records read into the back-end's terms: nodes (`scontrol -o show node`, with
the states of their partitions from `scontrol -o show partition`), jobs (`scontrol -o
show job`, `sacct -P`), and what Slurm's job states and reasons mean to greenfed.

A partition that is not UP (DOWN, INACTIVE: nothing in it starts; DRAIN: it takes no
new job) is left to the end of each of its machines' partitions, so that greenfed
places work on a machine through one that is up where it has one; a machine none of
whose partitions is up takes no work (`unavailable`, saying which partitions). Each
machine carries its partitions' availability, by which the bridge judges it for the
partitions greenfed may use there.

A pending job's reason says whether it waits its turn or cannot start where it is
(`QueueWait`): PartitionDown, PartitionInactive and ReqNodeNotAvail (its machines or
partition take no work) cannot start; every other reason (Resources, Priority,
Dependency, BeginTime, a QOS or association limit, a hold, and those of the job's own
request, PartitionNodeLimit, PartitionTimeLimit, PartitionConfig) waits its turn.

- pending: PENDING, CONFIGURING, REQUEUED, REQUEUE_HOLD, REQUEUE_FED, RESV_DEL_HOLD (in
  the cluster's queue; the reason says why: Resources, Priority, QOS limits, a requeue);
- running: RUNNING, COMPLETING, SIGNALING, STAGE_OUT, SUSPENDED, STOPPED, RESIZING (it
  holds its nodes; a suspended or SIGSTOPped job too, and the reason says so);
- succeeded: COMPLETED with exit code 0;
- failed: FAILED, NODE_FAIL, BOOT_FAIL, OUT_OF_MEMORY, TIMEOUT, DEADLINE (the reason
  names which, and keeps Slurm's beside an exit code; a job Slurm could not launch says
  so, with no exit code);
- stopped: CANCELLED, PREEMPTED, REVOKED, SPECIAL_EXIT (the cluster, or someone on it,
  stopped it: greenfed decides what follows, as for any stopped worker); and a job the
  cluster requeued although greenfed asked it not to (its restart count above 0:
  slurmrestd v0.0.38 ignores `"requeue": false`), which would otherwise start again
  from its beginning behind greenfed's back (`requeued_job_state`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Final, TypeVar

import structlog

from cloud.clusters.backend import (
    MAX_ACCELERATORS_PER_NODE,
    ClusterJob,
    ClusterJobState,
    ClusterNode,
    PartitionAvailability,
    QueueWait,
    partitions_not_up,
)
from cloud.clusters.slurm.script import comment_prefix

_PENDING: Final = frozenset(
    {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
)
_RUNNING: Final = frozenset(
    {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "SUSPENDED", "STOPPED", "RESIZING"}
)
# What a job requeued by the cluster says (its state word, or its restart count).
REQUEUED_BY_CLUSTER: Final = "requeued by the cluster"
# Running jobs whose state says more than "running": both still hold their allocation.
_HELD: Final = {
    "SUSPENDED": "suspended by the cluster",
    "STOPPED": "stopped (SIGSTOP) on the cluster",
}
_FAILED: Final = {
    "FAILED": "the job exited non-zero",
    "NODE_FAIL": "a node of the job failed",
    "BOOT_FAIL": "a node of the job failed to boot",
    "OUT_OF_MEMORY": "the job ran out of memory",
    "TIMEOUT": "the job reached its time limit",
    "DEADLINE": "the job reached its deadline",
}
# Slurm's reasons for a job it never started: its ExitCode then holds a Slurm error
# number read as a wait status (`0:53`), no code of the job's.
_NOT_LAUNCHED: Final = {"JobLaunchFailure": "the cluster could not launch the job"}
# Slurm's reasons that only repeat what the exit code says.
_SAID_BY_EXIT_CODE: Final = frozenset({"NonZeroExitCode"})
_STOPPED: Final = {
    "CANCELLED": "cancelled on the cluster",
    "PREEMPTED": "preempted by the cluster's scheduler",
    "REVOKED": "revoked (run on another cluster of a federation)",
    "SPECIAL_EXIT": "held after a special exit",
}
# A node in an active reservation runs only jobs that ask for it (`--reservation`), which
# greenfed's never do: one placed there would wait in the queue. Slurm 22.05 says
# MAINTENANCE for a maintenance one (`IDLE+MAINTENANCE+RESERVED`, in `scontrol` and
# slurmrestd alike); MAINT is that flag's short name.
_IN_RESERVATION: Final = {
    "MAINT": "in a maintenance reservation",
    "MAINTENANCE": "in a maintenance reservation",
    "RESERVED": "in a reservation greenfed's jobs do not ask for",
}
# Slurm's pending reasons that say a job cannot start where it is because of the place:
# nothing of its partition starts (down, inactive), or the machines it asks for take no
# work (drained, down, in a reservation). Only the reason's name counts: `scontrol` writes
# its detail after it (`ReqNodeNotAvail,_UnavailableNodes:node07`). Any other reason waits
# its turn, those of the job's own request among them (PartitionNodeLimit,
# PartitionTimeLimit, PartitionConfig: every machine of the partition would refuse it
# alike, so placing it again elsewhere there would churn submissions for ever; it waits
# with Slurm's reason shown, `worker_reason`).
_CANNOT_START: Final = frozenset({"PartitionDown", "PartitionInactive", "ReqNodeNotAvail"})
_REASON_NAME: Final = re.compile(r"[A-Za-z]*")
_PARTITION_AVAILABILITY: Final[Mapping[str, PartitionAvailability]] = {
    "UP": "up",
    "DRAIN": "drain",
    "DOWN": "down",
    "INACTIVE": "inactive",
}
# gf-<job id>-<attempt>: the name greenfed gives each attempt it submits.
_JOB_NAME: Final = re.compile(r"^gf-(?P<job>[0-9A-Z]{26})-(?P<attempt>[0-9]{1,9})$")
_FIELD: Final = re.compile(r"(?:^|\s)(?P<key>[A-Za-z][A-Za-z0-9:/_]*)=(?P<value>\S*)")
# Slurm's job ids as greenfed submits them: plain numbers (no array `12_3`, no
# heterogeneous `12+0`, nothing an option parser could take for an option).
_SLURM_JOB_ID: Final = re.compile(r"[0-9]{1,20}")
_MEMORY_UNITS: Final = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# The most machine names one host list expands to (the largest clusters have some
# 10,000 machines): a longer list is unreadable, never millions of names built on the
# control plane's event loop.
MAX_HOSTLIST_NAMES: Final = 65536
# The digits of a number in a host list range (`n[000001-000009]`): more is no machine.
_MAX_RANGE_DIGITS: Final = 9
# `UserId=greenfed(1001)`: the owner of a job in `scontrol -o show job`.
_USER_ID: Final = re.compile(r"(?P<name>[^()]*)\((?P<uid>[0-9]{1,10})\)")
# Records left out as unreadable, remembered to log each once (bounded: a cluster that
# prints a new bad record every refresh does not grow it without end).
_MAX_LOGGED_UNREADABLE: Final = 1024
_logged_unreadable: set[str] = set()

_log = structlog.get_logger("greenfed.clusters.slurm")

_Raw = TypeVar("_Raw")
_Record = TypeVar("_Record")


class UnreadableRecord(ValueError):
    """A record of the cluster's that cannot be read as Slurm writes it (left out)."""


def _unreadable_once(what: str, detail: str) -> None:
    key = f"{what}:{detail[:200]}"
    if key in _logged_unreadable or len(_logged_unreadable) >= _MAX_LOGGED_UNREADABLE:
        return
    _logged_unreadable.add(key)
    _log.warning("slurm record left out: unreadable", record=what, detail=detail[:300])


def readable(read: Callable[[_Raw], _Record | None], raw: _Raw, what: str) -> _Record | None:
    """`read(raw)`, or None where the record cannot be read (a number no `int` takes, a
    value of the wrong kind): one bad record is left out, never every other one with it."""
    try:
        return read(raw)
    except (ValueError, OverflowError, TypeError, AttributeError) as error:
        _unreadable_once(what, str(error))
        return None


def key_values(line: str) -> dict[str, str] | None:
    """The `Key=Value` pairs of one `scontrol -o` line (values without spaces: the
    fields greenfed reads have none). None where a key appears twice: Slurm prints each
    once, so a value with spaces carries pairs of its own (a job's `WorkDir`, which
    comes before `Comment` and `StdOut`), and neither the first nor the last of them
    can be believed."""
    fields: dict[str, str] = {}
    for match in _FIELD.finditer(line):
        if match["key"] in fields:
            return None
        fields[match["key"]] = match["value"]
    return fields


def slurm_lines(text: str) -> list[str]:
    """The records of a Slurm command's output, one a line. Split on "\\n" alone:
    `str.splitlines` also splits on characters a value may hold (U+2028, \\f, \\x85),
    which would start a record of the value's making."""
    return [line for line in text.split("\n") if line.strip()]


def is_slurm_job_id(text: str) -> bool:
    """Whether `text` is a job id as Slurm gives greenfed's jobs (a plain number)."""
    return _SLURM_JOB_ID.fullmatch(text) is not None


def comment_matches(comment: str, identity: tuple[str, int]) -> bool:
    """Whether a job's comment (`--comment=greenfed:<job id>:<attempt>:<tenant>`,
    cloud/clusters/slurm/script.py) is the one greenfed gave the attempt its name says.
    An empty comment matches: Slurm leaves it out where the cluster keeps none (sacct
    without AccountingStoreFlags=job_comment)."""
    return not comment or comment.startswith(comment_prefix(*identity))


def job_identity(name: str) -> tuple[str, int] | None:
    """(greenfed job id, attempt) of a job name greenfed gave; None for anyone else's."""
    match = _JOB_NAME.fullmatch(name)
    if match is None:
        return None
    return match["job"], int(match["attempt"])


def gres_counts(text: str) -> dict[str, int]:
    """`gpu:a100:4(S:0-1),gpu:t4:2` -> {"a100": 4, "t4": 2}; an untyped `gpu:2` counts
    under "gpu"; other GRES (`shard`, `mps`) are not accelerators and are left out."""
    counts: dict[str, int] = {}
    if text in ("", "(null)"):
        return counts
    for entry in re.sub(r"\([^)]*\)", "", text).split(","):
        parts = entry.split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        if len(parts) == 2:
            kind, count = "gpu", parts[1]
        else:
            kind, count = parts[1], parts[2]
        number = re.match(r"[0-9]{1,9}", count)
        if number is not None:
            counts[kind] = counts.get(kind, 0) + int(number.group())
    # A node's GPUs become one accelerator each in its birth: a count no machine has is
    # a broken record (logged once), its GPUs left out rather than built by the million.
    absurd = {kind: count for kind, count in counts.items() if count > MAX_ACCELERATORS_PER_NODE}
    if absurd:
        _unreadable_once("gres", f"{text[:200]}: over {MAX_ACCELERATORS_PER_NODE} GPUs of a type")
    return {kind: count for kind, count in counts.items() if kind not in absurd}


def allocated_gpus(alloc_tres: str, configured: Mapping[str, int]) -> dict[str, int]:
    """GPUs the cluster has allocated on a node, by type, from its `AllocTRES`
    (`cpu=4,mem=8G,gres/gpu=2,gres/gpu:a100=2`). Where only the untyped count is
    there, a node of one GPU type has them all of that type; on a node of several
    types they are counted against the types in order (a lower bound for each)."""
    typed: dict[str, int] = {}
    untyped = 0
    for entry in alloc_tres.split(","):
        name, _, value = entry.partition("=")
        if not name.startswith("gres/gpu") or not _is_number(value):
            continue
        if name == "gres/gpu":
            untyped = int(value)
        else:
            typed[name.removeprefix("gres/gpu:")] = int(value)
    if typed or not untyped:
        return typed
    allocated: dict[str, int] = {}
    for kind, total in configured.items():
        allocated[kind] = min(total, untyped)
        untyped -= allocated[kind]
    return allocated


def memory_bytes(text: str) -> int:
    """Slurm's memory (`RealMemory` is MB; `mem=8G` in TRES)."""
    match = re.fullmatch(r"([0-9.]+)([KMGT]?)", text)
    if match is None:
        return 0
    return int(float(match.group(1)) * _MEMORY_UNITS[match.group(2)])


def node_of(line: str) -> ClusterNode | None:
    fields = key_values(line)
    if fields is None:
        return None
    name = fields.get("NodeName")
    if not name:
        return None
    configured = gres_counts(fields.get("Gres", ""))
    return ClusterNode(
        name=name,
        partitions=tuple(p for p in fields.get("Partitions", "").split(",") if p),
        cpus=int(fields.get("CPUTot", "0") or 0),
        memory_bytes=int(fields.get("RealMemory", "0") or 0) * (1 << 20),
        accelerators=configured,
        allocated=allocated_gpus(fields.get("AllocTRES", ""), configured),
        unavailable=node_unavailable(fields.get("State", "UNKNOWN"), fields.get("Reason", "")),
    )


def node_unavailable(state: str, reason: str) -> str:
    """Why a node in that state (`IDLE+DRAIN`, `DOWN*`, `IDLE+RESERVED`) takes no new
    work; "": it does."""
    flags = set(state.upper().rstrip("*").split("+"))
    if flags & {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING"}:
        return state.lower() + (f": {reason}" if reason else "")
    if "*" in state or flags & {"FUTURE", "POWERED_DOWN", "POWERING_DOWN", "UNKNOWN", ""}:
        return state.lower() or "unknown"
    for flag, why in _IN_RESERVATION.items():
        if flag in flags:
            return f"{state.lower()}: {why}"
    return ""


def nodes_of(text: str) -> tuple[ClusterNode, ...]:
    found = (readable(node_of, line, "node") for line in slurm_lines(text))
    return tuple(node for node in found if node is not None)


def partition_states(text: str) -> dict[str, str]:
    """`scontrol -a -o show partition` -> {partition: its state (`UP`, `DOWN`, `DRAIN`,
    `INACTIVE`)}; a record without a name is left out."""
    states: dict[str, str] = {}
    for line in slurm_lines(text):
        fields = key_values(line)
        if fields and fields.get("PartitionName"):
            states[fields["PartitionName"]] = fields.get("State", "").upper()
    return states


def partition_availability(state: str) -> PartitionAvailability:
    """A partition's availability from its state as `scontrol` writes it (`UP`, `DOWN`,
    `DRAIN`, `INACTIVE`); any other (or none) is `unknown`, taken as not up."""
    return _PARTITION_AVAILABILITY.get(state.upper(), "unknown")


def with_partition_states(
    nodes: Iterable[ClusterNode], states: Mapping[str, str]
) -> tuple[ClusterNode, ...]:
    """The machines with their partitions' availability, those that are up first
    (Slurm's order kept among each), and those none of whose partitions is up marked
    unavailable, saying which. A partition the listing does not name (one created since)
    is taken to be up."""
    marked = []
    for node in nodes:
        availability = {
            p: partition_availability(states[p]) for p in node.partitions if p in states
        }
        down = {p: state for p, state in availability.items() if state != "up"}
        partitions = tuple(p for p in node.partitions if p not in down) + tuple(down)
        unavailable = node.unavailable
        if down and len(down) == len(node.partitions) and not unavailable:
            unavailable = partitions_not_up(down)
        marked.append(
            dataclasses.replace(
                node,
                partitions=partitions,
                unavailable=unavailable,
                partition_availability=availability,
            )
        )
    return tuple(marked)


def queue_wait(slurm_reason: str) -> QueueWait:
    """Whether a pending job with Slurm's reason waits its turn or cannot start where
    it is (`_CANNOT_START`)."""
    name = _REASON_NAME.match(slurm_reason)
    return "cannot_start" if name is not None and name[0] in _CANNOT_START else "turn"


def job_state(slurm_state: str, reason: str, exit_code: int | None) -> tuple[ClusterJobState, str]:
    """greenfed's state of a Slurm job state, with why (for people)."""
    # `CANCELLED by 0` (sacct), `PENDING+REQUEUED` (slurmrestd's state lists joined).
    words = [word for word in re.split(r"[+\s]", slurm_state) if word] or ["UNKNOWN"]
    base = words[0]
    why = "" if reason in ("", "None", "(null)") else reason
    if base in _PENDING:
        requeued = base.startswith("REQUEUE") or any(w.startswith("REQUEUE") for w in words)
        detail = REQUEUED_BY_CLUSTER if requeued else ""
        return "pending", "; ".join(part for part in (detail, why) if part)
    if base in _RUNNING:
        return "running", _HELD.get(base, why)
    if base == "COMPLETED":
        return ("succeeded", "") if not exit_code else ("failed", f"exit code {exit_code}")
    if base in _FAILED and why in _NOT_LAUNCHED:
        return "failed", f"{_NOT_LAUNCHED[why]} ({why})"
    if base == "FAILED" and exit_code:
        beside = "" if why in _SAID_BY_EXIT_CODE else why
        return "failed", "; ".join(part for part in (f"exit code {exit_code}", beside) if part)
    if base in _FAILED:
        return "failed", "; ".join(part for part in (_FAILED[base], why) if part)
    if base in _STOPPED:
        return "stopped", _STOPPED[base]
    return "failed", f"unknown Slurm state {slurm_state!r}"


def requeued_job_state(
    state: ClusterJobState, reason: str, restarts: int
) -> tuple[ClusterJobState, str]:
    """greenfed's state of a job Slurm has requeued `restarts` times (its `restart_cnt`),
    read as `state` and `reason` from its state word. greenfed submits every job not to
    be requeued (`--no-requeue`, `"requeue": false`: greenfed decides what a failure
    leads to), yet slurmrestd v0.0.38 ignores that and an admin's `scontrol requeue`
    overrides it: such a job, pending again or running again from its beginning, is
    `stopped`, so the loop decides what follows (and the back-end cancels it: nothing
    runs twice). One that ended since keeps its end, the requeue said beside a stop."""
    if restarts <= 0 or state in ("succeeded", "failed"):
        return state, reason
    requeued = f"{REQUEUED_BY_CLUSTER} (restarts: {restarts})"
    beside = reason if state == "stopped" else ""  # pending or running: Slurm's own words
    return "stopped", "; ".join(part for part in (requeued, beside) if part)


def held_after_requeue(state: ClusterJobState, restarts: int) -> bool:
    """Whether Slurm still holds a job it requeued (`state` read from its state word):
    pending again or running again, never to be left there (`requeued_job_state`)."""
    return restarts > 0 and state in ("pending", "running")


def launched_exit_code(slurm_reason: str, exit_code: int | None) -> int | None:
    """A job's exit code as read, or None where Slurm's reason says it never launched
    the job (what its exit code field holds then is Slurm's, not the job's)."""
    return None if slurm_reason in _NOT_LAUNCHED else exit_code


def _exit_code(text: str) -> int | None:
    """`ExitCode=1:0` (return code:signal) -> 1; a signal -> 128 + signal, as a shell."""
    code, _, signal = text.partition(":")
    if not _is_number(code):
        return None
    if _is_number(signal) and int(signal):
        return 128 + int(signal)
    return int(code)


def _time(text: str) -> float | None:
    """Unix seconds (SLURM_TIME_FORMAT=%s); Unknown, None and 0 say not yet."""
    return float(text) if _is_number(text) and int(text) > 0 else None


def _is_number(text: str) -> bool:
    """ASCII digits only (`str.isdigit` takes `²`, which `int` refuses)."""
    return text.isascii() and text.isdigit()


def owner_uid(fields: Mapping[str, str]) -> int | None:
    """The uid of a job's owner (`UserId=greenfed(1001)`); None where the record says
    none that can be read."""
    match = _USER_ID.fullmatch(fields.get("UserId", ""))
    return int(match["uid"]) if match is not None else None


def job_of(
    fields: Mapping[str, str] | None, *, account_uid: int | None = None
) -> ClusterJob | None:
    """One of greenfed's jobs: named `gf-<job id>-<attempt>`, a plain number as its id,
    no comment but greenfed's for that attempt and, given `account_uid`, owned by the
    account greenfed submits as (None: anyone else's, or a record that cannot be read).
    `scontrol` lists every user's jobs, and any of them can name a job and comment it as
    greenfed does."""
    if fields is None:
        return None
    if account_uid is not None and owner_uid(fields) != account_uid:
        return None
    identity = job_identity(fields.get("JobName", ""))
    backend_id = fields.get("JobId", "")
    if identity is None or not is_slurm_job_id(backend_id):
        return None
    if not comment_matches(fields.get("Comment", ""), identity):
        return None
    slurm_reason = fields.get("Reason", "")
    exit_code = launched_exit_code(slurm_reason, _exit_code(fields.get("ExitCode", "")))
    state, reason = job_state(fields.get("JobState", ""), slurm_reason, exit_code)
    return cluster_job(
        backend_id,
        identity,
        state,
        reason,
        exit_code,
        slurm_reason=slurm_reason,
        nodes=fields.get("NodeList", ""),
        submitted_at=_time(fields.get("SubmitTime", "")),
        started_at=_time(fields.get("StartTime", "")),
        ended_at=_time(fields.get("EndTime", "")),
        output_path=fields.get("StdOut", "") or None,
    )


def cluster_job(
    backend_id: str,
    identity: tuple[str, int],
    state: ClusterJobState,
    reason: str,
    exit_code: int | None,
    *,
    slurm_reason: str,
    nodes: str,
    submitted_at: float | None,
    started_at: float | None,
    ended_at: float | None,
    output_path: str | None,
) -> ClusterJob:
    """A job as Slurm reported it (its commands or slurmrestd): an exit code only once it
    ended, a start only once it left the queue, an end only once it ended (Slurm gives
    expected times before), its node list expanded (`(null)`, `None assigned`: none);
    pending, whether it waits its turn (`queue_wait`, from Slurm's own reason)."""
    ended = state in ("succeeded", "failed", "stopped")
    listed = nodes and nodes not in ("(null)", "None assigned")
    return ClusterJob(
        backend_id=backend_id,
        job_id=identity[0],
        attempt=identity[1],
        state=state,
        reason=reason,
        queue_wait=queue_wait(slurm_reason) if state == "pending" else None,
        exit_code=exit_code if state in ("succeeded", "failed") else None,
        nodes=tuple(expand_hostlist(nodes)) if listed else (),
        submitted_at=submitted_at,
        started_at=started_at if state != "pending" else None,
        finished_at=ended_at if ended else None,
        output_path=output_path,
    )


def jobs_of(text: str, *, account_uid: int | None = None) -> tuple[ClusterJob, ...]:
    """greenfed's jobs in `scontrol -o show job` output (anyone else's are left out:
    with `account_uid`, those of any other account too; the back-end always gives it)."""
    found = (
        readable(lambda line: job_of(key_values(line), account_uid=account_uid), line, "job")
        for line in slurm_lines(text)
    )
    return tuple(job for job in found if job is not None)


SACCT_FIELDS: Final = (
    "JobID",
    "JobName",
    "State",
    "ExitCode",
    "Submit",
    "Start",
    "End",
    "NodeList",
    "ConsumedEnergyRaw",
    # Last: a comment holding a `|` makes a row of too many fields, left out.
    "Comment",
)


def accounted_jobs(text: str) -> tuple[ClusterJob, ...]:
    """greenfed's jobs in `sacct -X -P -n -o <SACCT_FIELDS>` output (the back-end asks
    sacct for the account's own, `--user=<uid>`)."""
    found = []
    for line in slurm_lines(text):
        values = line.split("|")
        if len(values) != len(SACCT_FIELDS):
            continue
        row = dict(zip(SACCT_FIELDS, values, strict=True))
        job = readable(_accounted_job, row, "accounted job")
        if job is not None:
            found.append(dataclasses.replace(job, consumed_energy_j=energy_j(row)))
    return tuple(found)


def _accounted_job(row: Mapping[str, str]) -> ClusterJob | None:
    return job_of(
        {
            "JobId": row["JobID"],
            "JobName": row["JobName"],
            "JobState": row["State"],
            "ExitCode": row["ExitCode"],
            "SubmitTime": row["Submit"],
            "StartTime": row["Start"],
            "EndTime": row["End"],
            "NodeList": row["NodeList"],
            "Comment": row["Comment"],
        }
    )


def energy_j(row: Mapping[str, str]) -> float | None:
    """A `sacct` row's `ConsumedEnergyRaw` (J); None where the cluster measured none (an
    empty field, or 0 on a cluster whose energy plugin is `acct_gather_energy/none`)."""
    text = row.get("ConsumedEnergyRaw", "")
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value > 0 and value < 1e18 else None  # NO_VAL64 reads as ~1.8e19


def energy_of_live_jobs(text: str) -> dict[str, float]:
    """`sacct -X -P -n -o JobID,ConsumedEnergyRaw -j ...` -> {job id: J so far}."""
    found: dict[str, float] = {}
    for line in slurm_lines(text):
        backend_id, _, raw = line.partition("|")
        joules = energy_j({"ConsumedEnergyRaw": raw})
        if is_slurm_job_id(backend_id) and joules is not None:
            found[backend_id] = joules
    return found


def gathers_energy(config_text: str) -> bool:
    """Whether `scontrol show config` names an energy plugin (not `none`)."""
    for line in config_text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AcctGatherEnergyType":
            plugin = value.strip()
            return bool(plugin) and plugin not in ("(null)", "acct_gather_energy/none")
    return False


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host list syntax (`gpu[01-03,07],login1`) as names; none (logged once)
    for what is no host list (`n[a-b]`, a range backwards) or expands to more than
    MAX_HOSTLIST_NAMES names: the job is still read, without its machines."""
    try:
        return _expand_hostlist(text)
    except UnreadableRecord as error:
        _unreadable_once("host list", str(error))
        return []


def _expand_hostlist(text: str) -> list[str]:
    names: list[str] = []
    for part in _split_outside_brackets(text):
        match = re.fullmatch(r"(?P<prefix>[^\[]*)\[(?P<ranges>[^\]]+)\](?P<suffix>.*)", part)
        if match is None:
            names.append(part)
        else:
            for item in match["ranges"].split(","):
                low, dash, high = item.partition("-")
                if not dash:
                    names.append(f"{match['prefix']}{low}{match['suffix']}")
                    continue
                if not _is_range_number(low) or not _is_range_number(high):
                    raise UnreadableRecord(f"host list {text[:200]!r}: range {item[:50]!r}")
                first, last = int(low), int(high)
                if last < first or len(names) + last - first + 1 > MAX_HOSTLIST_NAMES:
                    raise UnreadableRecord(
                        f"host list {text[:200]!r}: range {item[:50]!r} backwards or over "
                        f"{MAX_HOSTLIST_NAMES} names"
                    )
                for number in range(first, last + 1):
                    names.append(f"{match['prefix']}{number:0{len(low)}d}{match['suffix']}")
        if len(names) > MAX_HOSTLIST_NAMES:
            raise UnreadableRecord(f"host list {text[:200]!r}: over {MAX_HOSTLIST_NAMES} names")
    return names


def _is_range_number(text: str) -> bool:
    return _is_number(text) and len(text) <= _MAX_RANGE_DIGITS


def _split_outside_brackets(text: str) -> Iterable[str]:
    depth = 0
    current = ""
    for char in text:
        if char == "," and depth == 0:
            if current:
                yield current
            current = ""
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        current += char
    if current:
        yield current
