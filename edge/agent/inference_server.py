"""Where the inference server is started lazily: the node's local HTTP endpoint and
its ONNX Runtime replicas, brought up the first time a deployment arrives, so
nodes that never serve never load aiohttp's server, numpy or ONNX Runtime.

Models are fetched into the cache by edge/inference/model_fetch.py; the replicas
themselves are edge/inference/runtime.py.

A port the endpoint cannot listen on (another program holds it) fails every desired
replica, with a reason naming the port, and is tried again in the background until it
is free (or nothing is desired any more): never an error for whoever applied the
`desired` document, which would stop the agent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from edge.agent.context import AgentContext
from edge.agent.module import AgentModule
from edge.inference.options import InferenceOptions
from shared.backoff import Backoff
from shared.messages import Accelerator, DeploymentSample, DesiredDeployment, ReportedDeployment

if TYPE_CHECKING:  # imported when the first deployment arrives (aiohttp, numpy, ORT)
    from aiohttp import web

    from edge.inference.runtime import InferenceRuntime

# A port the endpoint could not listen on is tried again after this long, then longer.
BIND_RETRY_INITIAL_S = 1.0
BIND_RETRY_MAX_S = 60.0


class InferenceServer(AgentModule):
    name = "inference"

    def __init__(
        self,
        context: AgentContext,
        options: InferenceOptions,
        inventory: Sequence[Accelerator],
        *,
        on_change: Callable[[], None],
    ) -> None:
        self._context = context
        self._options = options
        self._inventory = tuple(inventory)
        self._on_change = on_change
        self._work: asyncio.TaskGroup | None = None
        self._site: web.AppRunner | None = None
        self._serving = asyncio.Lock()  # one attempt to listen at a time
        self._desired: tuple[DesiredDeployment, ...] = ()
        # Why the endpoint is not listening although deployments are desired.
        self.bind_failure: str | None = None
        self._rebind: asyncio.Task[None] | None = None
        self.runtime: InferenceRuntime | None = None  # None until the first deployment
        self.port: int | None = None

    async def start(self, work: asyncio.TaskGroup) -> None:
        """Replicas, once there are any, live in `work`: they outlive MQTT connections."""
        self._work = work

    async def apply(self, deployments: Sequence[DesiredDeployment]) -> None:
        failing = self.runtime is None and self.bind_failure is not None and bool(self._desired)
        self._desired = tuple(deployments)  # the retries stop once it is empty
        if deployments and not await self._serve():
            self._retry_listening()
            self._on_change()  # every replica failed: reported at once
            return
        if self.runtime is not None:
            self.runtime.apply(deployments)
        elif failing:
            self._on_change()  # the replicas reported failed are no longer desired

    def samples(self) -> tuple[DeploymentSample, ...]:
        return self.runtime.samples() if self.runtime else ()

    def reported(self) -> tuple[ReportedDeployment, ...]:
        if self.runtime is not None:
            return self.runtime.reported()
        if self.bind_failure is None:
            return ()
        return tuple(
            ReportedDeployment(
                deployment_id=desired.deployment_id,
                replica=desired.replica,
                state="failed",
                reason=self.bind_failure,
            )
            for desired in self._desired
        )

    async def stop(self) -> None:
        if self._rebind is not None:
            self._rebind.cancel()
            self._rebind = None
        if self.runtime is not None:
            await self.runtime.close()
        if self._site is not None:
            await self._site.cleanup()
            self._site = None

    def _endpoint_base(self) -> str | None:
        if self.port is None:
            return None
        return f"http://{self._options.advertised()}:{self.port}"

    async def _serve(self) -> bool:
        """Listen, if not yet; whether the endpoint is listening."""
        async with self._serving:
            if self._site is None:
                await self._listen()
            return self._site is not None

    async def _listen(self) -> None:
        from aiohttp import web

        from edge.inference.model_fetch import ModelCache
        from edge.inference.runtime import InferenceRuntime
        from edge.inference.server import inference_app

        options = self._options
        assert self._work is not None, "start() the inference server first"
        runtime = InferenceRuntime(
            self._inventory,
            ModelCache(
                options.resolved_cache_dir(self._context.identity.node_id),
                options.cache_max_bytes,
            ),
            on_change=self._on_change,
            endpoint_base=self._endpoint_base,
            max_queue=options.max_queue,
            latency_scale=options.latency_scale,
            intra_op_threads=options.intra_op_threads,
        )
        runner = web.AppRunner(inference_app(runtime), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, options.host, options.port)
        try:
            await site.start()
        except OSError as error:  # the port is taken, or the address not this host's
            await runner.cleanup()
            failure = (
                f"the inference endpoint cannot listen on {options.host} port "
                f"{options.port}: {error.strerror or error}"
            )
            if failure != self.bind_failure:
                self._context.log.warning(
                    "inference endpoint not listening", reason=failure, port=options.port
                )
            self.bind_failure = failure
            return
        runtime.bind(self._work)
        self.runtime = runtime
        self.bind_failure = None
        # The bound address says the port when 0 (any free port) was asked for.
        self.port = int(runner.addresses[0][1])
        self._site = runner
        self._context.log.info("inference endpoint listening", url=self._endpoint_base())

    def _retry_listening(self) -> None:
        if self._rebind is not None and not self._rebind.done():
            return
        assert self._work is not None, "start() the inference server first"
        self._rebind = self._work.create_task(self._listen_when_free(), name="inference-listen")

    async def _listen_when_free(self) -> None:
        """Try the port again until it is free, then serve what is desired by then. Runs
        among the agent's work: it must end quietly, whatever happens."""
        backoff = Backoff(BIND_RETRY_INITIAL_S, BIND_RETRY_MAX_S)
        while self._desired:
            await asyncio.sleep(backoff.next_delay_s())
            try:
                if not await self._serve():
                    continue
                if self.runtime is not None and self._desired:
                    self.runtime.apply(self._desired)
                self._on_change()
                return
            except Exception:
                self._context.log.exception("inference endpoint: listening again failed")
