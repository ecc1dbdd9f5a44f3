"""One reader of the store's event log per process, fanned out to every event stream.

`GET /v1/events` streams a tenant's events. Rather than every open stream polling the
database, `EventHub.run` reads the log once for all of them: at least every
`poll_interval_s` (commits of other replicas), and at once when this process commits
(the store's commit listener rings `wake`), at most once per `min_interval_s`. While
no stream is open it only moves to the end of the log, once per `poll_interval_s`.

A stream subscribes first, then catches up from the store from its `Last-Event-ID`,
then takes what the hub hands it, skipping what it already sent. Sequence numbers are
assigned in commit order (docs/store.md), so that order is complete: every event after
the stream's position is either read by the catch-up or dispatched to it afterwards.
A stream that falls behind by more than `queue_limit` events loses its queue and
catches up from the store again, so a slow client costs a bounded amount of memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterator

import structlog

from cloud.store import EventRecord, Store, StoreError

# The subscription key of a stream of every tenant's events (the admin's).
EVERY_TENANT = "*"


class Subscription:
    """What the hub dispatched to one stream since it subscribed (bounded)."""

    def __init__(
        self, tenant_id: str, queue_limit: int, on_overflow: Callable[[], None] | None = None
    ) -> None:
        self.tenant_id = tenant_id
        self._on_overflow = on_overflow
        self._queue: deque[EventRecord] = deque()
        self._queue_limit = queue_limit
        self._ready = asyncio.Event()
        self.overflowed = False
        self.closed = False

    def _put(self, event: EventRecord) -> None:
        if self.overflowed:
            return
        if len(self._queue) >= self._queue_limit:
            # Too slow to keep up: forget the queue; the stream re-reads from the store.
            self._queue.clear()
            self.overflowed = True
            if self._on_overflow is not None:
                self._on_overflow()
        else:
            self._queue.append(event)
        self._ready.set()

    def _close(self) -> None:
        self.closed = True
        self._ready.set()

    def reset(self) -> None:
        """After an overflow: the stream is about to catch up from the store again."""
        self.overflowed = False

    async def take(self, timeout_s: float) -> list[EventRecord] | None:
        """Everything queued (possibly nothing, on overflow or close); None on timeout."""
        if not self._queue and not self.overflowed and not self.closed:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._ready.wait()
            except TimeoutError:
                return None
        self._ready.clear()
        events = list(self._queue)
        self._queue.clear()
        return events


class EventHub:
    def __init__(
        self,
        store: Store,
        *,
        poll_interval_s: float = 1.0,
        min_interval_s: float = 0.02,
        page_size: int = 500,
        queue_limit: int = 1000,
    ) -> None:
        self._store = store
        self._poll_interval_s = poll_interval_s
        self._min_interval_s = min_interval_s
        self._page_size = page_size
        self._queue_limit = queue_limit
        self._bell = asyncio.Event()
        self._subscriptions: dict[str, set[Subscription]] = {}
        self._log = structlog.get_logger("greenfed.events")
        self.position = 0  # the last sequence number dispatched
        self.closed = False
        self.overflows = 0  # streams that fell behind and re-read from the store

    def wake(self) -> None:
        """Something was committed in this process: read the log now (store listener).
        With no stream open, nothing is waiting for it: the hub keeps to its poll."""
        if self._subscriptions:
            self._bell.set()

    async def start(self) -> None:
        """Begin at the end of the log: streams catch up from the store themselves."""
        self.position = await self._store.last_event_seq()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_interval_s):
                    await self._bell.wait()
            self._bell.clear()
            started = loop.time()
            try:
                await self._read_new()
            except StoreError as error:  # e.g. the database restarting: try again soon
                self._log.warning("reading the event log failed", error=str(error))
            # Commits in a burst: one read for all of them.
            await asyncio.sleep(max(0.0, self._min_interval_s - (loop.time() - started)))

    async def _read_new(self) -> None:
        if not self._subscriptions:
            # No stream to hand anything to: move to the end of the log without reading
            # it (thousands of submissions a second each append an event), once per poll.
            # A stream that subscribes after this reads everything up to here in its own
            # catch-up; one that subscribed meanwhile gets the log read from where the
            # hub was (at most a poll interval behind).
            last_seq = await self._store.last_event_seq()
            if not self._subscriptions:
                self.position = max(self.position, last_seq)
                return
        while True:
            page = await self._store.list_events(
                tenant_id=None, after_seq=self.position, limit=self._page_size
            )
            every = self._subscriptions.get(EVERY_TENANT, ())
            for event in page:
                for subscription in self._subscriptions.get(event.tenant_id or "", ()):
                    subscription._put(event)
                for subscription in every:
                    subscription._put(event)
                self.position = event.seq
            if len(page) < self._page_size:
                return

    @contextlib.contextmanager
    def subscribe(self, tenant_id: str | None) -> Iterator[Subscription]:
        """A tenant's events; None: every tenant's (and the control plane's own)."""
        tenant_id = EVERY_TENANT if tenant_id is None else tenant_id
        subscription = Subscription(tenant_id, self._queue_limit, self._count_overflow)
        if self.closed:
            subscription._close()
        self._subscriptions.setdefault(tenant_id, set()).add(subscription)
        self._bell.set()  # the first stream after a quiet spell: read from where the hub is
        try:
            yield subscription
        finally:
            subscribers = self._subscriptions.get(tenant_id)
            if subscribers is not None:
                subscribers.discard(subscription)
                if not subscribers:
                    del self._subscriptions[tenant_id]

    def _count_overflow(self) -> None:
        self.overflows += 1

    @property
    def subscribers(self) -> int:
        return sum(len(subscribers) for subscribers in self._subscriptions.values())

    def close(self) -> None:
        """The app is stopping: end every stream."""
        self.closed = True
        for subscribers in self._subscriptions.values():
            for subscription in subscribers:
                subscription._close()
