"""The agent's inference runtime: desired replicas -> served models -> reported states.

Per deployment on this node:

    starting -> (download, verify, load on the assigned provider, warm up) -> ready
                                                                    \\-> failed (why)

- A changed model (another sha256) is loaded and warmed while the old one keeps
  serving, then swapped in between two batches: no request fails during an update.
- A deployment withdrawn from `desired` stops taking requests and is dropped once
  the accepted ones are answered.
- Everything a deployment does runs in its own task; a corrupt model, a checksum
  mismatch or a provider that will not load fails that deployment with the reason
  and never disturbs the others.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from edge.inference.batching import Batcher
from edge.inference.model_fetch import ModelCache, ModelFetchError
from edge.inference.replicas import check_assignment
from edge.inference.session import LoadedModel, ModelLoadError
from edge.inference.stats import ServingStats
from shared.lean_logs import get_logger
from shared.messages import (
    Accelerator,
    DeploymentSample,
    DesiredDeployment,
    ReplicaState,
    ReportedDeployment,
)


@dataclass(slots=True)
class Serving:
    """One deployment on this node (usually one replica)."""

    desired: DesiredDeployment
    replicas: tuple[int, ...]
    stats: ServingStats
    state: ReplicaState = "starting"
    reason: str = ""
    provider: str | None = None
    batcher: Batcher | None = None
    loading: asyncio.Task[None] | None = None
    runner: asyncio.Task[None] | None = None
    loaded_sha256: str | None = None


class InferenceRuntime:
    def __init__(
        self,
        inventory: Sequence[Accelerator],
        cache: ModelCache,
        *,
        on_change: Callable[[], None],
        endpoint_base: Callable[[], str | None],
        max_queue: int = 256,
        latency_scale: float = 1.0,
        intra_op_threads: int = 0,
    ) -> None:
        self._inventory = tuple(inventory)
        self._cache = cache
        self._on_change = on_change
        self._endpoint_base = endpoint_base
        self._max_queue = max_queue
        self._latency_scale = latency_scale
        self._threads = intra_op_threads
        self._serving: dict[str, Serving] = {}
        self._draining: set[asyncio.Task[None]] = set()
        self._tasks: asyncio.TaskGroup | None = None
        self._http: aiohttp.ClientSession | None = None
        self._log = get_logger("greenfed.inference")
        self.swaps = 0

    def bind(self, tasks: asyncio.TaskGroup) -> None:
        self._tasks = tasks

    @property
    def active(self) -> bool:
        return bool(self._serving)

    def serving(self, deployment_id: str) -> Serving | None:
        return self._serving.get(deployment_id)

    def stats(self) -> list[ServingStats]:
        return [serving.stats for _, serving in sorted(self._serving.items())]

    def samples(self) -> tuple[DeploymentSample, ...]:
        return tuple(
            serving.stats.sample(self._latency_scale)
            for _, serving in sorted(self._serving.items())
        )

    # ---- desired -> running -------------------------------------------------------------

    def apply(self, desired: Sequence[DesiredDeployment]) -> None:
        """Start, update or withdraw deployments; returns at once (work happens in tasks)."""
        assert self._tasks is not None, "bind() the runtime to a task group first"
        grouped: dict[str, list[DesiredDeployment]] = {}
        for replica in desired:
            grouped.setdefault(replica.deployment_id, []).append(replica)
        for deployment_id in set(self._serving) - set(grouped):
            self._withdraw(self._serving.pop(deployment_id))
        for deployment_id, replicas in grouped.items():
            first = min(replicas, key=lambda r: r.replica)
            indices = tuple(sorted(r.replica for r in replicas))
            current = self._serving.get(deployment_id)
            if current is None:
                current = Serving(first, indices, ServingStats(deployment_id))
                self._serving[deployment_id] = current
                self._start(current, first)
                continue
            current.replicas = indices
            if first.model_sha256 != current.desired.model_sha256 or (
                current.state == "failed" and first != current.desired
            ):
                current.desired = first
                self._start(current, first)  # load beside the old model, then swap
            else:
                current.desired = first
                if current.batcher is not None:
                    current.batcher.configure(
                        max_batch_size=first.max_batch_size,
                        max_queue_delay_s=first.max_queue_delay_ms / 1000.0,
                    )
        self._on_change()

    def _start(self, serving: Serving, desired: DesiredDeployment) -> None:
        assert self._tasks is not None
        if serving.loading is not None:
            serving.loading.cancel()
        serving.loading = self._tasks.create_task(
            self._load(serving, desired), name=f"load-{desired.deployment_id}"
        )

    def _withdraw(self, serving: Serving) -> None:
        assert self._tasks is not None
        if serving.loading is not None:
            serving.loading.cancel()
        task = self._tasks.create_task(self._drain(serving))
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)

    async def _drain(self, serving: Serving) -> None:
        if serving.batcher is not None:
            await serving.batcher.drain()
        if serving.runner is not None:
            serving.runner.cancel()
        self._log.info("deployment removed", deployment_id=serving.desired.deployment_id)

    async def _load(self, serving: Serving, desired: DesiredDeployment) -> None:
        deployment_id = desired.deployment_id
        try:
            model = await self._prepare(desired)
        except asyncio.CancelledError:
            raise
        except (ModelFetchError, ModelLoadError, ValueError) as error:
            self._fail(serving, desired, str(error))
            return
        except Exception as error:  # a bug or a driver crash: this deployment only
            self._log.exception("deployment failed to load", deployment_id=deployment_id)
            self._fail(serving, desired, f"{type(error).__name__}: {error}")
            return
        if self._serving.get(deployment_id) is not serving:
            return  # withdrawn while loading
        if serving.batcher is None:
            serving.batcher = Batcher(
                model,
                serving.stats,
                max_batch_size=desired.max_batch_size,
                max_queue_delay_s=desired.max_queue_delay_ms / 1000.0,
                max_queue=self._max_queue,
            )
            assert self._tasks is not None
            serving.runner = self._tasks.create_task(
                serving.batcher.run(), name=f"batcher-{deployment_id}"
            )
        else:
            serving.batcher.swap(model)
            serving.batcher.configure(
                max_batch_size=desired.max_batch_size,
                max_queue_delay_s=desired.max_queue_delay_ms / 1000.0,
            )
            self.swaps += 1
        serving.loaded_sha256 = model.sha256
        serving.state, serving.provider, serving.reason = "ready", model.provider, model.fallback
        self._log.info(
            "deployment ready",
            deployment_id=deployment_id,
            provider=model.provider,
            sha256=model.sha256[:12],
        )
        self._on_change()

    def _fail(self, serving: Serving, desired: DesiredDeployment, reason: str) -> None:
        self._log.warning("deployment failed", deployment_id=desired.deployment_id, reason=reason)
        if serving.batcher is not None and serving.loaded_sha256 is not None:
            # An update that failed: the old model keeps serving, the reason is reported.
            serving.reason = f"update to {desired.model_sha256 or '?'} failed: {reason}"
        else:
            serving.state, serving.reason = "failed", reason
        self._on_change()

    async def _prepare(self, desired: DesiredDeployment) -> LoadedModel:
        provider, refusal = check_assignment(desired, self._inventory)
        if refusal is not None:
            raise ValueError(refusal)
        if desired.model_url is None or desired.model_sha256 is None:
            raise ModelFetchError(
                f"model {desired.model_id or '(none)'} is not in the control plane's registry"
            )
        if self._http is None:
            self._http = aiohttp.ClientSession()
        pinned = [s.loaded_sha256 for s in self._serving.values() if s.loaded_sha256]
        serving = self._serving.get(desired.deployment_id)

        def retrying(why: str) -> None:
            if serving is not None and serving.state == "starting":
                serving.reason = why
                self._on_change()

        path = await self._cache.fetch(
            self._http,
            desired.model_url,
            desired.model_sha256,
            [p for p in pinned if p],
            on_retry=retrying,
            size_bytes=desired.model_size_bytes,
        )
        device_index = next(
            (
                a.index
                for a in self._inventory
                if desired.accelerator_ids and a.id == desired.accelerator_ids[0]
            ),
            None,
        )

        threads = self._threads
        if not threads and desired.accelerator_kind == "cpu":
            threads = desired.accelerators  # the cores the scheduler set aside for it

        def load() -> LoadedModel:
            model = LoadedModel(
                path,
                desired.model_sha256 or "",
                provider,
                device_index=device_index,
                intra_op_threads=threads,
                accelerator_kind=desired.accelerator_kind,
            )
            model.warm_up()
            return model

        return await asyncio.to_thread(load)

    # ---- reported ---------------------------------------------------------------------

    def reported(self) -> tuple[ReportedDeployment, ...]:
        base = self._endpoint_base()
        states: list[ReportedDeployment] = []
        for deployment_id, serving in sorted(self._serving.items()):
            endpoint = (
                f"{base}/v1/infer/{deployment_id}" if base and serving.state == "ready" else None
            )
            states.extend(
                ReportedDeployment(
                    deployment_id=deployment_id,
                    replica=replica,
                    state=serving.state,
                    provider=serving.provider,
                    reason=serving.reason,
                    endpoint=endpoint,
                    model_sha256=serving.loaded_sha256,
                )
                for replica in serving.replicas
            )
        return tuple(states)

    async def close(self) -> None:
        for serving in self._serving.values():
            for task in (serving.loading, serving.runner):
                if task is not None:
                    task.cancel()
        for task in list(self._draining):
            task.cancel()
        if self._http is not None:
            with contextlib.suppress(Exception):
                await self._http.close()
            self._http = None
