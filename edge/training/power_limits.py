"""GPU power limits held for training workers: carbon-aware power capping on the node.

The cloud may ask that a worker's GPUs run under a lower power limit for its run
(`DesiredTraining.power_limit_w`). Each run holds its GPUs from before it starts
until it ends (succeeded, failed, stopped, withdrawn, lost); every GPU is held to
the lowest limit asked by the runs on it, and a GPU that no capped run uses any more
gets its default back (a MIG instance's parent too, capped by an agent of an older
version: NVML limits whole GPUs). A run that asks no limit does not lift another's.
The hardware is behind the GpuPowerControl seam (edge/probes.py: NVML, or a
simulated node), called in a thread.

No limit is ever set for a run on MIG instances: their parent's limit would hold
every instance on it, other tenants' work among them. The scheduler never asks one
(cloud/green/power_capping.py), but a control plane of an older version may: the
run goes on at the default, reports nothing capped and says why, and the agent logs
it once.

A limit that cannot be set (no permission, no NVML, not supported) never stops a
worker: it runs at the default, its report says why (`power_limit_note`), and the
agent logs each distinct reason once. A worker reports `power_limit_w`, the limit
its GPUs are held to (where they differ, the highest: none of them draws more), None
at the default.

A worker outlives its agent (edge/training/process.py) and keeps its limit; the
agent that takes it back sets the limit again. Which GPUs greenfed holds capped is
written to `state_path` before a limit is set, so a restarted agent also gives the
default back to a GPU whose worker ended, or was withdrawn, while no agent ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from edge.atomic_files import write_atomically
from edge.probes import GpuPowerControl, PowerLimitUnavailable, physical_gpu_id
from edge.training.runs import RunStatus
from shared.lean_logs import get_logger
from shared.messages import Accelerator, DesiredTraining

NOT_APPLIED = "power limit not applied: {why}"
NO_POWER_CONTROL = "this node cannot set GPU power limits"
NO_GPU = "the worker has no GPU"
ON_MIG_SLICES = (
    "the worker runs on MIG slices, which share their GPU's power limit with the "
    "other work on that GPU"
)

log = get_logger("greenfed.training.power")


class _NoPowerControl:
    """A node without a way to set power limits (no NVIDIA probe configured)."""

    def set_power_limit_w(self, gpu: Accelerator, limit_w: float) -> float:
        raise PowerLimitUnavailable(NO_POWER_CONTROL)

    def restore_default_power_limit(self, gpu: Accelerator) -> None:
        raise PowerLimitUnavailable(NO_POWER_CONTROL)

    def close(self) -> None:
        return None


@dataclass(frozen=True, eq=False, slots=True)  # one per run, known by identity
class _Hold:
    asked_w: float | None  # None: the run asks no limit, but reports what its GPUs get
    gpu_ids: tuple[str, ...]  # physical GPUs
    status: RunStatus
    refused: str = ""  # why the asked limit is never applied ("": it is, where it can be)


class PowerLimits:
    def __init__(
        self,
        control: GpuPowerControl | None,
        inventory: Sequence[Accelerator],
        *,
        state_path: Path | None = None,
    ) -> None:
        """`control` None: no limit can be set here, and each asked one says so;
        `state_path`: where the GPUs held capped are kept (None: in memory only)."""
        self._control: GpuPowerControl = control or _NoPowerControl()
        self._physical_by_accelerator = {
            a.id: physical_gpu_id(a) for a in inventory if a.kind == "gpu"
        }
        self._mig_instance_ids = frozenset(
            a.id for a in inventory if a.kind == "gpu" and a.parent_id is not None
        )
        # Any one accelerator of each physical GPU: what the control addresses it by.
        self._gpus: dict[str, Accelerator] = {}
        for accelerator in inventory:
            if accelerator.kind == "gpu":
                self._gpus.setdefault(physical_gpu_id(accelerator), accelerator)
        self._holds: dict[int, _Hold] = {}  # by id() of the run's status
        # Per physical GPU, touched only under `_lock` (in the settling thread):
        self._attempted_w: dict[str, float] = {}  # the limit last asked of the control
        self._applied_w: dict[str, float] = {}  # the limit it holds now; absent: default
        self._why_not: dict[str, str] = {}  # why the attempted limit is not applied
        self._state_path = state_path
        self._capped: set[str] = set()  # set by greenfed and not yet restored
        self._saved_capped: set[str] = set()  # as the file says
        self._loaded = False  # `_capped` read from the file (at the first settle)
        self._logged: set[str] = set()  # in the settling thread
        self._mig_refusal_logged = False  # on the event loop
        self._lock = asyncio.Lock()

    def hold(self, spec: DesiredTraining, status: RunStatus) -> None:
        """Hold the GPUs of `status`'s run to `spec.power_limit_w` until `release`;
        the hardware follows at the next `settle`."""
        gpu_ids = tuple(
            dict.fromkeys(
                self._physical_by_accelerator[accelerator_id]
                for accelerator_id in spec.accelerator_ids
                if accelerator_id in self._physical_by_accelerator
            )
        )
        if spec.power_limit_w is not None and self._mig_instance_ids.intersection(
            spec.accelerator_ids
        ):
            self._refuse_on_mig_slices(spec)
            # Held without a limit: its report says why none is applied.
            self._holds[id(status)] = _Hold(None, gpu_ids, status, refused=ON_MIG_SLICES)
        elif gpu_ids or spec.power_limit_w is not None:
            self._holds[id(status)] = _Hold(spec.power_limit_w, gpu_ids, status)

    def _refuse_on_mig_slices(self, spec: DesiredTraining) -> None:
        if self._mig_refusal_logged:
            return
        self._mig_refusal_logged = True
        log.warning(
            "GPU power limit not applied",
            job_id=spec.job_id,
            accelerators=sorted(self._mig_instance_ids.intersection(spec.accelerator_ids)),
            limit_w=spec.power_limit_w,
            why=ON_MIG_SLICES,
        )

    def release(self, status: RunStatus) -> None:
        """The run of `status` has ended (idempotent); its report keeps the limit it ran
        under."""
        self._holds.pop(id(status), None)

    async def settle(self) -> bool:
        """Bring every GPU to what the holds ask, and tell each held run what it got.
        Whether any run's report changed."""
        async with self._lock:
            if not self._loaded:
                self._capped = await asyncio.to_thread(self._load_capped)
                self._saved_capped = set(self._capped)
                self._loaded = True
            targets = self._targets()
            changes: dict[str, float | None] = {
                gpu_id: limit_w
                for gpu_id, limit_w in targets.items()
                if self._attempted_w.get(gpu_id) != limit_w
            }
            changes.update({gpu_id: None for gpu_id in self._capped if gpu_id not in targets})
            for gpu_id in set(self._attempted_w) - set(targets) - self._capped:
                # A limit that was never applied: nothing to give back.
                del self._attempted_w[gpu_id]
                self._why_not.pop(gpu_id, None)
            if changes:
                await asyncio.to_thread(self._bring_gpus_to, changes)
            changed = False
            for hold in self._holds.values():
                changed |= hold.status.set_power_limit(*self._reported(hold))
            return changed

    def _targets(self) -> dict[str, float]:
        """Physical GPU id -> the lowest limit asked by a run on it."""
        targets: dict[str, float] = {}
        for hold in self._holds.values():
            if hold.asked_w is None:
                continue
            for gpu_id in hold.gpu_ids:
                targets[gpu_id] = min(targets.get(gpu_id, hold.asked_w), hold.asked_w)
        return targets

    def _reported(self, hold: _Hold) -> tuple[float | None, str]:
        if hold.refused:
            return None, NOT_APPLIED.format(why=hold.refused)
        held_w = [self._applied_w[gpu_id] for gpu_id in hold.gpu_ids if gpu_id in self._applied_w]
        limit_w = max(held_w) if held_w else None
        if hold.asked_w is None:
            return limit_w, ""
        if not hold.gpu_ids:
            return limit_w, NOT_APPLIED.format(why=NO_GPU)
        whys = dict.fromkeys(self._why_not[g] for g in hold.gpu_ids if g in self._why_not)
        return limit_w, "; ".join(NOT_APPLIED.format(why=why) for why in whys)

    # -- in the settling thread ------------------------------------------------------

    def _bring_gpus_to(self, changes: dict[str, float | None]) -> None:
        """Set or restore each changed GPU (limit None: its default)."""
        # Written down before any limit is set: a crash in between leaves a GPU marked
        # capped that is not (restoring it costs nothing), never the reverse.
        self._save_capped(self._capped | {g for g, w in changes.items() if w is not None})
        for gpu_id, limit_w in changes.items():
            if limit_w is None:
                self._restore(gpu_id)
            else:
                self._set(gpu_id, limit_w)
        self._save_capped(self._capped)

    def _set(self, gpu_id: str, limit_w: float) -> None:
        self._attempted_w[gpu_id] = limit_w
        try:
            self._applied_w[gpu_id] = self._control.set_power_limit_w(self._gpus[gpu_id], limit_w)
        except Exception as error:  # whatever goes wrong, the worker runs at the default
            why = _why(error)
            self._why_not[gpu_id] = why
            if gpu_id not in self._applied_w:
                self._capped.discard(gpu_id)  # it never left its default
            self._log_once("GPU power limit not applied", why, gpu_id, limit_w, error)
        else:
            self._why_not.pop(gpu_id, None)

    def _restore(self, gpu_id: str) -> None:
        try:
            self._control.restore_default_power_limit(self._gpus[gpu_id])
        except Exception as error:
            # It stays marked capped: the next settle (a run starting or ending) retries.
            self._log_once("GPU power limit not restored", _why(error), gpu_id, None, error)
            return
        self._capped.discard(gpu_id)
        self._attempted_w.pop(gpu_id, None)
        self._applied_w.pop(gpu_id, None)
        self._why_not.pop(gpu_id, None)

    def _log_once(
        self, event: str, why: str, gpu_id: str, limit_w: float | None, error: Exception
    ) -> None:
        if why in self._logged:
            return
        self._logged.add(why)
        if isinstance(error, PowerLimitUnavailable):
            log.warning(event, accelerator=gpu_id, limit_w=limit_w, why=why)
        else:  # a bug, or a driver answering what nobody expected: the traceback helps
            log.warning(event, accelerator=gpu_id, limit_w=limit_w, why=why, exc_info=error)

    # -- the GPUs held capped, on disk -----------------------------------------------

    def _load_capped(self) -> set[str]:
        if self._state_path is None:
            return set()
        try:
            listed = msgspec.json.decode(self._state_path.read_bytes(), type=list[str])
        except FileNotFoundError:
            return set()
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as error:
            log.warning(
                "GPU power limits file unreadable", path=str(self._state_path), error=str(error)
            )
            return set()
        gone = sorted(set(listed) - set(self._gpus))
        if gone:
            log.info("capped GPUs no longer present", accelerators=gone)
        return set(listed) & set(self._gpus)

    def _save_capped(self, capped: set[str]) -> None:
        self._capped = capped
        path = self._state_path
        if path is None or capped == self._saved_capped:
            return
        try:
            write_atomically(path, msgspec.json.encode(sorted(capped)))
            self._saved_capped = set(capped)
        except OSError as error:
            # A full disk costs only the restart case: the limits themselves are set.
            log.warning("GPU power limits file not written", path=str(path), error=str(error))


def _why(error: Exception) -> str:
    if isinstance(error, PowerLimitUnavailable):
        return error.why
    return f"unexpected error ({error!r})"
