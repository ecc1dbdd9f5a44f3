"""Where the inference server is started lazily: the node's local HTTP endpoint and
its ONNX Runtime replicas, brought up the first time a deployment arrives, so
nodes that never serve never load aiohttp's server, numpy or ONNX Runtime.

Models are fetched into the cache by edge/inference/model_fetch.py; the replicas
themselves are edge/inference/runtime.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from edge.agent.context import AgentContext
from edge.agent.module import AgentModule
from edge.inference.options import InferenceOptions
from shared.messages import Accelerator, DeploymentSample, DesiredDeployment, ReportedDeployment

if TYPE_CHECKING:  # imported when the first deployment arrives (aiohttp, numpy, ORT)
    from aiohttp import web

    from edge.inference.runtime import InferenceRuntime


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
        self.runtime: InferenceRuntime | None = None  # None until the first deployment
        self.port: int | None = None

    async def start(self, work: asyncio.TaskGroup) -> None:
        """Replicas, once there are any, live in `work`: they outlive MQTT connections."""
        self._work = work

    async def apply(self, deployments: Sequence[DesiredDeployment]) -> None:
        if deployments:
            await self._serve()
        if self.runtime is not None:
            self.runtime.apply(deployments)

    def samples(self) -> tuple[DeploymentSample, ...]:
        return self.runtime.samples() if self.runtime else ()

    def reported(self) -> tuple[ReportedDeployment, ...]:
        return self.runtime.reported() if self.runtime else ()

    async def stop(self) -> None:
        if self.runtime is not None:
            await self.runtime.close()
        if self._site is not None:
            await self._site.cleanup()
            self._site = None

    def _endpoint_base(self) -> str | None:
        if self.port is None:
            return None
        return f"http://{self._options.advertised()}:{self.port}"

    async def _serve(self) -> None:
        if self._site is not None:
            return
        from aiohttp import web

        from edge.inference.model_fetch import ModelCache
        from edge.inference.runtime import InferenceRuntime
        from edge.inference.server import inference_app

        options = self._options
        assert self._work is not None, "start() the inference server first"
        self.runtime = InferenceRuntime(
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
        self.runtime.bind(self._work)
        runner = web.AppRunner(inference_app(self.runtime), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, options.host, options.port)
        await site.start()
        # The bound address says the port when 0 (any free port) was asked for.
        self.port = int(runner.addresses[0][1])
        self._site = runner
        self._context.log.info("inference endpoint listening", url=self._endpoint_base())
