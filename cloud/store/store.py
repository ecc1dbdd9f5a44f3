"""`Store`: the typed repository the REST layer and the scheduling loop call.

Every method is one transaction; every write commits before it returns, so what a
method returned is durable (a 201 may be sent). Records come back as frozen values.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets as secrets_module
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import TracebackType

import structlog
from sqlalchemy import bindparam, func, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from cloud.fleet.envelope import NodeClaim
from cloud.store import (
    agent_upgrades,
    clusters,
    enrolment,
    enrolment_failures,
    fair_share,
    job_control,
    node_admin,
    tenant_tokens,
    usage,
)
from cloud.store import dependencies as dependencies_rows
from cloud.store.agent_upgrades import AgentPackageRecord, AgentRolloutRecord
from cloud.store.audit import (
    AuditPage,
    AuditQuery,
    NewAudit,
    insert_audit,
    insert_audits,
    select_audit_page,
)
from cloud.store.change_notify import (
    ChangeListener,
    ChangeNotifier,
    change_channel,
    listener_connector,
    new_origin,
    notify_change,
)
from cloud.store.changes import Changes, apply_changes, event_row
from cloud.store.clusters import ClusterRecord
from cloud.store.drain_waiting import select_drain_waiting
from cloud.store.engine import (
    WRITE_OPTION,
    Backend,
    DatabaseTarget,
    build_engine,
    enable_wal,
    resolve_database,
)
from cloud.store.enrolment import (
    CreatedJoinToken,
    EnrolledNodeRecord,
    JoinTokenRecord,
    NewJoinToken,
    NodeDefaults,
    Redemption,
)
from cloud.store.enrolment_failures import FailureBudget
from cloud.store.errors import (
    IllegalTransitionError,
    LastAdminTokenError,
    LeadershipLostError,
    StoreUnavailableError,
    TenantExistsError,
    TenantNotFoundError,
    TokenNotActiveError,
    TokenNotFoundError,
    VersionConflictError,
)
from cloud.store.fair_share import FairShareRow
from cloud.store.group_commit import GroupCommit
from cloud.store.ids import IdGenerator
from cloud.store.job_arrays import (
    ArrayTaskRecord,
    NewArrayTask,
    insert_array,
    select_array_tasks,
    select_task_id,
)
from cloud.store.leadership import (
    LeadershipLease,
    PostgresLease,
    SqliteLease,
    leader_lock_path,
    try_acquire_postgres,
    try_acquire_sqlite,
)
from cloud.store.locks import advisory_key, current_namespace
from cloud.store.migrate import MigrationReport, migrate
from cloud.store.models import insert_model, list_model_page, model_from_row, select_model
from cloud.store.node_admin import NodeAdminChanges, NodeAdminRecord
from cloud.store.records import (
    AllocationRecord,
    CommitResult,
    CreatedTenant,
    EventRecord,
    EvictionWrite,
    ModelPage,
    ModelRecord,
    NewDependency,
    NewEvent,
    NewModel,
    NewTenant,
    NodeDesired,
    PassWrite,
    StateWrite,
    StoreSnapshot,
    SubmitResult,
    TenantChanges,
    TenantRecord,
    WorkExplanation,
    WorkLinks,
    WorkPage,
    WorkRecord,
)
from cloud.store.rows import (
    check_json_object,
    encode_json,
    event_from_row,
    tenant_from_row,
    work_from_row,
)
from cloud.store.schema import (
    allocations,
    events,
    models,
    node_generations,
    secrets,
    tenants,
    work,
)
from cloud.store.sql import (
    StoreContext,
    append_events,
    bump_generations,
    chunks,
    insert_ignoring,
    raise_generations,
)
from cloud.store.states import TERMINAL_STATES, HoldKind
from cloud.store.tenant_tokens import (
    Authenticated,
    CreatedToken,
    RotatedToken,
    ScryptBudget,
    TokenCheck,
    TokenRecord,
    TokenRefused,
    TokenThrottled,
)
from cloud.store.tenants import TokenCache, change_tenant, insert_tenant
from cloud.store.tokens import issue_token, parse_token
from cloud.store.usage import (
    CounterfactualRecord,
    UsageHour,
    UsageMark,
    UsageQuery,
    UsageTotal,
    UsageWrite,
)
from cloud.store.work import (
    NewWork,
    Submitted,
    insert_work_group,
    list_work_page,
    select_active_work,
    select_allocations,
    select_work,
    select_work_by_idempotency_key,
)
from cloud.store.work_lookup import LiveNamed, select_live_named, select_work_matching
from cloud.upgrades.views import RolloutPhase, RolloutState
from shared.secret_hashes import verify_secret
from shared.settings import StoreSettings
from shared.tasks import stop_task
from shared.work_literals import AllocationState, PriorityClass, WorkKind, WorkState

_IDEMPOTENCY_KEY_MAX = 255
_log = structlog.get_logger("greenfed.store")


async def open_store(settings: StoreSettings, *, clock: Callable[[], float] = time.time) -> Store:
    """Connect, migrate the schema to this code's version, and return the store.

    Raises `StoreConfigError` / `StoreUnavailableError` (naming the setting) when the
    database cannot be used, `SchemaTooNewError` when a newer greenfed migrated it.
    """
    target = resolve_database(settings)
    engine = build_engine(target, settings)
    setting = "store.database_url" if settings.database_url else "store.data_dir"
    try:
        if target.backend == "sqlite":
            await enable_wal(engine, settings.busy_timeout_s)
        report = await migrate(engine, target, clock=clock)
        async with engine.connect() as connection:
            namespace = (
                (target.schema or await current_namespace(connection))
                if target.backend == "postgresql"
                else ""
            )
    except (DBAPIError, OSError, TimeoutError, sqlite3.Error) as error:
        await engine.dispose()
        raise StoreUnavailableError(
            f"{setting}: cannot use the database {target.describe()}: {_driver_words(error)}"
        ) from error
    except BaseException:  # SchemaTooNewError and the like: refuse, leaving nothing open
        await engine.dispose()
        raise
    return Store(engine, target, settings, namespace=namespace, report=report, clock=clock)


def _driver_words(error: BaseException) -> str:
    """What went wrong, as the driver put it (e.g. 'role "x" does not exist')."""
    if isinstance(error, DBAPIError) and error.orig is not None:
        return str(error.orig)
    return f"{type(error).__name__}: {error}"


class Store:
    def __init__(
        self,
        engine: AsyncEngine,
        target: DatabaseTarget,
        settings: StoreSettings,
        *,
        namespace: str,
        report: MigrationReport,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.target = target
        self.migrations = report
        self._engine = engine
        self._writer = engine.execution_options(**{WRITE_OPTION: True})
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        # Tenants created or changed through this store: caches of tenants built by
        # this process (cloud/api/registered_fleet.py) know to read them again.
        self.tenant_changes = 0
        self._write_queue: contextlib.AbstractAsyncContextManager[object] = (
            asyncio.Lock() if target.backend == "sqlite" else contextlib.nullcontext()
        )
        # PostgreSQL's default READ COMMITTED gives each statement its own snapshot;
        # a scheduling snapshot must be one consistent view.
        self._snapshot_reader = (
            engine.execution_options(isolation_level="REPEATABLE READ")
            if target.backend == "postgresql"
            else engine
        )
        self._settings = settings
        self._namespace = namespace
        self._clock = clock
        self._ids = IdGenerator()
        self._tokens = TokenCache(settings.token_cache_s)
        self._scrypt_budget = ScryptBudget()
        self._submissions = GroupCommit(self._commit_submissions)
        # (token, cache epoch) -> its verification in flight (`check_token`).
        self._verifying: dict[tuple[str, int], asyncio.Future[TokenCheck]] = {}
        # scrypt's own threads: verifications never take the default pool's threads
        # (the store's SQLite work, file reads) from the rest of the control plane.
        self._scrypt = ThreadPoolExecutor(max_workers=2, thread_name_prefix="scrypt")
        self._leader_key = advisory_key(namespace, "leader")
        self._clusters_key = advisory_key(namespace, "clusters")
        self._leases: set[LeadershipLease] = set()
        self._context = StoreContext(
            backend=target.backend,
            events_lock_key=advisory_key(namespace, "events"),
            max_attempts=settings.max_attempts,
            clock=clock,
        )
        self._commit_listeners: list[Callable[[], None]] = []
        # PostgreSQL: commits that tell the listeners here tell other processes too.
        self._change_channel = change_channel(namespace)
        self._origin = new_origin()
        self.change_listener: ChangeListener | None = None
        self.change_notifier = (
            ChangeNotifier(
                self._notify_change,
                self._change_channel,
                errors=(DBAPIError, OSError, StoreUnavailableError),
            )
            if target.backend == "postgresql"
            else None
        )
        self._change_listening: asyncio.Task[None] | None = None

    @property
    def backend(self) -> Backend:
        return self.target.backend

    @property
    def max_attempts(self) -> int:
        """Placements a work item gets before an eviction fails it (`store.max_attempts`)."""
        return self._context.max_attempts

    async def close(self) -> None:
        """Release leadership still held (so a replica can take over) and disconnect."""
        await self._submissions.drained()
        if self.change_notifier is not None:
            await self.change_notifier.close()
        if self._change_listening is not None:
            await stop_task(self._change_listening)
            self._change_listening = None
        for lease in list(self._leases):
            await lease.release()
        self._leases.clear()
        await self._engine.dispose()
        self._scrypt.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    def add_commit_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` after every write transaction this store commits; returns a
        function that removes it. Listeners must be quick and must not raise: they wake
        readers of the event log (SSE streams) instead of letting them poll. Commits made
        by other processes are seen only while `listen_for_changes` runs (PostgreSQL);
        readers still poll, only less often."""
        self._commit_listeners.append(listener)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._commit_listeners.remove(listener)

        return remove

    def listen_for_changes(self, *, connect_timeout_s: float = 10.0) -> None:
        """PostgreSQL: call the commit listeners when another process (a replica)
        committed, too, until `close()`; meanwhile the listening connection marks this
        process as a running replica, which a restore refuses to replace the store
        under. SQLite: nothing to listen to (no-op)."""
        if self.target.backend != "postgresql" or self._change_listening is not None:
            return
        self.change_listener = ChangeListener(
            listener_connector(self._engine, connect_timeout_s),
            self._change_channel,
            self._origin,
            self._tell_listeners,
            # A restore refuses the store while this replica runs (cloud/store/restore.py).
            replica_lock_key=advisory_key(self._namespace, "replica"),
        )
        self._change_listening = asyncio.create_task(
            self.change_listener.run(), name="store-change-listener"
        )

    def _committed(self) -> None:
        """After each commit that changes what the listeners watch."""
        self._tell_listeners()
        if self.change_notifier is not None:
            self.change_notifier.changed()  # other processes, once it is sent

    def _tell_listeners(self) -> None:
        for listener in tuple(self._commit_listeners):
            listener()

    async def _notify_change(self) -> None:
        with self._connection_errors():
            async with self._connected(self._autocommit) as connection:
                await notify_change(connection, self._change_channel, self._origin)

    @contextlib.asynccontextmanager
    async def _write(self, *, notify: bool = True) -> AsyncIterator[AsyncConnection]:
        """`notify`: tell the commit listeners (the scheduling loop, the event streams);
        accounting's own writes change nothing they watch."""
        # SQLite has one writer at a time anyway; queueing this process's writers here
        # (first come, first served) spares them SQLite's busy handler, which polls the
        # lock with sleeps of up to 100 ms. Other processes still meet the busy timeout.
        async with self._write_queue:
            with self._connection_errors():
                async with self._connected(self._writer) as connection, connection.begin():
                    yield connection
        if notify:
            self._committed()  # reached only when the transaction committed

    @contextlib.asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        with self._connection_errors():
            async with self._connected(self._engine) as connection:
                yield connection

    @contextlib.asynccontextmanager
    async def _connected(self, engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
        """A connection of `engine` (from its pool, or made now), closed after the block."""
        async with contextlib.AsyncExitStack() as stack:
            with self._connect_errors():
                connection = await stack.enter_async_context(engine.connect())
            yield connection

    @contextlib.contextmanager
    def _connect_errors(self) -> Iterator[None]:
        """Not getting a connection is `StoreUnavailableError`, whatever kept it: refused
        or timed out (a server restarting, a failover), a server starting up or shutting
        down, a database closed to connections, a SQLite file that cannot be opened, a
        pool whose connections are all taken for its whole wait (connects hanging in an
        outage). Nothing was read or written, and the next call connects again."""
        try:
            yield
        # OSError: TimeoutError too; SQLAlchemy's own TimeoutError: the pool's wait.
        except (DBAPIError, OSError, PoolTimeoutError) as error:
            raise StoreUnavailableError(
                f"cannot connect to {self.target.describe()}: {_driver_words(error)}; retry"
            ) from error

    @contextlib.contextmanager
    def _connection_errors(self) -> Iterator[None]:
        """A lost connection is `StoreUnavailableError`; SQLAlchemy has already dropped
        the pool's connections, so the next call connects afresh."""
        try:
            yield
        except DBAPIError as error:
            if not error.connection_invalidated:
                raise
            raise StoreUnavailableError(
                f"lost the connection to {self.target.describe()}; retry (a commit in "
                "flight may or may not have happened: retry submissions with their "
                "idempotency key)"
            ) from error

    # ---- tenants -----------------------------------------------------------------------

    async def create_tenant(
        self, tenant: NewTenant, *, audit: NewAudit | None = None
    ) -> CreatedTenant:
        """Raises `TenantExistsError` when the name is taken, ValueError on bad quotas."""
        now = self._clock()
        created_by = None if audit is None else audit.actor.name
        async with self._write() as connection:
            record, token = await insert_tenant(
                connection, self._ids.new_id(), tenant, now, created_by
            )
            if audit is not None:
                await insert_audit(connection, audit, now)
        self.tenant_changes += 1
        return CreatedTenant(record, token)

    async def update_tenant(
        self,
        tenant_id: str,
        changes: TenantChanges,
        *,
        audit: Callable[[TenantRecord, TenantRecord], NewAudit] | None = None,
    ) -> TenantRecord:
        """Change a tenant's quotas, caps, cohort or priority classes; the scheduling
        loop applies them from its next pass. Raises `TenantNotFoundError`, ValueError.
        `audit` makes the entry from the tenant before and after, as read under its row
        lock (a change committed a moment ago is the "before"), in the same transaction."""
        now = self._clock()
        async with self._write() as connection:
            before, after = await change_tenant(connection, tenant_id, changes)
            if audit is not None:
                await insert_audit(connection, audit(before, after), now)
        self._tokens.forget_tenant(tenant_id)  # its cached record is stale
        self.tenant_changes += 1
        return after

    async def bootstrap_admin(self, name: str = "admin") -> CreatedTenant | None:
        """Create the first admin tenant; None when one named `name` already exists."""
        try:
            return await self.create_tenant(NewTenant(name=name, admin=True))
        except TenantExistsError:
            return None

    async def get_tenant(self, tenant_id: str) -> TenantRecord | None:
        async with self._read() as connection:
            query = select(tenants).where(tenants.c.id == tenant_id)
            row = (await connection.execute(query)).first()
        return None if row is None else tenant_from_row(row)

    async def get_tenant_by_name(self, name: str) -> TenantRecord | None:
        async with self._read() as connection:
            row = (await connection.execute(select(tenants).where(tenants.c.name == name))).first()
        return None if row is None else tenant_from_row(row)

    async def list_tenants(self) -> tuple[TenantRecord, ...]:
        async with self._read() as connection:
            rows = await connection.execute(select(tenants).order_by(tenants.c.name))
            return tuple(tenant_from_row(row) for row in rows)

    # ---- bearer tokens (cloud/store/tenant_tokens.py) -----------------------------------

    async def check_token(self, token: str) -> TokenCheck:
        """What a bearer token is worth: `Authenticated` (its tenant), `TokenRefused`
        (ours and its secret right, but revoked or past its rotation overlap),
        `TokenThrottled` (its id has had as many scrypts lately as it may: ask again
        later), or None (malformed, unknown, wrong secret).

        One indexed lookup by the token id, then a constant-time scrypt check (off the
        event loop, within the id's `ScryptBudget`); verdicts are cached for
        `store.token_cache_s`, and a token's use is recorded (`last_used_at`) when it is
        verified afresh.
        """
        parsed = parse_token(token)
        if parsed is None:
            return None
        token_id, secret = parsed
        now = self._clock()
        verdict = self._tokens.get(token_id, token)
        if verdict is None:
            # Clients arriving together with a token the cache does not hold (every
            # client of a tenant when its entry expires) share one verification: a scrypt
            # each would cost them seconds of CPU.
            # Keyed by the cache's epoch too: a request after a revocation never joins a
            # verification that read the token's row before it.
            key = (token, self._tokens.epoch)
            verifying = self._verifying.get(key)
            if verifying is None:
                verifying = asyncio.ensure_future(self._verify_token(token_id, token, secret))
                self._verifying[key] = verifying
                verifying.add_done_callback(lambda _: self._verifying.pop(key, None))
            verdict = await asyncio.shield(verifying)
            if verdict is None or isinstance(verdict, TokenThrottled):
                return verdict
        if isinstance(verdict, Authenticated) and not verdict.token.works(now):
            return TokenRefused(verdict.token)  # its overlap ended while it was cached
        return verdict

    async def _verify_token(self, token_id: str, token: str, secret: str) -> TokenCheck:
        epoch = self._tokens.epoch  # a revocation from here on: not cached
        found = await self._authentication_row(token_id)
        if found is None:
            return None
        if not self._tokens.known_good(token_id, token):
            turn = self._scrypt_budget.claim(token_id)
            if isinstance(turn, TokenThrottled):
                return turn  # a flood of secrets for this id: ask again, unchecked
            if turn > 0:
                await asyncio.sleep(turn)  # the id's next turn
                # Read the row again: the token may have been revoked while it waited.
                epoch = self._tokens.epoch
                found = await self._authentication_row(token_id)
                if found is None:
                    return None
            secret_hash = found[0]
            loop = asyncio.get_running_loop()
            if not await loop.run_in_executor(self._scrypt, verify_secret, secret, secret_hash):
                return None
        _, record, tenant = found
        now = self._clock()
        verdict: Authenticated | TokenRefused
        if record.works(now):
            async with self._write(notify=False) as connection:
                await tenant_tokens.mark_used(connection, token_id, now)
            verdict = Authenticated(tenant, replace(record, last_used_at=now))
        else:
            verdict = TokenRefused(record)
        self._tokens.put(token_id, token, verdict, epoch)
        return verdict

    async def _authentication_row(
        self, token_id: str
    ) -> tuple[str, TokenRecord, TenantRecord] | None:
        async with self._read() as connection:
            return await tenant_tokens.select_for_authentication(connection, token_id)

    async def authenticate(self, token: str) -> TenantRecord | None:
        """The tenant of a token that works now, or None (see `check_token`)."""
        verdict = await self.check_token(token)
        return verdict.tenant if isinstance(verdict, Authenticated) else None

    async def create_token(
        self,
        tenant_id: str,
        name: str,
        *,
        created_by: str | None = None,
        audit: NewAudit | None = None,
    ) -> CreatedToken:
        """Another bearer token for the tenant; the reply holds the token itself, which
        is never stored. Raises `TenantNotFoundError`."""
        issued = await asyncio.to_thread(issue_token)
        now = self._clock()
        async with self._write() as connection:
            owner = select(tenants.c.id).where(tenants.c.id == tenant_id)
            if (await connection.execute(owner)).first() is None:
                raise TenantNotFoundError(tenant_id)
            record = await tenant_tokens.insert_token(
                connection, tenant_id, name, issued, now, created_by
            )
            if audit is not None:
                await insert_audit(connection, audit.created(record.token_id), now)
        return CreatedToken(record, issued.token)

    async def list_tokens(self, tenant_id: str | None) -> tuple[TokenRecord, ...]:
        """A tenant's tokens (every tenant's with None), oldest first; never a secret."""
        async with self._read() as connection:
            return await tenant_tokens.select_tokens(connection, tenant_id)

    async def get_token(self, token_id: str) -> TokenRecord | None:
        async with self._read() as connection:
            try:
                return await tenant_tokens.select_token(connection, token_id)
            except TokenNotFoundError:
                return None

    async def rotate_token(
        self,
        token_id: str,
        overlap_s: float,
        *,
        created_by: str | None = None,
        audit: NewAudit | None = None,
    ) -> RotatedToken:
        """A new token in place of an active one, under the same name; the old one
        works for `overlap_s` more seconds (0: refused at once), then is refused as
        rotated. Raises `TokenNotFoundError`, `TokenNotActiveError`."""
        if not overlap_s >= 0:
            raise ValueError("overlap_s must be >= 0")
        issued = await asyncio.to_thread(issue_token)
        now = self._clock()
        async with self._write() as connection:
            old = await tenant_tokens.select_token(connection, token_id, for_update=True)
            state = old.state(now)
            if state != "active":
                raise TokenNotActiveError(token_id, state)
            new = await tenant_tokens.insert_token(
                connection, old.tenant_id, old.name, issued, now, created_by
            )
            expires_at = now + overlap_s
            await tenant_tokens.mark_rotated(connection, token_id, new.token_id, now, expires_at)
            if audit is not None:
                await insert_audit(connection, audit, now)
        self._tokens.forget(token_id)
        rotated = replace(old, rotated_at=now, replaced_by=new.token_id, expires_at=expires_at)
        return RotatedToken(rotated, CreatedToken(new, issued.token))

    async def revoke_token(self, token_id: str, *, audit: NewAudit | None = None) -> TokenRecord:
        """Refuse the token from now on (in this process at once, in others within
        `store.token_cache_s`); revoking twice keeps the first time. Raises
        `TokenNotFoundError`, and `LastAdminTokenError` for an admin's last working token:
        one that works while no other of the tenant's will keep working."""
        now = self._clock()
        async with self._write() as connection:
            owner = (await tenant_tokens.select_token(connection, token_id)).tenant_id
            # The tenant's row first: two revocations of one tenant's tokens (two replicas,
            # two requests) then count its working tokens one after the other, never both
            # seeing the other's token still working (PostgreSQL reads committed rows).
            admin = await tenant_tokens.lock_tenant_tokens(connection, owner)
            record = await tenant_tokens.select_token(connection, token_id, for_update=True)
            if record.revoked_at is not None:
                return record
            if admin and record.works(now):
                # Only a token with no end counts: one rotated works only until its
                # overlap ends, and the admin would be locked out then.
                others = await tenant_tokens.select_tokens(connection, record.tenant_id)
                if not any(t.lasts(now) for t in others if t.token_id != token_id):
                    raise LastAdminTokenError(token_id)
            await tenant_tokens.mark_revoked(connection, token_id, now)
            if audit is not None:
                await insert_audit(connection, audit, now)
        self._tokens.forget(token_id)
        return replace(record, revoked_at=now)

    # ---- the audit log (cloud/store/audit.py) ---------------------------------------------

    async def record_audit(self, entry: NewAudit) -> None:
        """An audit entry of its own, for what was refused rather than done (a bulk
        destructive action without its confirmation); what is done is recorded with it."""
        async with self._write(notify=False) as connection:
            await insert_audit(connection, entry, self._clock())

    async def list_audit(self, query: AuditQuery) -> AuditPage:
        async with self._read() as connection:
            return await select_audit_page(connection, query)

    # ---- work: what the REST layer calls ----------------------------------------------

    async def submit_work(
        self,
        tenant_id: str,
        *,
        kind: WorkKind,
        spec: bytes,
        priority: PriorityClass,
        idempotency_key: str | None = None,
        dependencies: Sequence[NewDependency] = (),
    ) -> SubmitResult:
        """Insert pending work and commit; returns only once it is durable.

        With an `idempotency_key`, a retry returns the tenant's original work with
        `created=False` (atomically, also when the retries race each other). `spec` is
        the JSON object as the API received it; `dependencies` the jobs it waits for
        (the caller has checked they are the tenant's). Raises `TenantNotFoundError`.
        """
        check_json_object(spec, "spec")
        if idempotency_key is not None and not 0 < len(idempotency_key) <= _IDEMPOTENCY_KEY_MAX:
            raise ValueError(f"idempotency key must be 1..{_IDEMPOTENCY_KEY_MAX} characters")
        item = NewWork(
            work_id=self._ids.new_id(),
            tenant_id=tenant_id,
            kind=kind,
            spec=spec,
            priority=priority,
            idempotency_key=idempotency_key,
            dependencies=tuple(dependencies),
        )
        return await self._submissions.submit(item)

    async def _commit_submissions(self, group: Sequence[NewWork]) -> list[Submitted]:
        async with self._write() as connection:
            return await insert_work_group(connection, self._context, group)

    async def submit_array(
        self,
        tenant_id: str,
        array_id: str,
        *,
        tasks: Sequence[tuple[int, bytes]],
        priority: PriorityClass,
        idempotency_key: str | None = None,
        dependencies: Sequence[NewDependency] = (),
    ) -> SubmitResult:
        """Insert every task of a job array (index, spec) as pending training work in one
        transaction (cloud/store/job_arrays.py); the result is its first task. A retry
        with the `idempotency_key` gets the earlier first task (`created=False`). Raises
        `QueueFullError` when the tasks do not all fit in `max_queued`, and
        `TenantNotFoundError`."""
        for _, spec in tasks:
            check_json_object(spec, "spec")
        new = [
            NewArrayTask(
                index,
                NewWork(
                    work_id=self._ids.new_id(),
                    tenant_id=tenant_id,
                    kind="training",
                    spec=spec,
                    priority=priority,
                    idempotency_key=idempotency_key if position == 0 else None,
                    dependencies=tuple(dependencies),
                ),
            )
            for position, (index, spec) in enumerate(tasks)
        ]
        try:
            async with self._write() as connection:
                result = await insert_array(connection, self._context, tenant_id, array_id, new)
        except IntegrityError:
            if idempotency_key is None:
                raise
            # Another submission with the key committed first: it is the original.
            earlier = await self.work_by_idempotency_key(tenant_id, idempotency_key)
            if earlier is None:
                raise
            return SubmitResult(earlier, False)
        if isinstance(result, Exception):
            raise result
        return result

    async def array_tasks(
        self, tenant_id: str | None, array_id: str
    ) -> tuple[ArrayTaskRecord, ...]:
        """The tasks of the tenant's job array (`None`: any tenant's), by index."""
        async with self._read() as connection:
            return await select_array_tasks(connection, tenant_id, array_id)

    async def array_task_id(self, tenant_id: str | None, array_id: str, index: int) -> str | None:
        """The job id of one task of the tenant's job array (`None`: any tenant's)."""
        async with self._read() as connection:
            return await select_task_id(connection, tenant_id, array_id, index)

    async def cancel_many(
        self,
        tenant_id: str,
        records: Sequence[WorkRecord],
        *,
        reason: str,
        actor: str | None = None,
        audit: NewAudit | None = None,
    ) -> CommitResult:
        """Cancel the tenant's work as read (each at its version) in one transaction, as
        `cancel_work` does one item: all of them, or none (`VersionConflictError`)."""
        changes = tuple(
            StateWrite(
                work_id=record.work_id,
                to_state="cancelled",
                reason=reason,
                expected_version=record.version,
                actor=actor,
            )
            for record in records
        )
        async with self._write() as connection:
            if audit is not None:
                await insert_audit(connection, audit, self._clock())
            return await apply_changes(
                connection, self._context, Changes(state_changes=changes, tenant_id=tenant_id)
            )

    async def work_links(self, tenant_id: str, work_id: str) -> WorkLinks:
        """What the tenant's work waits for, and what waits for it."""
        async with self._read() as connection:
            return await dependencies_rows.select_links(connection, tenant_id, work_id)

    async def dependency_edges(
        self, tenant_id: str, work_ids: Sequence[str]
    ) -> dict[str, tuple[str, ...]]:
        """Per given id of the tenant's work: the job ids it waits for, in order."""
        async with self._read() as connection:
            return await dependencies_rows.select_edges(connection, tenant_id, work_ids)

    async def tenant_work(
        self, tenant_id: str, work_ids: Sequence[str]
    ) -> Mapping[str, WorkRecord]:
        """The tenant's work among `work_ids`, by id (another tenant's ids are absent)."""
        async with self._read() as connection:
            return await dependencies_rows.select_tenant_work(connection, tenant_id, work_ids)

    async def get_work(self, tenant_id: str, work_id: str) -> WorkRecord | None:
        """The tenant's work; another tenant's id is simply not found."""
        async with self._read() as connection:
            return await select_work(connection, work_id, tenant_id)

    async def work_by_idempotency_key(
        self, tenant_id: str, idempotency_key: str
    ) -> WorkRecord | None:
        """The tenant's work submitted with this key, if any (a retry's original)."""
        async with self._read() as connection:
            return await select_work_by_idempotency_key(connection, tenant_id, idempotency_key)

    async def work_matching(
        self,
        tenant_id: str | None,
        kind: WorkKind,
        *,
        name: str | None = None,
        id_prefix: str | None = None,
        active_only: bool = False,
        limit: int = 20,
    ) -> tuple[WorkRecord, ...]:
        """The tenant's work (`None`: every tenant's) of `kind` with this name or id
        prefix, newest first (cloud/store/work_lookup.py)."""
        async with self._read() as connection:
            return await select_work_matching(
                connection,
                tenant_id,
                kind,
                name=name,
                id_prefix=id_prefix,
                active_only=active_only,
                limit=limit,
            )

    async def live_work_named(
        self, tenant_id: str | None, kind: WorkKind, name: str, *, limit: int
    ) -> LiveNamed:
        """The tenant's live work (`None`: every tenant's) of `kind` with this name, each
        job array once (cloud/store/work_lookup.py)."""
        async with self._read() as connection:
            return await select_live_named(connection, tenant_id, kind, name, limit=limit)

    async def list_work(
        self,
        tenant_id: str | None,
        *,
        states: Sequence[WorkState] = (),
        kinds: Sequence[WorkKind] = (),
        priorities: Sequence[PriorityClass] = (),
        limit: int = 50,
        cursor: str | None = None,
    ) -> WorkPage:
        """Newest first; empty filters match everything; `cursor` from the previous page.
        `tenant_id=None`: every tenant's work (the admin's view)."""
        async with self._read() as connection:
            return await list_work_page(
                connection,
                tenant_id,
                states=states,
                kinds=kinds,
                priorities=priorities,
                limit=limit,
                cursor=cursor,
            )

    async def work_explanation(self, tenant_id: str, work_id: str) -> WorkExplanation | None:
        """The tenant's work with the scheduler's latest explanation of it
        (`PassWrite.explanations`); None when the tenant has no such work."""
        query = select(work).where(work.c.id == work_id, work.c.tenant_id == tenant_id)
        async with self._read() as connection:
            row = (await connection.execute(query)).first()
        if row is None:
            return None
        explained_at = None if row.explained_at is None else float(row.explained_at)
        return WorkExplanation(work_from_row(row), row.explanation, explained_at)

    async def work_with_allocations(
        self, tenant_id: str, work_id: str
    ) -> tuple[WorkRecord, tuple[AllocationRecord, ...]] | None:
        """The tenant's work and where it runs, as of one moment (a single read
        transaction: never a running job with the allocations of its next attempt)."""
        with self._connection_errors():
            async with self._connected(self._snapshot_reader) as connection, connection.begin():
                record = await select_work(connection, work_id, tenant_id)
                if record is None:
                    return None
                return record, await select_allocations(connection, work_id=work_id)

    async def work_allocations(self, tenant_id: str, work_id: str) -> tuple[AllocationRecord, ...]:
        """Where the tenant's work runs (empty for another tenant's id)."""
        async with self._read() as connection:
            if await select_work(connection, work_id, tenant_id) is None:
                return ()
            return await select_allocations(connection, work_id=work_id)

    async def cancel_work(
        self,
        tenant_id: str,
        work_id: str,
        *,
        reason: str = "cancelled by the tenant",
        expected_version: int | None = None,
        actor: str | None = None,
        audit: NewAudit | None = None,
    ) -> CommitResult:
        """Cancel the tenant's non-terminal work; its allocations end with it. `actor`
        (who asked, by name) is in the `work.state` event; `audit` is recorded with it.

        Raises `WorkNotFoundError` (also for another tenant's id) and
        `IllegalTransitionError` for work that already ended.
        """
        change = StateWrite(
            work_id=work_id,
            to_state="cancelled",
            reason=reason,
            expected_version=expected_version,
            actor=actor,
        )
        async with self._write() as connection:
            if audit is not None:
                # Before the change: its events must be the transaction's last statement.
                await insert_audit(connection, audit, self._clock())
            return await apply_changes(
                connection,
                self._context,
                Changes(state_changes=(change,), tenant_id=tenant_id),
            )

    async def set_hold(
        self,
        tenant_id: str,
        work_id: str,
        hold: HoldKind | None,
        *,
        reason: str,
        actor: str | None = None,
        expected_version: int | None = None,
        audit: NewAudit | None = None,
    ) -> WorkRecord:
        """Hold, suspend, release or resume the tenant's pending work
        (cloud/store/job_control.py)."""
        async with self._write() as connection:
            return await job_control.set_hold(
                connection, self._context, tenant_id, work_id, hold,
                reason=reason, actor=actor, expected_version=expected_version, audit=audit,
            )  # fmt: skip

    async def requeue_placed(
        self,
        tenant_id: str,
        work_id: str,
        *,
        reason: str,
        hold: HoldKind | None = None,
        actor: str | None = None,
        expected_version: int | None = None,
        audit: NewAudit | None = None,
    ) -> CommitResult:
        """A person's requeue (or suspend, with `hold`) of the tenant's placed work
        (cloud/store/job_control.py); never counted against `max_attempts`."""
        async with self._write() as connection:
            return await job_control.requeue_placed(
                connection, self._context, tenant_id, work_id, hold=hold,
                reason=reason, actor=actor, expected_version=expected_version, audit=audit,
            )  # fmt: skip

    async def update_queued(
        self,
        tenant_id: str,
        work_id: str,
        *,
        spec: bytes,
        priority: PriorityClass,
        changed_fields: Sequence[str],
        actor: str | None = None,
        expected_version: int | None = None,
        audit: NewAudit | None = None,
    ) -> WorkRecord:
        """A new spec and priority for the tenant's queued job (cloud/store/job_control.py)."""
        async with self._write() as connection:
            return await job_control.update_queued(
                connection, self._context, tenant_id, work_id, spec=spec, priority=priority,
                changed_fields=changed_fields, actor=actor,
                expected_version=expected_version, audit=audit,
            )  # fmt: skip

    # ---- models ------------------------------------------------------------------------

    async def create_model(self, tenant_id: str, model: NewModel) -> ModelRecord:
        """Record an uploaded model (its file is already stored under its sha256)."""
        async with self._write() as connection:
            return await insert_model(
                connection, self._ids.new_id(), tenant_id, model, self._clock()
            )

    async def get_model(self, tenant_id: str, model_id: str) -> ModelRecord | None:
        """The tenant's model; another tenant's id is simply not found."""
        async with self._read() as connection:
            return await select_model(connection, model_id, tenant_id)

    async def list_models(
        self, tenant_id: str, *, limit: int = 50, cursor: str | None = None
    ) -> ModelPage:
        async with self._read() as connection:
            return await list_model_page(connection, tenant_id, limit=limit, cursor=cursor)

    async def models_by_id(self, model_ids: Sequence[str]) -> dict[str, ModelRecord]:
        """Any tenant's models by id (the control plane's own view; unknown ids are absent)."""
        found: dict[str, ModelRecord] = {}
        async with self._read() as connection:
            for batch in chunks(sorted(set(model_ids))):
                rows = await connection.execute(select(models).where(models.c.id.in_(batch)))
                found.update((row.id, model_from_row(row)) for row in rows)
        return found

    async def shared_secret(self, name: str) -> str:
        """A random secret every replica of this database shares, made on first use."""
        async with self._write() as connection:
            statement = insert_ignoring(self.backend, secrets, ["name"]).values(
                name=name, value=secrets_module.token_urlsafe(32), created_at=self._clock()
            )
            await connection.execute(statement)
            query = select(secrets.c.value).where(secrets.c.name == name)
            return str((await connection.execute(query)).scalar_one())

    async def update_spec(
        self,
        tenant_id: str,
        work_id: str,
        spec: bytes,
        *,
        expected_version: int | None = None,
        audit: NewAudit | None = None,
    ) -> WorkRecord:
        """Replace the spec of the tenant's non-terminal work in place (say, a deployment's
        model): a new version, a `work.updated` event, and a generation bump of every
        node it runs on so they get the new desired state. The caller decides which
        changes are allowed without placing the work again. `audit` is recorded with it.

        Raises `WorkNotFoundError`, `IllegalTransitionError` (ended work) and
        `VersionConflictError`.
        """
        check_json_object(spec, "spec")
        async with self._write() as connection:
            record = await job_control.locked_work(connection, tenant_id, work_id)
            if record.state in TERMINAL_STATES:
                raise IllegalTransitionError(work_id, record.state, record.state)
            if expected_version is not None and record.version != expected_version:
                raise VersionConflictError([work_id])
            if audit is not None:
                await insert_audit(connection, audit, self._clock())
            now = self._clock()
            updated = replace(record, spec=spec, version=record.version + 1, updated_at=now)
            await connection.execute(
                update(work)
                .where(work.c.id == work_id)
                .values(spec=spec, version=updated.version, updated_at=now)
            )
            nodes = select(allocations.c.node_id).where(allocations.c.work_id == work_id)
            touched = set((await connection.execute(nodes.distinct())).scalars())
            await bump_generations(connection, self._context, touched)
            payload = encode_json({"work_id": work_id, "version": updated.version})
            await append_events(
                connection,
                self._context,
                [
                    event_row(
                        NewEvent(
                            kind="work.updated",
                            payload=payload,
                            tenant_id=tenant_id,
                            work_id=work_id,
                        ),
                        now,
                    )
                ],
                returning=False,
            )
        return updated

    # ---- node enrolment (cloud/store/enrolment.py) --------------------------------------

    async def create_join_token(
        self, new: NewJoinToken, *, audit: NewAudit | None = None
    ) -> CreatedJoinToken:
        """A new join token; the reply holds the token itself, which is never stored."""
        now = self._clock()
        async with self._write() as connection:
            created = await enrolment.insert_join_token(connection, self._ids.new_id(), new, now)
            if audit is not None:
                await insert_audit(connection, audit.created(created.record.token_id), now)
        return created

    async def list_join_tokens(self) -> tuple[JoinTokenRecord, ...]:
        async with self._read() as connection:
            return await enrolment.select_join_tokens(connection)

    async def revoke_join_token(
        self, token_id: str, *, audit: NewAudit | None = None
    ) -> JoinTokenRecord:
        """Raises `JoinTokenUnknownError`; revoking twice keeps the first time."""
        now = self._clock()
        async with self._write() as connection:
            record = await enrolment.mark_join_token_revoked(connection, token_id, now)
            if audit is not None:
                await insert_audit(connection, audit, now)
        return record

    async def join_token_is_redeemable(self, token: str) -> bool:
        """Whether the token would be accepted now, read without taking a write lock."""
        async with self._read() as connection:
            return await enrolment.select_redeemable(connection, token, self._clock())

    async def redeem_join_token(
        self,
        token: str,
        node_id: str,
        *,
        sealing_public_key: str | None = None,
        requested: NodeDefaults | None = None,
        key_proven: bool = False,
    ) -> Redemption:
        """Count one use of the token and enrol the node (pinning its sealing key, if
        given; fixing what it may be from the token and, where the token says nothing,
        what it `requested`), atomically; raises a `JoinTokenError` subclass (why it was
        refused) or `NodeAlreadyEnrolledError`. `key_proven`: the caller showed it holds
        the private half of `sealing_public_key` (what enrolling an enrolled id again
        takes)."""
        async with self._write() as connection:
            return await enrolment.redeem(
                connection,
                token,
                node_id,
                self._clock(),
                sealing_public_key,
                requested or NodeDefaults(),
                key_proven=key_proven,
            )

    async def enrolment_retry_after_s(self, address: str, budget: FailureBudget) -> float:
        """0 when `address` may have a join token refused once more, else how long until
        it may (the budget every replica shares)."""
        async with self._read() as connection:
            return await enrolment_failures.retry_after_s(
                connection, address, self._clock(), budget
            )

    async def record_enrolment_failure(self, address: str, budget: FailureBudget) -> None:
        async with self._write() as connection:
            await enrolment_failures.record_failure(
                connection, self.backend, address, self._clock(), budget
            )

    async def release_redemption(self, redemption: Redemption) -> None:
        """Undo `redeem_join_token` (the node's credentials could not be provisioned)."""
        async with self._write() as connection:
            await enrolment.release(connection, redemption)

    async def set_enrolled_username(self, node_id: str, username: str) -> None:
        async with self._write() as connection:
            await enrolment.set_username(connection, node_id, username)

    async def pin_sealing_key(self, node_id: str, sealing_public_key: str | None) -> bool:
        """Replace the sealing key an enrolled, unrevoked node is pinned to (a node that
        made a new key pair; `greenfed up`'s simulated nodes on a later run); False when
        no such node is enrolled."""
        async with self._write() as connection:
            return await enrolment.pin_sealing_key(connection, node_id, sealing_public_key)

    async def list_enrolled_nodes(self) -> tuple[EnrolledNodeRecord, ...]:
        """Every enrolled node id, revoked ones included (`revoked_at` set), by id."""
        async with self._read() as connection:
            return await enrolment.select_enrolled_nodes(connection)

    async def get_enrolled_node(self, node_id: str) -> EnrolledNodeRecord | None:
        async with self._read() as connection:
            return await enrolment.select_enrolled_node(connection, node_id)

    async def revoke_node(
        self, node_id: str, *, audit: NewAudit | None = None
    ) -> EnrolledNodeRecord:
        """Refuse the node id from now on, until it enrols again with a new token."""
        now = self._clock()
        async with self._write() as connection:
            record = await enrolment.mark_node_revoked(connection, self.backend, node_id, now)
            if audit is not None:
                await insert_audit(connection, audit, now)
        return record

    async def readmit_nodes(
        self,
        nodes: Sequence[EnrolledNodeRecord],
        audit: Callable[[EnrolledNodeRecord], NewAudit],
    ) -> list[EnrolledNodeRecord]:
        """Enrol nodes again as their certificates say they enrolled, in one transaction,
        each audited; those whose id the store knows (enrolled or revoked) are left as
        they are and not returned."""
        now = self._clock()
        async with self._write() as connection:
            readmitted = await enrolment.readmit(connection, self.backend, nodes)
            await insert_audits(connection, [audit(record) for record in readmitted], now)
        return readmitted

    # ---- clusters (cloud/store/clusters.py) ---------------------------------------------

    async def add_cluster(
        self, record: ClusterRecord, *, audit: NewAudit, max_clusters: int
    ) -> None:
        """Register a cluster (audited) unless `max_clusters` are; raises
        `ClusterExistsError`, `TooManyClustersError`."""
        async with self._write() as connection:
            if self.backend == "postgresql":
                # Every registration counts under this lock (SQLite: its one writer).
                await connection.execute(select(func.pg_advisory_xact_lock(self._clusters_key)))
            await clusters.insert_cluster(connection, record, max_clusters=max_clusters)
            await insert_audit(connection, audit, record.created_at)

    async def list_clusters(self) -> tuple[ClusterRecord, ...]:
        async with self._read() as connection:
            return await clusters.select_clusters(connection)

    async def claim_cluster_submission(self, cluster: str, work_id: str, attempt: int) -> bool:
        """Record, before a cluster is asked to run it, that an attempt is submitted
        there; False where it was already (by this process, an earlier one or another
        replica): it is never submitted again (cloud/clusters/bridge.py)."""
        async with self._write(notify=False) as connection:
            return await clusters.claim_submission(
                connection, self.backend, cluster, work_id, attempt, self._clock()
            )

    async def remove_cluster(self, name: str, *, audit: NewAudit) -> ClusterRecord:
        """Forget a cluster (audited); raises `ClusterNotFoundError`."""
        async with self._write() as connection:
            record = await clusters.delete_cluster(connection, name)
            await insert_audit(connection, audit, self._clock())
        return record

    # ---- agent packages and rollouts (cloud/store/agent_upgrades.py) -------------------

    async def add_agent_package(
        self, record: AgentPackageRecord, content: bytes, *, audit: NewAudit
    ) -> None:
        """Publish an agent version (audited); raises `AgentPackageExistsError`."""
        async with self._write(notify=False) as connection:
            await agent_upgrades.insert_package(connection, record, content)
            await insert_audit(connection, audit, record.published_at)

    async def list_agent_packages(self) -> tuple[AgentPackageRecord, ...]:
        async with self._read() as connection:
            return await agent_upgrades.select_packages(connection)

    async def agent_package(self, version: str) -> AgentPackageRecord | None:
        async with self._read() as connection:
            return await agent_upgrades.select_package(connection, version)

    async def agent_package_content(self, version: str) -> bytes | None:
        async with self._read() as connection:
            return await agent_upgrades.select_package_content(connection, version)

    async def add_agent_rollout(self, record: AgentRolloutRecord, *, audit: NewAudit) -> None:
        """Start a rollout (audited; the loop takes it from here); raises
        `AgentRolloutRunningError` while another runs."""
        async with self._write() as connection:
            await agent_upgrades.insert_rollout(connection, record)
            await insert_audit(connection, audit, record.created_at)

    async def save_agent_rollout(
        self,
        rollout_id: str,
        phase: RolloutPhase,
        state: RolloutState,
        *,
        from_phase: RolloutPhase,
        audit: NewAudit | None = None,
    ) -> bool:
        """The loop's progress (nobody is told: it made it), or an admin's cancel (audited,
        the loop is woken); only if the rollout is still in `from_phase`, the phase it
        was read in: False (and nothing written) once another writer changed it."""
        async with self._write(notify=audit is not None) as connection:
            saved = await agent_upgrades.update_rollout(
                connection, rollout_id, phase, state, from_phase=from_phase
            )
            if saved and audit is not None:
                await insert_audit(connection, audit, self._clock())
        return saved

    async def list_agent_rollouts(self, *, limit: int = 50) -> tuple[AgentRolloutRecord, ...]:
        async with self._read() as connection:
            return await agent_upgrades.select_rollouts(connection, limit=limit)

    async def latest_agent_rollout_head(self) -> tuple[str, str] | None:
        """(rollout id, phase) of the latest rollout: what the loop checks each pass."""
        async with self._read() as connection:
            return await agent_upgrades.select_latest_rollout_head(connection)

    async def agent_rollout(self, rollout_id: str) -> AgentRolloutRecord | None:
        async with self._read() as connection:
            return await agent_upgrades.select_rollout(connection, rollout_id)

    async def is_enrolled(self, node_id: str) -> bool:
        """Enrolled and not revoked."""
        node = await self.get_enrolled_node(node_id)
        return node is not None and node.active

    # ---- node administration (cloud/store/node_admin.py) ----------------------------------

    async def put_node_admin(
        self, record: NodeAdminRecord, *, audit: NewAudit | None = None
    ) -> NodeAdminRecord:
        """Replace what an admin set on one node; the record as stored (its time set).
        A change of some fields, where others may change at once: `change_node_admin`."""
        stored = replace(record, updated_at=self._clock())
        async with self._write() as connection:
            await node_admin.put_node_admin(connection, self.backend, stored)
            if audit is not None:
                await insert_audit(connection, audit, stored.updated_at)
        return stored

    async def change_node_admin(
        self,
        node_id: str,
        changes: NodeAdminChanges,
        *,
        audit: Callable[[NodeAdminRecord], NewAudit] | None = None,
    ) -> NodeAdminRecord:
        """Change what an admin set on one node, read and written under its row lock (a
        concurrent change is kept, never overwritten); the record as stored. `audit`
        makes the entry from that record, recorded in the same transaction."""
        now = self._clock()
        async with self._write() as connection:
            stored = await node_admin.change_node_admin(
                connection, self.backend, node_id, changes, now
            )
            if audit is not None:
                await insert_audit(connection, audit(stored), now)
        return stored

    async def set_first_claims(self, claims: Mapping[str, NodeClaim]) -> None:
        """Approve each node as its first birth claims, where nothing is approved yet."""
        if not claims:
            return
        async with self._write() as connection:
            await node_admin.set_first_claims(connection, self.backend, claims, self._clock())

    async def node_admin(self) -> dict[str, NodeAdminRecord]:
        async with self._read() as connection:
            return await node_admin.select_node_admin(connection)

    async def drain_waiting(self) -> dict[str, tuple[str, ...]]:
        """Why draining nodes' drains wait, as the leader's latest pass that changed it
        stored it (`PassWrite.drain_waiting`)."""
        async with self._read() as connection:
            return await select_drain_waiting(connection)

    # ---- live accounting (cloud/store/usage.py) -----------------------------------------

    async def write_usage(self, write: UsageWrite, *, lease: LeadershipLease) -> list[UsageHour]:
        """One accounting flush as one transaction, under the scheduling lease (raises
        `LeadershipLostError`): usage added, marks moved, counterfactuals and events
        recorded together. Returns the rows as added (`usage.add_usage`)."""
        self._check_lease_is_ours(lease)
        if isinstance(lease, PostgresLease):
            async with lease.transaction() as connection:
                added = await self._apply_usage(connection, write)
        else:
            await lease.check()
            async with self._write(notify=False) as connection:
                added = await self._apply_usage(connection, write)
        if write.events:
            self._committed()
        return added

    async def _apply_usage(self, connection: AsyncConnection, write: UsageWrite) -> list[UsageHour]:
        now = self._clock()
        backend = self.backend
        added = await usage.add_usage(connection, backend, write.rows, now)
        await usage.put_marks(connection, backend, write.marks)
        await usage.delete_marks(connection, write.departed)
        await usage.put_counterfactuals(connection, backend, write.counterfactuals)
        if write.events:
            rows = [event_row(event, now) for event in write.events]
            await append_events(connection, self._context, rows, returning=False)
        return added

    async def usage_marks(self) -> dict[str, UsageMark]:
        async with self._read() as connection:
            return await usage.select_marks(connection)

    async def counterfactuals(self, work_ids: Sequence[str]) -> dict[str, CounterfactualRecord]:
        async with self._read() as connection:
            return await usage.select_counterfactuals(connection, work_ids)

    async def untold_work(self, since_s: float, told_event_id_prefix: str) -> dict[str, str]:
        """Work id -> tenant id of work with usage since `since_s` whose final figures
        were not told (`usage.select_untold_work`)."""
        async with self._read() as connection:
            return await usage.select_untold_work(connection, since_s, told_event_id_prefix)

    async def usage(self, query: UsageQuery) -> list[UsageHour]:
        async with self._read() as connection:
            return await usage.select_usage(connection, query)

    async def usage_totals(self) -> list[UsageTotal]:
        async with self._read() as connection:
            return await usage.select_totals(connection)

    # ---- fair share (cloud/store/fair_share.py) ----------------------------------------

    async def fair_share_usage(self) -> dict[str, FairShareRow]:
        async with self._read() as connection:
            return await fair_share.select_fair_share(connection)

    async def put_fair_share_usage(self, rows: list[FairShareRow]) -> None:
        async with self._write(notify=False) as connection:
            await fair_share.put_fair_share(connection, self.backend, rows)

    async def held_by_tenant(self) -> dict[str, dict[str, int]]:
        async with self._read() as connection:
            return await fair_share.select_held(connection)

    # ---- events ------------------------------------------------------------------------

    async def list_events(
        self,
        *,
        tenant_id: str | None,
        after_seq: int = 0,
        limit: int = 100,
        work_id: str | None = None,
    ) -> tuple[EventRecord, ...]:
        """Events after `after_seq` (the SSE `Last-Event-ID`), oldest first; `work_id`:
        that work's only.

        `tenant_id=None` reads every tenant's events (the control plane itself).
        """
        query = select(events).where(events.c.seq > after_seq)
        if tenant_id is not None:
            query = query.where(events.c.tenant_id == tenant_id)
        if work_id is not None:
            query = query.where(events.c.work_id == work_id)
        query = query.order_by(events.c.seq).limit(limit)
        async with self._read() as connection:
            return tuple(event_from_row(row) for row in await connection.execute(query))

    async def latest_event(self, work_id: str, kind: str) -> EventRecord | None:
        """The newest event of `kind` about one work item (say, its last scaling)."""
        query = (
            select(events)
            .where(events.c.work_id == work_id, events.c.kind == kind)
            .order_by(events.c.seq.desc())
            .limit(1)
        )
        async with self._read() as connection:
            row = (await connection.execute(query)).first()
        return None if row is None else event_from_row(row)

    async def last_event_seq(self, *, before: float | None = None) -> int:
        """The newest sequence number (0 when the log is empty): where a new stream starts;
        `before` (epoch seconds): of the events recorded before then (where a stream of
        the events since then starts)."""
        query = select(func.max(events.c.seq))
        if before is not None:
            query = query.where(events.c.at < before)
        async with self._read() as connection:
            value = (await connection.execute(query)).scalar()
        return int(value or 0)

    async def record_event(self, event: NewEvent) -> EventRecord | None:
        """Append one event; None when its `event_id` was recorded before (a resend)."""
        row = event_row(event, self._clock())
        async with self._write() as connection:
            appended = await append_events(connection, self._context, [row])
        if not appended:
            return None
        return EventRecord(
            seq=appended[0].seq,
            tenant_id=event.tenant_id,
            work_id=event.work_id,
            kind=event.kind,
            payload=event.payload,
            at=appended[0].at,
            event_id=event.event_id,
        )

    # ---- the scheduling loop -----------------------------------------------------------

    async def find_work(self, work_id: str) -> WorkRecord | None:
        """Any tenant's work (the control plane's own view)."""
        async with self._read() as connection:
            return await select_work(connection, work_id, None)

    async def load_snapshot(self, previous: StoreSnapshot | None = None) -> StoreSnapshot:
        """Tenants, non-terminal work, allocations and generations in one consistent read.

        With `previous` (the caller's last snapshot), work records whose version has not
        moved are reused instead of read again: the same result, at a fraction of the
        cost when thousands of items are queued.
        """
        with self._connection_errors():
            async with self._connected(self._snapshot_reader) as connection, connection.begin():
                tenant_rows = await connection.execute(select(tenants).order_by(tenants.c.name))
                tenant_records = tuple(tenant_from_row(row) for row in tenant_rows)
                work_records = await select_active_work(
                    connection, () if previous is None else previous.work
                )
                allocation_records = await select_allocations(connection)
                generation_rows = await connection.execute(select(node_generations))
                generations = {row.node_id: int(row.generation) for row in generation_rows}
                waiting = await dependencies_rows.select_waiting(connection)
        return StoreSnapshot(
            tenant_records, work_records, allocation_records, generations, dependencies=waiting
        )

    async def placed_attempts(self) -> tuple[tuple[AllocationRecord, ...], dict[str, int]]:
        """Every allocation and the attempt its work is on, in one consistent read: who
        runs what (cloud/fleet/assignments.py), without reading the whole queue."""
        with self._connection_errors():
            async with self._connected(self._snapshot_reader) as connection, connection.begin():
                allocation_records = await select_allocations(connection)
                placed = select(allocations.c.work_id)
                query = select(work.c.id, work.c.attempts).where(work.c.id.in_(placed))
                attempts = {
                    str(row.id): int(row.attempts) for row in await connection.execute(query)
                }
        return allocation_records, attempts

    async def commit_pass(self, write: PassWrite, *, lease: LeadershipLease) -> CommitResult:
        """Apply a scheduling pass as one transaction: all of it, or (raising) none of it.

        Evictions requeue (bounded by `store.max_attempts`, then failed), state changes
        follow the state machine, placements replace each work's allocations, and every
        node whose allocations changed gets its generation bumped. Raises
        `VersionConflictError` when work changed since the snapshot (plan again),
        `IllegalTransitionError`, `WorkNotFoundError`, `LeadershipLostError`.
        """
        changes = Changes(
            evictions=write.evictions,
            state_changes=write.state_changes,
            placements=write.placements,
            pending_reasons=write.pending_reasons,
            events=write.events,
            explanations=write.explanations,
            drain_waiting=write.drain_waiting,
        )
        self._check_lease_is_ours(lease)
        if isinstance(lease, PostgresLease):
            async with lease.transaction() as connection:
                result = await apply_changes(connection, self._context, changes)
            self._committed()
            return result
        await lease.check()
        async with self._write() as connection:
            return await apply_changes(connection, self._context, changes)

    async def transition(
        self,
        work_id: str,
        to_state: WorkState,
        *,
        reason: str | None = None,
        expected_version: int | None = None,
        event_id: str | None = None,
    ) -> CommitResult:
        """One state change (an agent's report, a failure); `event_id` applies it at most
        once: a resent agent event returns `duplicate=True` and changes nothing."""
        change = StateWrite(
            work_id=work_id, to_state=to_state, reason=reason, expected_version=expected_version
        )
        async with self._write() as connection:
            return await apply_changes(
                connection,
                self._context,
                Changes(state_changes=(change,), source_event_id=event_id),
            )

    async def requeue(
        self,
        work_id: str,
        reason: str,
        *,
        expected_version: int | None = None,
        event_id: str | None = None,
    ) -> CommitResult:
        """Preempted or node-lost work back to pending, or failed once its attempts
        (`store.max_attempts`) are used up; its allocations end."""
        eviction = EvictionWrite(work_id=work_id, reason=reason, expected_version=expected_version)
        async with self._write() as connection:
            return await apply_changes(
                connection,
                self._context,
                Changes(evictions=(eviction,), source_event_id=event_id),
            )

    async def set_allocation_states(
        self, changes: Sequence[tuple[str, int, AllocationState]]
    ) -> None:
        """Several members' reported states in one transaction; members whose work ended
        in the meantime are skipped (their allocations are gone)."""
        if not changes:
            return
        async with self._write() as connection:
            await connection.execute(
                update(allocations)
                .where(
                    allocations.c.work_id == bindparam("b_work_id"),
                    allocations.c.member_index == bindparam("b_member"),
                )
                .values(state=bindparam("b_state")),
                [
                    {"b_work_id": work_id, "b_member": member, "b_state": state}
                    for work_id, member, state in changes
                ],
            )

    async def desired_state(self, node_id: str) -> NodeDesired:
        """What to publish as the node's `desired` document, with its generation."""
        async with self._read() as connection, connection.begin():
            records = await select_allocations(connection, node_id=node_id)
            query = select(node_generations.c.generation).where(
                node_generations.c.node_id == node_id
            )
            generation = (await connection.execute(query)).scalar()
        return NodeDesired(node_id, int(generation or 0), records)

    async def node_generations(self) -> Mapping[str, int]:
        async with self._read() as connection:
            rows = await connection.execute(select(node_generations))
            return {row.node_id: int(row.generation) for row in rows}

    async def raise_generations(
        self, floors: Mapping[str, int], *, lease: LeadershipLease
    ) -> dict[str, int]:
        """Raise nodes' desired-state generations to at least `floors` (the loop does, for
        nodes whose agents applied more than this store holds: a store restored from a
        backup, cloud/loop/generations.py); the nodes raised, with their new generation.
        Under the scheduling lease, like `commit_pass`; raises `LeadershipLostError`."""
        if not floors:
            return {}
        self._check_lease_is_ours(lease)
        if isinstance(lease, PostgresLease):
            async with lease.transaction() as connection:
                raised = await raise_generations(connection, self._context, floors)
            self._committed()
            return raised
        await lease.check()
        async with self._write() as connection:
            return await raise_generations(connection, self._context, floors)

    # ---- leadership --------------------------------------------------------------------

    async def try_acquire_leadership(self) -> LeadershipLease | None:
        """Become the scheduling leader if nobody is; None when another process leads.
        Raises `StoreUnavailableError` when the database cannot be asked (PostgreSQL)."""
        lease: LeadershipLease | None
        if self.target.backend == "postgresql":
            with self._connection_errors():
                with self._connect_errors():
                    connection = await self._engine.connect()
                lease = await try_acquire_postgres(connection, self._leader_key)
        else:
            assert self.target.sqlite_path is not None
            lease = try_acquire_sqlite(self.target.sqlite_path)
        self._leases = {held for held in self._leases if held.held}
        if lease is not None:
            self._leases.add(lease)
        return lease

    def _check_lease_is_ours(self, lease: LeadershipLease) -> None:
        if isinstance(lease, PostgresLease) and lease.key == self._leader_key:
            return
        if (
            isinstance(lease, SqliteLease)
            and self.target.sqlite_path is not None
            and lease.path == leader_lock_path(self.target.sqlite_path)
        ):
            return
        raise LeadershipLostError("the lease given to commit_pass leads another database")

    @contextlib.asynccontextmanager
    async def leadership(
        self, *, poll_interval_s: float | None = None
    ) -> AsyncIterator[LeadershipLease]:
        """Wait until this process leads (polling), hold it for the block, then hand it on.
        A database that cannot be reached (restarting, failing over) leads nobody here:
        the poll goes on, and takes the lock once the database is back."""
        interval = poll_interval_s or self._settings.leader_poll_interval_s
        while True:
            try:
                lease = await self.try_acquire_leadership()
            except StoreUnavailableError as error:
                _log.warning("leadership poll failed: store unavailable", error=str(error))
                lease = None
            if lease is not None:
                break
            # Polling: the lock lives in the database or the kernel, nothing to wait on here.
            await asyncio.sleep(interval)
        async with lease:
            yield lease
