"""The control-plane application: REST API plus the background work it owns.

`create_app` wires the registry, MQTT ingestion, node liveness, the durable
store (with the admin bootstrap and the event hub) and the job logs into one aiohttp
application. The background tasks start and stop with the app through `cleanup_ctx`,
so whoever runs the app (`greenfed cloud`, `greenfed up`, tests) gets a bounded,
complete shutdown for free.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from cloud.admin import bootstrap_admin
from cloud.api import (
    agent_upgrades,
    apply,
    audit,
    clusters,
    enrolment,
    events,
    job_control,
    logs,
    models,
    mqtt_accounts,
    nodes,
    openapi,
    readmission,
    signals,
    system,
    tenants,
    tokens,
    usage,
    work,
)
from cloud.api.auth import auth_middleware, store_errors_middleware
from cloud.api.bodies import MAX_REQUEST_BYTES
from cloud.api.bulk_actions import DESTRUCTIVE_LOCKS, ActorLocks
from cloud.api.http_timeouts import TimedAppRunner, body_timeout_middleware
from cloud.api.problems import problem_middleware
from cloud.api.routes import add_routes, refuse_other_methods
from cloud.api.streams import StreamLimits
from cloud.api.tuning import ApiTuning
from cloud.app_keys import (
    ACCOUNTANT,
    ADMIN_TOKEN_FILE,
    BACKGROUND_TASKS,
    BROKER_ACCOUNTS,
    BROKER_OUTAGES,
    CLUSTERS,
    DRAIN_WAITING,
    EVENT_HUB,
    INGESTOR,
    JOB_LOGS,
    LIVENESS,
    METRICS,
    MODEL_BLOBS,
    MODEL_URL_SIGNER,
    NODE_PAGES,
    REGISTRY,
    SCHEDULER,
    SCRAPE_TOKEN,
    SECRETS_AT_REST,
    SETTINGS,
    SIGNALS,
    SIGNING_KEY,
    STOPPING,
    STORE,
    STREAMS,
    TUNING,
)
from cloud.broker_accounts import broker_accounts_from
from cloud.clusters.bridge import ClusterBridge
from cloud.clusters.runtime import ClusterFleet, hints_from
from cloud.event_loop_lag import EventLoopLag, EventLoopLagCollector
from cloud.fleet import node_admin
from cloud.fleet.assignments import AssignmentIndex, refresh_forever
from cloud.fleet.inference_metrics import InferenceCollector, InferenceCounters
from cloud.fleet.ingest import Ingestor, non_node_accounts_of
from cloud.fleet.liveness import Liveness, LivenessSettings
from cloud.fleet.node_pages import NodePages
from cloud.fleet.outage import BrokerOutageJudge
from cloud.fleet.plausibility import PlausibilityLimits
from cloud.fleet.registry import NodeRegistry
from cloud.interpreter_tuning import tuned_for_scheduling
from cloud.loop.loop import SchedulingLoop
from cloud.loop.publisher import CLUSTER_ID_SECRET, DesiredPublisher
from cloud.loop.signing import load_or_create_signing_key
from cloud.metrics import (
    DeploymentReplicasCollector,
    SchedulingCollector,
    build_metrics_registry,
)
from cloud.models.blobs import BlobStore
from cloud.models.signing import SECRET_NAME, ModelUrlSigner, api_base_url
from cloud.scrape_token import bootstrap_scrape_token
from cloud.secrets.at_rest import load_or_create_secrets_key
from cloud.secrets.release import SecretRelease
from cloud.signals.factory import build_signal_service
from cloud.store import StoreError, StoreUnavailableError, open_store
from cloud.streams.events import EventHub
from cloud.streams.logs import JobLogStore
from cloud.ui import routes as ui
from cloud.upgrades.controller import UpgradeController
from cloud.usage.accountant import Accountant
from cloud.usage.metrics import GridCollector, UsageCollector, ZonePower
from shared.mqtt import instance_client_id
from shared.settings import ConfigError, Settings
from shared.tasks import stop_task, stop_tasks
from shared.topics import Topics

__all__ = ["MAX_REQUEST_BYTES", "create_app", "serving"]

_log = structlog.get_logger("greenfed.cloud")


async def _background(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    # What admins set and approved on nodes, before the first birth is judged by it.
    app[REGISTRY].set_admin(await app[STORE].node_admin())
    session = app[INGESTOR].session(settings.mqtt, client_id=instance_client_id("greenfed-cloud"))
    # Wills that came with our own loss of the broker are the broker's, not the nodes'.
    session.link_lost_listeners.append(app[BROKER_OUTAGES].link_lost)
    ingestion = asyncio.create_task(app[INGESTOR].run(session), name="mqtt-ingestion")
    liveness = asyncio.create_task(app[LIVENESS].run(app[INGESTOR].notify_change), name="liveness")
    # Who runs what, for ingestion; the scheduling loop also updates it after each pass.
    index = app[INGESTOR].assignments
    assert index is not None
    assignments = asyncio.create_task(refresh_forever(index, app[STORE]), name="assignments")
    # What admins set on nodes (cordons, taints, labels), from whichever replica set it.
    node_settings = asyncio.create_task(
        node_admin.refresh_forever(app[REGISTRY], app[STORE], drain_waiting=app[DRAIN_WAITING]),
        name="node-admin",
    )
    # How long ready work waits for the event loop (greenfed_event_loop_lag_seconds).
    lag = EventLoopLag()
    lag_collector = EventLoopLagCollector(lag)
    app[METRICS].fleet.register(lag_collector)
    lag_watch = asyncio.create_task(lag.run(), name="event-loop-lag")
    tasks = [ingestion, liveness, assignments, node_settings, lag_watch]
    app[BACKGROUND_TASKS].extend(tasks)
    try:
        yield
    finally:
        app[METRICS].fleet.unregister(lag_collector)
        # Cancellation is the expected end; any other failure surfaces here.
        await stop_tasks(tasks)


async def _signal_service(app: web.Application) -> AsyncIterator[None]:
    """The grid signal chain, with one HTTP session for every live provider."""
    async with aiohttp.ClientSession() as http:
        app[SIGNALS] = build_signal_service(app[SETTINGS].signals, session=http)
        yield


async def _secrets_key(app: web.Application) -> AsyncIterator[None]:
    """The key tenants' secrets are encrypted with in the store, read (or made) once."""
    app[SECRETS_AT_REST] = await asyncio.to_thread(load_or_create_secrets_key, app[SETTINGS])
    yield


async def _signing_key(app: web.Application) -> AsyncIterator[None]:
    """The key `desired` documents and enrolment certificates are signed with, read (or
    made) once: the publisher, enrolment and clusters' sealing key all take it from here."""
    app[SIGNING_KEY] = await asyncio.to_thread(load_or_create_signing_key, app[SETTINGS])
    yield


async def _store(app: web.Application) -> AsyncIterator[None]:
    """The store (migrated), the admin tenant, and the one reader of the event log."""
    settings = app[SETTINGS].store
    tuning = app[TUNING]
    try:
        store = await open_store(settings)
    except StoreUnavailableError as error:  # the command line prints it, no traceback
        raise ConnectionError(str(error)) from None
    except StoreError as error:  # a setting to fix, or a database of another version
        raise ConfigError(str(error)) from None
    try:
        app[STORE] = store
        app[MODEL_BLOBS] = BlobStore(
            settings.resolved_data_dir() / "models", app[SETTINGS].cloud.max_model_bytes
        )
        app[MODEL_URL_SIGNER] = ModelUrlSigner(
            await store.shared_secret(SECRET_NAME), api_base_url(app[SETTINGS].cloud)
        )
        app[ADMIN_TOKEN_FILE] = await bootstrap_admin(store, settings)
        app[SCRAPE_TOKEN] = await bootstrap_scrape_token(store, settings)
        hub = EventHub(
            store,
            poll_interval_s=tuning.event_poll_interval_s,
            min_interval_s=tuning.event_min_interval_s,
            page_size=tuning.event_page_size,
            queue_limit=tuning.event_queue_limit,
        )
        await hub.start()
        app[EVENT_HUB] = hub
        stop_listening = store.add_commit_listener(hub.wake)
        # PostgreSQL: other replicas' commits wake the hub and the leader's passes too.
        store.listen_for_changes(connect_timeout_s=settings.connect_timeout_s)
        reader = asyncio.create_task(hub.run(), name="event-hub")
        app[BACKGROUND_TASKS].append(reader)
        try:
            yield
        finally:
            hub.close()
            stop_listening()
            await stop_task(reader)
    finally:
        await store.close()


async def _scheduling(app: web.Application) -> AsyncIterator[None]:
    """The scheduling loop and its `desired` publisher; triggered by store commits
    (submissions, cancellations; other replicas' too on PostgreSQL) and by node changes
    and reports."""
    settings = app[SETTINGS]
    if not settings.scheduling.enabled:
        # An API-only replica holds the whole fleet's registry too: at the default
        # thresholds its full collections (0.2-0.8 s each at 10,000 nodes, every 10-20 s)
        # stalled the loop serving its pages (benchmarks/RESULTS.md, issue 28).
        with tuned_for_scheduling():
            yield
        return
    publisher = DesiredPublisher(
        settings.mqtt,
        signing_key=app[SIGNING_KEY],
        cluster_id=await app[STORE].shared_secret(CLUSTER_ID_SECRET),
    )
    accountant = (
        Accountant(app[STORE], app[REGISTRY], settings.usage) if settings.usage.enabled else None
    )
    loop = SchedulingLoop(
        app[STORE],
        app[REGISTRY],
        publisher,
        settings.scheduling,
        liveness=app[LIVENESS],
        assignments=app[INGESTOR].assignments,
        signals=app[SIGNALS],
        model_urls=app[MODEL_URL_SIGNER],
        accountant=accountant,
        secrets=SecretRelease(
            app[SECRETS_AT_REST], log_interval_s=settings.cloud.invalid_log_interval_s
        ),
        upgrades=UpgradeController(app[STORE], app[MODEL_URL_SIGNER]),
    )
    app[SCHEDULER] = loop
    # Documents of clusters' nodes go to their bridges, not the broker (cloud/clusters/),
    # again to a bridge that starts later (another replica registered its cluster).
    publisher.diverted = app[CLUSTERS].accept

    def bridge_started(bridge: ClusterBridge) -> None:
        publisher.resend(bridge.owns)
        loop.wake()

    app[CLUSTERS].started_listeners.append(bridge_started)
    metrics = app[METRICS]
    # (registry, collector): the fleet's series, and those that name tenants or deployments.
    collectors: list[tuple[CollectorRegistry, Collector]] = [
        (metrics.fleet, SchedulingCollector(loop)),
        (metrics.tenants, DeploymentReplicasCollector(loop)),
    ]
    if accountant is not None:
        app[ACCOUNTANT] = accountant
        app[INGESTOR].telemetry_listeners.append(accountant.observe)
        # Other replicas' shares of the telemetry (mqtt.shared_group): the leader meters
        # every node, each span once past its node's mark (cloud/fleet/digest.py),
        # decoding only the samples it cannot hold for its next flush; a replica that
        # does not lead decodes none of them until they are read.
        app[INGESTOR].digest_listeners.append(accountant.observe)
        app[INGESTOR].relayed_wanted = accountant.relayed
        collectors.append((metrics.tenants, UsageCollector(accountant)))
        collectors.append(
            (
                metrics.fleet,
                GridCollector(
                    accountant, app[REGISTRY], app[SIGNALS].newest_reading_s, loop.leading
                ),
            )
        )
    # Summed from the scrape's samples in its worker thread (cloud/usage/metrics.py).
    zone_power = ZonePower() if accountant is not None else None
    if zone_power is not None:
        metrics.sampled.append(zone_power)
    for registry, collector in collectors:
        registry.register(collector)
    stop_listening = app[STORE].add_commit_listener(loop.wake)
    app[INGESTOR].change_listeners.append(loop.wake)
    tasks = [
        asyncio.create_task(publisher.run(), name="desired-publisher"),
        asyncio.create_task(loop.run(), name="scheduling-loop"),
    ]
    app[BACKGROUND_TASKS].extend(tasks)
    try:
        # The API stays responsive beside the passes (cloud/interpreter_tuning.py).
        with tuned_for_scheduling():
            yield
    finally:
        stop_listening()
        app[CLUSTERS].started_listeners.remove(bridge_started)
        app[INGESTOR].change_listeners.remove(loop.wake)
        if accountant is not None:
            app[INGESTOR].telemetry_listeners.remove(accountant.observe)
            app[INGESTOR].digest_listeners.remove(accountant.observe)
            app[INGESTOR].relayed_wanted = None
        for registry, collector in collectors:
            registry.unregister(collector)
        if zone_power is not None:
            metrics.sampled.remove(zone_power)
        await stop_tasks(reversed(tasks))


async def _clusters(app: web.Application) -> AsyncIterator[None]:
    """A bridge per registered cluster, following the store's registrations: those
    registered already run before scheduling starts, so that the loop's first documents
    for their nodes reach them."""
    app[CLUSTERS].use_keys(app[SIGNING_KEY], app[SECRETS_AT_REST])
    await app[CLUSTERS].adopt(await app[STORE].list_clusters())
    task = asyncio.create_task(app[CLUSTERS].run(app[STORE].list_clusters), name="clusters")
    app[BACKGROUND_TASKS].append(task)
    try:
        yield
    finally:
        await stop_task(task)


async def _broker_accounts(app: web.Application) -> AsyncIterator[None]:
    """Closes the accounts' broker connection after every other context has ended: a
    context, not an `on_cleanup` hook, which aiohttp would skip once a context failed."""
    try:
        yield
    finally:
        await app[BROKER_ACCOUNTS].close()


async def _end_streams(app: web.Application) -> None:
    """Shutting down: event streams and followed logs end now, not at the timeout."""
    app[STOPPING].set()
    app[JOB_LOGS].close()
    if EVENT_HUB in app:
        app[EVENT_HUB].close()


def create_app(
    settings: Settings,
    registry: NodeRegistry | None = None,
    *,
    tuning: ApiTuning | None = None,
) -> web.Application:
    registry = registry or NodeRegistry(
        max_nodes=settings.cloud.max_nodes, max_clock_skew_s=settings.cloud.max_clock_skew_s
    )
    tuning = tuning or ApiTuning()
    job_logs = JobLogStore(
        bytes_per_job=tuning.log_bytes_per_job,
        total_bytes=tuning.log_total_bytes,
        max_jobs=tuning.log_max_jobs,
    )
    broker_outages = BrokerOutageJudge(registry)
    ingestor = Ingestor(
        registry,
        Topics(settings.mqtt.topic_root),
        on_state_change=broker_outages.note_state_change,
        max_payload_bytes=settings.mqtt.max_payload_bytes,
        invalid_log_interval_s=settings.cloud.invalid_log_interval_s,
        on_log=job_logs.append,
        limits=PlausibilityLimits.of(settings.cloud),
        assignments=AssignmentIndex(),
        shared_group=settings.mqtt.shared_group,
        digest_interval_s=settings.mqtt.digest_interval_s,
        keepalive_s=settings.mqtt.keepalive_s,
        # The link is proven as often as liveness looks (cloud/fleet/link_probe.py).
        link_probe_interval_s=settings.cloud.liveness_check_interval_s,
        non_node_accounts=non_node_accounts_of(settings.mqtt.username),
    )
    app = web.Application(
        middlewares=[
            problem_middleware,
            body_timeout_middleware,
            store_errors_middleware,
            auth_middleware,
        ],
        client_max_size=MAX_REQUEST_BYTES,
    )
    app[SETTINGS] = settings
    app[REGISTRY] = registry
    app[NODE_PAGES] = NodePages(registry)
    app[DRAIN_WAITING] = node_admin.StoredDrainWaiting()
    # Judged by what the link is proven to carry, not by being subscribed: a half-open
    # link stays subscribed until the keep-alive gives it up.
    app[LIVENESS] = Liveness(
        registry,
        LivenessSettings.of(settings),
        link_up=ingestor.link_probe.is_up,
        proven_until_s=ingestor.link_probe.proven_until_s,
        # Nor by a stalled replica's share of the telemetry (cloud/fleet/digest.py).
        relayed_until_s=ingestor.digest_peers.relayed_until_s,
    )
    app[INGESTOR] = ingestor
    app[BROKER_OUTAGES] = broker_outages
    app[METRICS] = build_metrics_registry(
        ingestor, accelerator_metrics=settings.cloud.accelerator_metrics
    )
    assignments = ingestor.assignments

    def tenant_of(work_id: str) -> str:
        return app[ACCOUNTANT].tenant_of(work_id) if ACCOUNTANT in app else ""

    def leads_scheduling() -> bool:
        return SCHEDULER in app and app[SCHEDULER].leading.is_set()

    serving_counters = InferenceCounters(
        lambda node_id, deployment_id: (
            assignments is None or assignments.holds("replica", node_id, deployment_id)
        ),
        tenant_of=tenant_of,
        # Without a shared group every replica takes every sample: only the leader counts
        # the requests, so that their sum across replicas counts each once.
        counting=None if settings.mqtt.shared_group else leads_scheduling,
    )
    ingestor.telemetry_listeners.append(serving_counters.observe)
    if assignments is not None:
        # A deployment's series go a linger after its last replica leaves.
        serving_counters.follow(assignments)
    app[METRICS].tenants.register(InferenceCollector(serving_counters, registry, tenant_of))
    app[JOB_LOGS] = job_logs
    app[TUNING] = tuning
    app[STREAMS] = StreamLimits(
        max_streams=tuning.max_streams, max_per_tenant=tuning.max_streams_per_tenant
    )
    app[DESTRUCTIVE_LOCKS] = ActorLocks(asyncio.Lock)
    app[STOPPING] = asyncio.Event()
    app[BACKGROUND_TASKS] = []
    app[BROKER_ACCOUNTS] = broker_accounts_from(settings)
    app[CLUSTERS] = ClusterFleet(
        registry,
        notify=ingestor.notify_change,
        # A cluster job no document names is cancelled only once this process's loop has
        # handed every node its document (cloud/clusters/bridge.py).
        loop_passes=lambda: app[SCHEDULER].stats.passes if SCHEDULER in app else 0,
        work_hints=lambda job_id: (
            hints_from(app[SCHEDULER].work_record(job_id)) if SCHEDULER in app else None
        ),
        on_log=job_logs.append,
        # The live list: accounting joins it when scheduling starts.
        telemetry_listeners=ingestor.telemetry_listeners,
        # Each attempt is recorded before a cluster runs it: none is ever submitted twice.
        claim_submission=lambda cluster, job_id, attempt: app[STORE].claim_cluster_submission(
            cluster, job_id, attempt
        ),
    )
    enrolment.install(app)
    # enrolment first: its /v1/nodes/enrolled and /v1/nodes/join-tokens before /v1/nodes/{node_id}
    for module in (
        enrolment,
        readmission,
        nodes,
        signals,
        system,
        apply,  # its /v1/jobs/dry-run before /v1/jobs/{id}
        work,
        job_control,
        models,
        logs,
        events,
        tenants,
        usage,
        clusters,
        mqtt_accounts,
        agent_upgrades,
    ):
        add_routes(app, module.ROUTES)
    for module in (tokens, audit):
        add_routes(app, module.ROUTES)
    add_routes(app, openapi.ROUTES)
    add_routes(app, ui.ROUTES)
    refuse_other_methods(app)
    openapi.publish(app)
    app.cleanup_ctx.append(_broker_accounts)  # first in, last out
    app.cleanup_ctx.append(_signal_service)
    app.cleanup_ctx.append(_secrets_key)  # before the store takes submissions
    app.cleanup_ctx.append(_signing_key)
    app.cleanup_ctx.append(_store)
    app.cleanup_ctx.append(enrolment.enrolled_nodes_context)  # before ingestion starts
    app.cleanup_ctx.append(_clusters)  # before scheduling hands documents to them
    app.cleanup_ctx.append(_scheduling)
    app.cleanup_ctx.append(_background)
    app.on_shutdown.append(_end_streams)
    return app


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str, port: int) -> AsyncIterator[web.AppRunner]:
    """Serve `app` on host:port for the duration of the block."""
    cloud = app[SETTINGS].cloud
    runner = TimedAppRunner(
        app,
        header_timeout_s=cloud.http_header_timeout_s,
        body_timeout_s=cloud.http_body_timeout_s,
        malformed_log_interval_s=cloud.invalid_log_interval_s,
        access_log=None,
        shutdown_timeout=2.0,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        yield runner
    except BaseException as ending:
        await _clean_up_after(runner, ending)
        raise
    await runner.cleanup()


async def _clean_up_after(runner: web.AppRunner, ending: BaseException) -> None:
    """Clean up while `ending` leaves the block: it stays what the command reports.

    A refused broker login fails every MQTT session (ingestion, the publisher) and each
    cleanup context re-raises its own task's copy; raised over `ending`, aiohttp's
    CleanupError of them ended the command with exit status 1 and tracebacks, not the
    one line and status 3 of docs/configuration.md [mqtt]. A failure of another kind
    is logged; one of the same kind is the same failure again.
    """
    try:
        await runner.cleanup()
    except Exception as error:
        failures = error.exceptions if isinstance(error, web.CleanupError) else [error]
        for failure in failures:
            if type(failure) is not type(ending):
                _log.warning("cleanup failed too", exc_info=failure)
