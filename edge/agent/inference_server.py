"""Where the inference server is started lazily: the node's local HTTP endpoint and
its ONNX Runtime replicas, brought up the first time a deployment arrives, so
nodes that never serve never load aiohttp's server, numpy or ONNX Runtime.

Models are fetched into the cache by edge/inference/model_fetch.py; the replicas
themselves are edge/inference/runtime.py.

A port the endpoint cannot listen on (another program holds it) fails every desired
replica, with a reason naming the port, and is tried again in the background until it
is free (or nothing is desired any more): never an error for whoever applied the
`desired` document, which would stop the agent.

The endpoint's connections are open files of the agent, which its MQTT connection,
spool and model downloads need too: it holds a bounded number of them (more are
answered 503 and closed at once), and a client that sends half a request is cut off
(`EndpointLimits`: the control plane's header and body timeouts, both kept by
shared/http_read_timeouts.py). On stop it listens no more, gives the
requests it holds a moment to be answered, answers the rest 503 and only then closes
the replicas: the agent stops in about a second, well within systemd's TimeoutStopSec.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from edge.agent.context import AgentContext
from edge.agent.module import AgentModule
from edge.inference.options import InferenceOptions
from shared.backoff import Backoff
from shared.http_read_timeouts import BodyReadTimeoutError, ReadTimeouts
from shared.lean_logs import EventLogger
from shared.messages import Accelerator, DeploymentSample, DesiredDeployment, ReportedDeployment

if TYPE_CHECKING:  # imported when the first deployment arrives (aiohttp, numpy, ORT)
    from aiohttp import web
    from aiohttp.typedefs import Handler
    from aiohttp.web_protocol import RequestHandler
    from aiohttp.web_server import Server

    from edge.inference.runtime import InferenceRuntime

# A port the endpoint could not listen on is tried again after this long, then longer.
BIND_RETRY_INITIAL_S = 1.0
BIND_RETRY_MAX_S = 60.0

# The endpoint holds at most this many connections however many files the agent may open.
MAX_CONNECTIONS = 1024
# A connection refused for want of room is told so before it is closed.
_NO_ROOM_BODY: Final = (
    b'{"type":"about:blank","title":"Too many connections","status":503,'
    b'"detail":"the inference endpoint holds as many connections as it may"}'
)
_NO_ROOM_RESPONSE: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"Content-Type: application/problem+json\r\n"
    b"Retry-After: 1\r\n"
    b"Connection: close\r\n"
    b"Content-Length: " + str(len(_NO_ROOM_BODY)).encode() + b"\r\n\r\n" + _NO_ROOM_BODY
)
# A refused connection is read (and what it sends dropped) this long after its 503, so
# that a client still sending its request sees the answer, not a reset: closed with
# unread data, a socket is reset, and a client that writes its whole body before
# reading (most blocking ones) loses the 503. At most this many drain at once; past
# that a refused connection is closed at once (a flood keeps no files that way).
_REFUSED_DRAIN_S: Final = 2.0
_MAX_REFUSED_DRAINING: Final = 64
# At most one "connection limit reached" warning this often.
_FULL_LOG_INTERVAL_S = 60.0
# On stop, aiohttp's wait for each connection's handler (twice, the second time after
# cancelling it): short, the requests are answered before (`EndpointLimits.stop_grace_s`).
_SHUTDOWN_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointLimits:
    """What clients of the inference endpoint may hold of the agent."""

    # From a request's first byte to the end of its head (a new connection's from its
    # opening): past it the connection is closed. As the control plane's
    # cloud.http_header_timeout_s.
    header_timeout_s: float = 10.0
    # The longest pause within a request body: past it, 408 and the connection closed.
    # A slow upload that keeps moving is never cut off. As cloud.http_body_timeout_s.
    body_timeout_s: float = 60.0
    # None: a quarter of the agent's open-file limit, at most MAX_CONNECTIONS.
    max_connections: int | None = None
    # On stop: how long the requests being handled have to be answered; the rest 503.
    stop_grace_s: float = 1.0

    def connection_limit(self) -> int:
        if self.max_connections is not None:
            return self.max_connections
        import resource

        soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft_limit == resource.RLIM_INFINITY:
            return MAX_CONNECTIONS
        # The other three quarters are the agent's own: MQTT, the spool, model downloads,
        # its workers' pipes.
        return max(1, min(MAX_CONNECTIONS, soft_limit // 4))


def _problem(status: int, title: str, detail: str, **headers: str) -> web.Response:
    """The endpoint's own problem+json answer; imported when a request is answered, by
    when the endpoint (aiohttp, numpy) is loaded anyway."""
    from edge.inference.server import problem_response

    return problem_response(status, title, detail, **headers)


class _RequestsInFlight:
    """The endpoint's middleware: knows the requests being handled, so that a stop can
    answer them; answers 408 for a body whose client fell silent."""

    def __init__(self) -> None:
        self._deadlines: set[asyncio.Timeout] = set()
        self._none_left = asyncio.Event()
        self._none_left.set()
        self._stopping = False

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._stopping:  # on a connection kept alive, after the stop began
            return self._stopping_answer()
        # No deadline until the stop sets one (asyncio.timeout's own cancellation).
        deadline = asyncio.timeout(None)
        try:
            async with deadline:
                with self._tracked(deadline):
                    return await handler(request)
        except TimeoutError:
            if not deadline.expired():
                raise  # the handler's own
            return self._stopping_answer()
        except BodyReadTimeoutError as error:
            return _problem(408, "Request Timeout", str(error))

    @contextmanager
    def _tracked(self, deadline: asyncio.Timeout) -> Iterator[None]:
        self._deadlines.add(deadline)
        self._none_left.clear()
        try:
            yield
        finally:
            self._deadlines.discard(deadline)
            if not self._deadlines:
                self._none_left.set()

    @staticmethod
    def _stopping_answer() -> web.Response:
        detail = "the agent is stopping: ask again in a moment (here or another node)"
        return _problem(503, "Stopping", detail, **{"Retry-After": "1"})

    async def finish(self, grace_s: float) -> None:
        """Answer every request: those still waiting after `grace_s` with 503 (a request
        queued for a batch may wait minutes, and its replica is about to go)."""
        self._stopping = True
        deadline_s = asyncio.get_running_loop().time() + grace_s
        for deadline in self._deadlines:
            deadline.reschedule(deadline_s)
        # Answering takes an instant once the deadline passed; the bound is a safety net.
        try:
            async with asyncio.timeout(grace_s + _SHUTDOWN_TIMEOUT_S):
                await self._none_left.wait()
        except TimeoutError:
            pass  # the runner's shutdown closes what is left


class _ConnectionGuard:
    """The listening socket's protocol factory: at most `limit` connections, each with
    aiohttp's handler behind the header and body timeouts."""

    def __init__(self, server: Server, limits: EndpointLimits, log: EventLogger) -> None:
        self._server = server
        self._limits = limits
        self._log = log
        self.limit = limits.connection_limit()
        self.open = 0
        self.refused = 0
        self.draining = 0  # refused connections read until their client closes
        self._full_logged_at_s: float | None = None

    def __call__(self) -> asyncio.Protocol:
        return _GuardedConnection(self, self._limits)

    def admit(self) -> RequestHandler | None:
        """aiohttp's handler of a new connection, or None where there is no room."""
        if self.open >= self.limit:
            self.refused += 1
            self._log_full()
            return None
        self.open += 1
        return self._server()

    def release(self) -> None:
        self.open -= 1

    def _log_full(self) -> None:
        now_s = asyncio.get_running_loop().time()
        last_s = self._full_logged_at_s
        if last_s is not None and now_s - last_s < _FULL_LOG_INTERVAL_S:
            return
        self._full_logged_at_s = now_s
        self._log.warning(
            "inference endpoint at its connection limit: refusing connections",
            limit=self.limit,
            refused=self.refused,
        )


class _GuardedConnection(asyncio.Protocol):
    """One connection: aiohttp's handler (which has no read timeouts: its keep-alive
    timeout runs only between requests), with the header and body timeouts around it
    (shared/http_read_timeouts.py), as the control plane's API keeps its own."""

    def __init__(self, guard: _ConnectionGuard, limits: EndpointLimits) -> None:
        self._guard = guard
        self._limits = limits
        self._handler: RequestHandler | None = None  # None: refused
        self._timeouts: ReadTimeouts | None = None
        self._drain_timer: asyncio.TimerHandle | None = None  # a refused one's

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        handler = self._guard.admit()
        if handler is None:
            self._refuse(transport)
            return
        self._handler = handler
        handler.connection_made(transport)
        self._timeouts = ReadTimeouts(
            handler,
            asyncio.get_running_loop(),
            header_timeout_s=self._limits.header_timeout_s,
            body_timeout_s=self._limits.body_timeout_s,
        )
        self._timeouts.opened()

    def _refuse(self, transport: asyncio.Transport) -> None:
        """Answer 503, then read what the client still sends until it closes (or for
        `_REFUSED_DRAIN_S`): a client still sending its request gets the answer."""
        transport.write(_NO_ROOM_RESPONSE)
        guard = self._guard
        if guard.draining >= _MAX_REFUSED_DRAINING or not transport.can_write_eof():
            transport.close()
            return
        guard.draining += 1
        transport.write_eof()
        self._drain_timer = asyncio.get_running_loop().call_later(_REFUSED_DRAIN_S, transport.abort)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._drain_timer is not None:  # a refused connection, drained
            self._drain_timer.cancel()
            self._drain_timer = None
            self._guard.draining -= 1
        if self._handler is None or self._timeouts is None:
            return
        self._timeouts.closed()
        self._guard.release()
        self._handler.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._handler is None or self._timeouts is None:
            return  # refused: closing
        self._timeouts.feed(data, self._handler.data_received)

    def eof_received(self) -> None:  # aiohttp's handler closes the connection
        if self._handler is not None:
            self._handler.eof_received()

    def pause_writing(self) -> None:
        if self._handler is not None:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if self._handler is not None:
            self._handler.resume_writing()


@dataclass(slots=True)
class _Endpoint:
    """What listens: the socket, aiohttp's runner behind it, the requests in flight."""

    listener: asyncio.Server
    runner: web.AppRunner
    requests: _RequestsInFlight
    connections: _ConnectionGuard

    async def close(self, grace_s: float) -> None:
        self.listener.close()  # no new connections
        await self.requests.finish(grace_s)
        # Closes the kept-alive connections; what is still in flight has had its answer.
        await self.runner.cleanup()


class InferenceServer(AgentModule):
    name = "inference"

    def __init__(
        self,
        context: AgentContext,
        options: InferenceOptions,
        inventory: Sequence[Accelerator],
        *,
        on_change: Callable[[], None],
        limits: EndpointLimits = EndpointLimits(),
    ) -> None:
        self._context = context
        self._options = options
        self._inventory = tuple(inventory)
        self._on_change = on_change
        self._limits = limits
        self._work: asyncio.TaskGroup | None = None
        self._endpoint: _Endpoint | None = None
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
        """The endpoint first, its requests answered, then the replicas: closed first, a
        replica would leave its queued requests unanswered, and aiohttp would wait for
        them past systemd's patience (TimeoutStopSec)."""
        if self._rebind is not None:
            self._rebind.cancel()
            self._rebind = None
        if self._endpoint is not None:
            await self._endpoint.close(self._limits.stop_grace_s)
            self._endpoint = None
        if self.runtime is not None:
            await self.runtime.close()

    def _endpoint_base(self) -> str | None:
        if self.port is None:
            return None
        return f"http://{self._options.advertised()}:{self.port}"

    async def _serve(self) -> bool:
        """Listen, if not yet; whether the endpoint is listening."""
        async with self._serving:
            if self._endpoint is None:
                await self._listen()
            return self._endpoint is not None

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
        app = inference_app(runtime)
        requests = _RequestsInFlight()
        app.middlewares.append(web.middleware(requests))
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_S)
        await runner.setup()
        assert runner.server is not None  # set up
        connections = _ConnectionGuard(runner.server, self._limits, self._context.log)
        try:
            # As web.TCPSite listens, with the guard making each connection's protocol.
            listener = await asyncio.get_running_loop().create_server(
                connections, options.host, options.port, backlog=128
            )
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
        self.port = int(listener.sockets[0].getsockname()[1])
        self._endpoint = _Endpoint(listener, runner, requests, connections)
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
