"""What slurmrestd's OpenAPI plugins say, in the back-end's terms: a job description to
submit, and nodes and jobs read back, for each plugin version greenfed speaks.

slurmrestd serves its API in versions (`openapi/v0.0.38`, `v0.0.41`, ...), a few per
Slurm release, each retired after some releases. greenfed speaks two shapes:

- **v0.0.38** (Slurm 22.05 and 23.02): a job description of flat fields (`environment`
  an object, `gres`, `time_limit` in minutes, `memory_per_node` in MiB); states and
  times as plain values; a job's `exit_code` a raw wait status. It has **no field
  naming a job's machines** (`required_nodes` is a "Disabled key", `#SBATCH` lines in
  the script are ignored): Slurm picks them within the partition (`pins_machines`
  False; docs/backends.md). It ignores `"requeue": false` too (every job it submits
  may be requeued): a job with a `restart_cnt` is read as `stopped`, requeued by the
  cluster (records.py `requeued_job_state`), and cancelled (rest_backend.py).
- **v0.0.41 to v0.0.45** (Slurm 24.05 to 26.05: the generated data parser, one shape):
  the script inside the job, `required_nodes`, `tres_per_node`, `environment` a list of
  `NAME=value`, numbers as `{"set", "infinite", "number"}`, states as lists, exit codes
  as `{"status", "return_code", "signal"}`.

v0.0.39 and v0.0.40 (Slurm 23.02 and 23.11, both past their end of support) are not
spoken: a slurmrestd offering only those is refused at registration's first contact,
naming what it offers (the commands transport, cloud/clusters/slurm/commands.py,
reaches any release).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

from cloud.clusters.backend import ClusterJob, ClusterNode
from cloud.clusters.slurm.records import (
    allocated_gpus,
    cluster_job,
    comment_matches,
    gres_counts,
    held_after_requeue,
    job_identity,
    job_state,
    launched_exit_code,
    node_unavailable,
    requeued_job_state,
)
from cloud.clusters.slurm.script import SlurmJobShape

# The versions greenfed speaks, best first.
SPOKEN_VERSIONS: Final = ("v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42", "v0.0.41", "v0.0.38")
# What the job's batch script starts with (the environment greenfed sets is the
# script's own: nothing of slurmrestd's reaches the job, as `sbatch --export=NONE`).
JOB_ENVIRONMENT: Final = {"PATH": "/usr/local/bin:/usr/bin:/bin"}

Json = Mapping[str, Any]


class RestDialect:
    """One OpenAPI plugin version's shapes. Subclasses say how each differs."""

    # Whether a job description can name the machines greenfed chose.
    pins_machines: bool = True

    def __init__(self, version: str) -> None:
        self.version = version
        self.jobs_path = f"/slurm/{version}/jobs"
        self.nodes_path = f"/slurm/{version}/nodes"
        self.partitions_path = f"/slurm/{version}/partitions"
        self.submit_path = f"/slurm/{version}/job/submit"
        self.accounting_path = f"/slurmdb/{version}/jobs"

    def job_path(self, backend_id: str) -> str:
        return f"/slurm/{self.version}/job/{backend_id}"

    def submit_body(self, shape: SlurmJobShape, script: str) -> dict[str, Any]:
        raise NotImplementedError

    def accounting_since(self, window_s: float, now: float) -> str:
        """The accounting query's `start_time` for jobs of the last `window_s`."""
        return str(int(now - window_s))

    def node(self, raw: Json) -> ClusterNode | None:
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            return None
        configured = gres_counts(_text(raw.get("gres")))
        # What is allocated, by type where slurmd says (`gpu:a100:2(IDX:0-1)`), else
        # from the untyped TRES count.
        allocated = gres_counts(_text(raw.get("gres_used"))) or allocated_gpus(
            _text(raw.get("tres_used")), configured
        )
        return ClusterNode(
            name=name,
            partitions=tuple(p for p in _strings(raw.get("partitions")) if p),
            cpus=_int(raw.get("cpus")),
            memory_bytes=_int(raw.get("real_memory")) * (1 << 20),
            accelerators=configured,
            allocated=allocated,
            unavailable=node_unavailable(self.node_state(raw), _text(raw.get("reason"))),
        )

    def node_state(self, raw: Json) -> str:
        """The node's state as `scontrol` writes it (`IDLE+DRAIN`)."""
        raise NotImplementedError

    def partition_state(self, raw: Json) -> tuple[str, str] | None:
        """(name, state as `scontrol` writes it: `UP`, `DOWN`, `DRAIN`, `INACTIVE`) of a
        partition of `GET /slurm/<version>/partitions`; None: no name."""
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            return None
        return name, self.partition_state_text(raw).upper()

    def partition_state_text(self, raw: Json) -> str:
        raise NotImplementedError

    def job(self, raw: Json) -> ClusterJob | None:
        """A live job (`GET /slurm/<version>/jobs`) if it is greenfed's."""
        found = _identity(raw)
        if found is None:
            return None
        backend_id, identity = found
        slurm_reason = _text(raw.get("state_reason"))
        exit_code = launched_exit_code(slurm_reason, self.exit_code(raw.get("exit_code")))
        listed_state, listed_reason = job_state(
            self.state_text(raw.get("job_state")), slurm_reason, exit_code
        )
        restarts = self.restarts(raw)
        state, reason = requeued_job_state(listed_state, listed_reason, restarts)
        # Held again after a requeue, the job has not ended: its times are Slurm's
        # expectations (a pending job's start, a running one's end), never reported.
        held = held_after_requeue(listed_state, restarts)
        output = _expanded(_text(raw.get("standard_output")), backend_id, _text(raw.get("name")))
        return cluster_job(
            backend_id, identity, state, reason, exit_code,
            slurm_reason=slurm_reason,
            nodes=_text(raw.get("nodes")),
            submitted_at=self.time(raw.get("submit_time")),
            started_at=None if listed_state == "pending" else self.time(raw.get("start_time")),
            ended_at=None if held else self.time(raw.get("end_time")),
            output_path=output or None,
        )  # fmt: skip

    def restarts(self, raw: Json) -> int:
        """How often Slurm requeued a live job (`restart_cnt`, both shapes)."""
        return _int(raw.get("restart_cnt"))

    def held_after_requeue(self, raw: Json) -> bool:
        """Whether Slurm requeued a live job greenfed submitted not to be, and still
        holds it (pending or running again): the back-end cancels it, as Slurm would
        have ended it had it kept to `"requeue": false` (v0.0.38 does not)."""
        listed_state, _ = job_state(self.state_text(raw.get("job_state")), "", None)
        return held_after_requeue(listed_state, self.restarts(raw))

    def accounted_job(self, raw: Json) -> ClusterJob | None:
        """A job in the cluster's accounting (`GET /slurmdb/<version>/jobs`)."""
        found = _identity(raw)
        if found is None:
            return None
        state_of, times = _mapping(raw.get("state")), _mapping(raw.get("time"))
        slurm_reason = _text(state_of.get("reason"))
        exit_code = launched_exit_code(slurm_reason, self.accounted_exit_code(raw.get("exit_code")))
        state, reason = job_state(self.state_text(state_of.get("current")), slurm_reason, exit_code)
        return cluster_job(
            *found, state, reason, exit_code,
            slurm_reason=slurm_reason,
            nodes=_text(raw.get("nodes")),
            submitted_at=self.time(times.get("submission")),
            started_at=self.time(times.get("start")),
            ended_at=self.time(times.get("end")),
            output_path=None,
        )  # fmt: skip

    def state_text(self, value: Any) -> str:
        if isinstance(value, list):
            return "+".join(str(item) for item in value)
        return _text(value)

    def time(self, value: Any) -> float | None:
        number = _number(value)
        return float(number) if number else None

    def exit_code(self, value: Any) -> int | None:
        raise NotImplementedError

    def accounted_exit_code(self, value: Any) -> int | None:
        return self.exit_code(value)


class V0038(RestDialect):
    pins_machines = False

    def submit_body(self, shape: SlurmJobShape, script: str) -> dict[str, Any]:
        job: dict[str, Any] = {
            "name": shape.name,
            "comment": shape.comment,
            "partition": shape.partition,
            "nodes": str(shape.nodes),
            "tasks_per_node": shape.tasks_per_node,
            "standard_output": shape.output,
            "standard_error": shape.output,
            "current_working_directory": shape.working_dir,
            "environment": dict(JOB_ENVIRONMENT),
            "requeue": False,
        }
        if shape.gpu_type is not None:
            job["gres"] = f"gpu:{shape.gpu_type}:{shape.gpus_per_node}"
        _common_options(job, shape)
        if shape.memory_per_node_mib is not None:
            job["memory_per_node"] = shape.memory_per_node_mib  # MiB
        if shape.time_limit_min is not None:
            job["time_limit"] = shape.time_limit_min
        return {"script": script, "job": job}

    def node_state(self, raw: Json) -> str:
        return "+".join([_text(raw.get("state")).upper(), *_strings(raw.get("state_flags"))])

    def partition_state_text(self, raw: Json) -> str:
        return _text(raw.get("state"))  # "UP"

    def accounting_since(self, window_s: float, now: float) -> str:
        # Its query parser takes Slurm's own time words, not a Unix time (nor a colon).
        return f"now-{max(1, math.ceil(window_s / 86400))}days"

    def exit_code(self, value: Any) -> int | None:
        """A raw wait status (`768`: exit 3); a signal as a shell says it, 128 + signal."""
        if not isinstance(value, int) or value < 0:
            return None
        signal = value & 0x7F
        return 128 + signal if signal else (value >> 8) & 0xFF

    def accounted_exit_code(self, value: Any) -> int | None:
        # 22.05's accounting says `return_code: 0` for a job that exited 3: only a
        # signal is believed there; the state (FAILED) says the rest.
        if not isinstance(value, Mapping):
            return None
        if value.get("status") == "SIGNALED" and isinstance(value.get("signal"), Mapping):
            number = _number(value["signal"].get("signal_id"))
            return 128 + number if number else None
        return None


class V0041(RestDialect):
    """v0.0.41 to v0.0.45: one generated shape."""

    def submit_body(self, shape: SlurmJobShape, script: str) -> dict[str, Any]:
        job: dict[str, Any] = {
            "script": script,
            "name": shape.name,
            "comment": shape.comment,
            "partition": shape.partition,
            "nodes": str(shape.nodes),
            "required_nodes": list(shape.machines),
            "tasks_per_node": shape.tasks_per_node,
            "standard_output": shape.output,
            "standard_error": shape.output,
            "current_working_directory": shape.working_dir,
            "environment": [f"{name}={value}" for name, value in JOB_ENVIRONMENT.items()],
            "requeue": False,
        }
        if shape.gpu_type is not None:
            job["tres_per_node"] = f"gres/gpu:{shape.gpu_type}:{shape.gpus_per_node}"
        _common_options(job, shape)
        if shape.memory_per_node_mib is not None:
            job["memory_per_node"] = {
                "set": True,
                "infinite": False,
                "number": shape.memory_per_node_mib,  # MiB
            }
        if shape.time_limit_min is not None:
            job["time_limit"] = {"set": True, "infinite": False, "number": shape.time_limit_min}
        return {"job": job}

    def node_state(self, raw: Json) -> str:
        return "+".join(_strings(raw.get("state")))

    def partition_state_text(self, raw: Json) -> str:
        return "+".join(_strings(_mapping(raw.get("partition")).get("state")))  # ["UP"]

    def exit_code(self, value: Any) -> int | None:
        """`{"status": [...], "return_code": N, "signal": {"id": N}}`; a signal as a
        shell says it, 128 + signal."""
        if not isinstance(value, Mapping):
            return None
        signal = value.get("signal")
        if isinstance(signal, Mapping):
            number = _number(signal.get("id"))
            if number:
                return 128 + number
        return_code = _number(value.get("return_code"))
        return return_code if return_code is not None and return_code >= 0 else None


def dialect_of(version: str) -> RestDialect:
    if version == "v0.0.38":
        return V0038(version)
    if version in SPOKEN_VERSIONS:
        return V0041(version)
    raise ValueError(f"greenfed does not speak slurmrestd's {version}")


def best_version(offered: Sequence[str]) -> str | None:
    """The best version greenfed speaks of those a slurmrestd offers; None: none."""
    return next((version for version in SPOKEN_VERSIONS if version in offered), None)


def _common_options(job: dict[str, Any], shape: SlurmJobShape) -> None:
    if shape.cpus_per_task is not None:
        job["cpus_per_task"] = shape.cpus_per_task
    if shape.account:
        job["account"] = shape.account
    if shape.qos:
        job["qos"] = shape.qos
    if shape.nice is not None:
        job["nice"] = shape.nice


def _identity(raw: Json) -> tuple[str, tuple[str, int]] | None:
    """(Slurm's job id, (greenfed's job id, attempt)) of one of greenfed's jobs: its
    name, an integer id (never a string, which could be anything), and greenfed's
    comment for that attempt where it has one."""
    identity = job_identity(_text(raw.get("name")))
    job_id = raw.get("job_id")
    if identity is None or not isinstance(job_id, int) or isinstance(job_id, bool):
        return None
    if job_id <= 0 or not comment_matches(_comment(raw.get("comment")), identity):
        return None
    return str(job_id), identity


def _comment(value: Any) -> str:
    """A job's comment: a string in the live listing, the `job` one of
    `{"administrator", "job", "system"}` in the accounting."""
    if isinstance(value, Mapping):
        return _text(value.get("job"))
    return _text(value)


def _expanded(pattern: str, backend_id: str, name: str) -> str:
    """An output file name pattern as Slurm fills it (`%j` job id, `%x` name, `%%`)."""
    out = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "%" and index + 1 < len(pattern):
            following = pattern[index + 1]
            out.append({"j": backend_id, "x": name, "%": "%"}.get(following, char + following))
            index += 2
            continue
        out.append(char)
        index += 1
    return "".join(out)


def _mapping(value: Any) -> Json:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any) -> int:
    return _number(value) or 0


def _number(value: Any) -> int | None:
    """A number, plain or as the newer versions' `{"set", "infinite", "number"}`; None:
    unset or infinite."""
    if isinstance(value, Mapping):
        if not value.get("set") or value.get("infinite"):
            return None
        value = value.get("number")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _strings(value: Any) -> list[str]:
    if isinstance(value, list):
        return [item for item in value if isinstance(item, str)]
    if isinstance(value, str) and value:
        return value.split(",")
    return []
