"""The agent's inference runtime: desired replicas -> served models -> reported states.

Per replica on this node (a deployment may have several here: `max_replicas_per_node`,
or a canary rollout's replica with the new model beside one with the current model):

    starting -> (download, verify, load on the assigned provider, warm up) -> ready
                                                                    \\-> failed (why)

- Each replica loads its own model on its own accelerators, with its own batcher: a
  canary's requests never share a run with the current model's, and a replica moved to
  other accelerators (or given another model) is loaded there again.
- A changed model or placement is loaded and warmed while the old one keeps serving,
  then swapped in between two batches: no request fails during an update.
- A replica withdrawn from `desired` stops taking requests and is dropped once the
  accepted ones are answered; its siblings go on serving.
- The node's one endpoint per deployment hands each request to the next ready replica
  in turn (passing over a full queue while another has room): the control plane splits
  a deployment's traffic evenly over its replicas, and a canary's share is its share of
  the replicas.
- Each replica keeps its own serving figures, which also count in its deployment's:
  telemetry sends the deployment's with every replica's beside them, so a canary
  rollout judges a canary apart from the current model's replica on the same node.
- Everything a replica does runs in its own task; a corrupt model, a checksum mismatch
  or a provider that will not load fails that replica with the reason and never
  disturbs the others.
- A model that cannot be downloaded for now (the control plane unreachable or busy
  until the fetch's attempts ran out) does not fail its replica: it stays `starting`
  (an update: the old model keeps serving), says why, and is fetched again after a
  capped, jittered backoff, or at once when a desired document is applied (the same
  generation too: the retained one an agent gets on reconnecting). A node restored
  offline serves once the control plane is back, and never reports a replica failed
  that the control plane would fail its deployment for.
- A withdrawn replica's deployment answers `503` (being removed) until the replica's
  accepted requests are answered, not `404` at once.
- A replica that failed, or whose update failed (its old model serving on), is loaded
  again once a desired document differs from the one it failed with (a fresh model URL,
  say); the same document again is not retried: a refusal, a wrong file or a provider
  that will not load is final for it.
- The model cache never evicts the model a replica serves or is loading (pinned for as
  long), whichever download evicts and whenever it began.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from edge.inference.batching import Batcher
from edge.inference.model_fetch import ModelCache, ModelFetchError, ModelUnreachable
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

# Between fetches of a model that could not be downloaded (each fetch itself tries for
# about two minutes): doubling from the base up to the cap, with jitter so that a fleet
# whose control plane comes back does not fetch all at once.
DOWNLOAD_RETRY_BASE_S = 30.0
DOWNLOAD_RETRY_MAX_S = 300.0


@dataclass(slots=True)
class ServedReplica:
    """One replica of a deployment on this node: its model, on its accelerators."""

    desired: DesiredDeployment
    stats: ServingStats  # its own, counted in its deployment's on this node too
    state: ReplicaState = "starting"
    reason: str = ""
    provider: str | None = None
    batcher: Batcher | None = None
    loading: asyncio.Task[None] | None = None
    runner: asyncio.Task[None] | None = None
    loaded_sha256: str | None = None
    # The last load failed while an older model went on serving: like a failed replica,
    # it is loaded again once a different desired document arrives.
    update_failed: bool = False
    # Set while waiting to fetch an unreachable model again: applying a desired
    # document wakes it (the control plane may be back).
    download_retry: asyncio.Event | None = None


@dataclass(slots=True)
class ServedDeployment:
    """A deployment's replicas on this node, by replica number. Their figures are added
    up in `stats`: `/metrics` counts per deployment and node, and telemetry sends that
    sum with each replica's own figures."""

    stats: ServingStats
    replicas: dict[int, ServedReplica] = field(default_factory=dict)
    turns: int = 0  # requests handed out, for taking turns over the ready replicas

    def next_batcher(self) -> Batcher | None:
        """Where the next request goes: the ready replicas take turns, and one whose queue
        is full is passed over while another has room (its batcher's 429 only when all
        are full). None while no replica here is ready."""
        ready = [
            replica.batcher
            for _, replica in sorted(self.replicas.items())
            if replica.batcher is not None
        ]
        if not ready:
            return None
        first = self.turns % len(ready)
        self.turns += 1
        in_turn = ready[first:] + ready[:first]
        return next((b for b in in_turn if b.queued < b.max_queue), in_turn[0])

    def sample(self, latency_scale: float) -> DeploymentSample:
        """The deployment's figures since the previous sample, with each replica's taken
        at the same moment (a replica withdrawn since is in the deployment's only)."""
        replicas = tuple(
            replica.stats.replica_sample(number, latency_scale)
            for number, replica in sorted(self.replicas.items())
        )
        return self.stats.sample(latency_scale, replicas)

    def new_replica(self, desired: DesiredDeployment) -> ServedReplica:
        stats = ServingStats(desired.deployment_id, counts_in=self.stats)
        return ServedReplica(desired, stats)


def _placement(desired: DesiredDeployment) -> tuple[object, ...]:
    """What a loaded model depends on: another value needs another session."""
    return (
        desired.model_sha256,
        desired.accelerator_kind,
        desired.accelerator_ids,
        desired.accelerators,  # a CPU replica's threads
        desired.providers,
    )


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
        download_retry_base_s: float = DOWNLOAD_RETRY_BASE_S,
        download_retry_max_s: float = DOWNLOAD_RETRY_MAX_S,
    ) -> None:
        self._inventory = tuple(inventory)
        self._cache = cache
        self._on_change = on_change
        self._endpoint_base = endpoint_base
        self._max_queue = max_queue
        self._latency_scale = latency_scale
        self._threads = intra_op_threads
        self._deployments: dict[str, ServedDeployment] = {}
        self._draining: set[asyncio.Task[None]] = set()
        # Withdrawn replicas still answering their accepted requests, by deployment.
        self._removing: dict[str, int] = {}
        self._download_retry_base_s = download_retry_base_s
        self._download_retry_max_s = download_retry_max_s
        self._tasks: asyncio.TaskGroup | None = None
        self._http: aiohttp.ClientSession | None = None
        self._log = get_logger("greenfed.inference")
        self.swaps = 0

    def bind(self, tasks: asyncio.TaskGroup) -> None:
        self._tasks = tasks

    @property
    def active(self) -> bool:
        return bool(self._deployments)

    def serving(self, deployment_id: str, replica: int | None = None) -> ServedReplica | None:
        """That replica of the deployment on this node, or (None) its lowest-numbered one."""
        deployment = self._deployments.get(deployment_id)
        if deployment is None or not deployment.replicas:
            return None
        number = min(deployment.replicas) if replica is None else replica
        return deployment.replicas.get(number)

    def being_removed(self, deployment_id: str) -> bool:
        """Whether a withdrawn replica of the deployment is still answering the requests
        it accepted (a deployment no longer desired here is `503` until then)."""
        return deployment_id in self._removing

    def next_batcher(self, deployment_id: str) -> Batcher | None:
        """The batcher of the replica that answers the deployment's next request here."""
        deployment = self._deployments.get(deployment_id)
        return deployment.next_batcher() if deployment is not None else None

    def stats(self) -> list[ServingStats]:
        return [deployment.stats for _, deployment in sorted(self._deployments.items())]

    def samples(self) -> tuple[DeploymentSample, ...]:
        return tuple(
            deployment.sample(self._latency_scale)
            for _, deployment in sorted(self._deployments.items())
        )

    def _replicas(self) -> list[ServedReplica]:
        return [r for d in self._deployments.values() for r in d.replicas.values()]

    # ---- desired -> running -------------------------------------------------------------

    def apply(self, desired: Sequence[DesiredDeployment]) -> None:
        """Start, update or withdraw replicas; returns at once (work happens in tasks)."""
        assert self._tasks is not None, "bind() the runtime to a task group first"
        grouped: dict[str, dict[int, DesiredDeployment]] = {}
        for replica in desired:
            grouped.setdefault(replica.deployment_id, {})[replica.replica] = replica
        for deployment_id in set(self._deployments) - set(grouped):
            for served in self._deployments.pop(deployment_id).replicas.values():
                self._withdraw(served)
        for deployment_id, wanted in grouped.items():
            deployment = self._deployments.setdefault(
                deployment_id, ServedDeployment(ServingStats(deployment_id))
            )
            for number in set(deployment.replicas) - set(wanted):
                self._withdraw(deployment.replicas.pop(number))
            for number, replica in wanted.items():
                self._update(deployment, number, replica)
        self._on_change()

    def _update(
        self, deployment: ServedDeployment, number: int, desired: DesiredDeployment
    ) -> None:
        current = deployment.replicas.get(number)
        if current is None:
            current = deployment.new_replica(desired)
            deployment.replicas[number] = current
            self._start(current, desired)
        elif _placement(desired) != _placement(current.desired) or (
            (current.state == "failed" or current.update_failed) and desired != current.desired
        ):
            current.desired = desired
            self._start(current, desired)  # load beside the old model, then swap
        else:
            current.desired = desired
            if current.download_retry is not None:
                current.download_retry.set()  # fetch the model again now
            if current.batcher is not None:
                current.batcher.configure(
                    max_batch_size=desired.max_batch_size,
                    max_queue_delay_s=desired.max_queue_delay_ms / 1000.0,
                )

    def _start(self, served: ServedReplica, desired: DesiredDeployment) -> None:
        assert self._tasks is not None
        if served.loading is not None:
            served.loading.cancel()
        served.update_failed = False
        served.loading = self._tasks.create_task(
            self._load(served, desired), name=f"load-{desired.deployment_id}-{desired.replica}"
        )

    def _withdraw(self, served: ServedReplica) -> None:
        assert self._tasks is not None
        if served.loading is not None:
            served.loading.cancel()
        if served.loaded_sha256 is not None:
            # Its session is in memory until drained; the file may go.
            self._cache.unpin(served.loaded_sha256)
        deployment_id = served.desired.deployment_id
        self._removing[deployment_id] = self._removing.get(deployment_id, 0) + 1
        task = self._tasks.create_task(self._drain(served))
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)

    async def _drain(self, served: ServedReplica) -> None:
        deployment_id = served.desired.deployment_id
        try:
            if served.batcher is not None:
                await served.batcher.drain()
            if served.runner is not None:
                served.runner.cancel()
        finally:
            left = self._removing.pop(deployment_id, 1) - 1
            if left:
                self._removing[deployment_id] = left
        self._log.info(
            "replica removed", deployment_id=deployment_id, replica=served.desired.replica
        )

    def _is_current(self, served: ServedReplica) -> bool:
        """Whether `served` is still desired here (not withdrawn meanwhile)."""
        return self.serving(served.desired.deployment_id, served.desired.replica) is served

    async def _load(self, served: ServedReplica, desired: DesiredDeployment) -> None:
        # Pinned from before the fetch until the model serves (then pinned as loaded) or
        # the load ends: another replica's download must not evict the file meanwhile.
        # (Placement includes the sha256: this task loads that one model whatever the
        # documents applied meanwhile.)
        loading_sha256 = desired.model_sha256
        if loading_sha256 is None:
            await self._load_pinned(served, desired)
            return
        self._cache.pin(loading_sha256)
        try:
            await self._load_pinned(served, desired)
        finally:
            self._cache.unpin(loading_sha256)

    async def _load_pinned(self, served: ServedReplica, desired: DesiredDeployment) -> None:
        try:
            model, desired = await self._prepare_when_reachable(served, desired)
        except asyncio.CancelledError:
            raise
        except (ModelFetchError, ModelLoadError, ValueError) as error:
            self._fail(served, desired, str(error))
            return
        except Exception as error:  # a bug or a driver crash: this replica only
            self._log.exception(
                "replica failed to load",
                deployment_id=desired.deployment_id,
                replica=desired.replica,
            )
            self._fail(served, desired, f"{type(error).__name__}: {error}")
            return
        deployment_id, number = desired.deployment_id, desired.replica
        if not self._is_current(served):
            return  # withdrawn while loading
        if served.batcher is None:
            served.batcher = Batcher(
                model,
                served.stats,
                max_batch_size=desired.max_batch_size,
                max_queue_delay_s=desired.max_queue_delay_ms / 1000.0,
                max_queue=self._max_queue,
            )
            assert self._tasks is not None
            served.runner = self._tasks.create_task(
                served.batcher.run(), name=f"batcher-{deployment_id}-{number}"
            )
        else:
            served.batcher.swap(model)
            served.batcher.configure(
                max_batch_size=desired.max_batch_size,
                max_queue_delay_s=desired.max_queue_delay_ms / 1000.0,
            )
            self.swaps += 1
        self._cache.pin(model.sha256)  # for as long as it serves
        if served.loaded_sha256 is not None:
            self._cache.unpin(served.loaded_sha256)
        served.loaded_sha256 = model.sha256
        served.state, served.provider, served.reason = "ready", model.provider, model.fallback
        self._log.info(
            "replica ready",
            deployment_id=deployment_id,
            replica=number,
            accelerator_ids=list(desired.accelerator_ids),
            provider=model.provider,
            sha256=model.sha256[:12],
        )
        self._on_change()

    async def _prepare_when_reachable(
        self, served: ServedReplica, desired: DesiredDeployment
    ) -> tuple[LoadedModel, DesiredDeployment]:
        """The loaded model, and the desired replica it was loaded for. A model that
        cannot be downloaded for now is fetched again after a backoff, or as soon as a
        desired document is applied, for as long as the replica is desired here: a
        node cut off from its control plane must not fail what it will serve once the
        control plane is back."""
        waits = 0
        while True:
            try:
                return await self._prepare(served, desired), desired
            except ModelUnreachable as error:
                delay_s = random.uniform(0.5, 1.0) * min(
                    self._download_retry_max_s, self._download_retry_base_s * 2**waits
                )
                waits += 1
                await self._wait_to_fetch_again(served, desired, str(error), delay_s)
            # A document applied meanwhile may carry another URL for the same model
            # (another placement would have restarted this task).
            desired = served.desired

    async def _wait_to_fetch_again(
        self, served: ServedReplica, desired: DesiredDeployment, why: str, delay_s: float
    ) -> None:
        retry = f"{why}; fetching it again in {delay_s:.0f} s, or once a desired state arrives"
        self._log.warning(
            "model unreachable: replica waits",
            deployment_id=desired.deployment_id,
            replica=desired.replica,
            reason=why,
            retry_in_s=round(delay_s, 1),
        )
        if served.batcher is not None and served.loaded_sha256 is not None:
            # An update waiting for its model: the old model keeps serving.
            served.reason = f"update to {desired.model_sha256 or '?'} waits: {retry}"
        else:
            served.state, served.reason = "starting", retry
        self._on_change()
        wake = asyncio.Event()
        served.download_retry = wake
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay_s):
                    await wake.wait()
        finally:
            if served.download_retry is wake:
                served.download_retry = None

    def _fail(self, served: ServedReplica, desired: DesiredDeployment, reason: str) -> None:
        self._log.warning(
            "replica failed",
            deployment_id=desired.deployment_id,
            replica=desired.replica,
            reason=reason,
        )
        if served.batcher is not None and served.loaded_sha256 is not None:
            # An update that failed: the old model keeps serving, the reason is reported.
            served.reason = f"update to {desired.model_sha256 or '?'} failed: {reason}"
            served.update_failed = True
        else:
            served.state, served.reason = "failed", reason
        self._on_change()

    async def _prepare(self, served: ServedReplica, desired: DesiredDeployment) -> LoadedModel:
        provider, refusal = check_assignment(desired, self._inventory)
        if refusal is not None:
            raise ValueError(refusal)
        if desired.model_url is None or desired.model_sha256 is None:
            raise ModelFetchError(
                f"model {desired.model_id or '(none)'} is not in the control plane's registry"
            )
        if self._http is None:
            self._http = aiohttp.ClientSession()

        def retrying(why: str) -> None:
            if served.state == "starting" and self._is_current(served):
                served.reason = why
                self._on_change()

        path = await self._cache.fetch(
            self._http,
            desired.model_url,
            desired.model_sha256,
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
        for deployment_id, deployment in sorted(self._deployments.items()):
            # Every replica here answers at the node's one endpoint for the deployment.
            endpoint = f"{base}/v1/infer/{deployment_id}" if base else None
            states.extend(
                ReportedDeployment(
                    deployment_id=deployment_id,
                    replica=number,
                    state=served.state,
                    provider=served.provider,
                    reason=served.reason,
                    endpoint=endpoint if served.state == "ready" else None,
                    model_sha256=served.loaded_sha256,
                )
                for number, served in sorted(deployment.replicas.items())
            )
        return tuple(states)

    async def close(self) -> None:
        for served in self._replicas():
            for task in (served.loading, served.runner):
                if task is not None:
                    task.cancel()
        for task in list(self._draining):
            task.cancel()
        if self._http is not None:
            with contextlib.suppress(Exception):
                await self._http.close()
            self._http = None
