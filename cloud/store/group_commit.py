"""Group commit: submissions that arrive together share one transaction.

A submission is acknowledged only once committed, and a commit costs round trips, a
flush of the database's log and, on PostgreSQL, the lock that orders the event log
(cloud/store/sql.py `append_events`): one transaction per submission spends that on
every one, and the submissions queue behind each other's locks. Here the first
submission is committed at once, alone; those that arrive while a commit is in flight
wait for it to end and then go together, in one transaction (at most `max_group`
each). Nobody waits for a timer, so a lone client sees no added latency, and the
busier the store, the bigger the groups.

Each submission still gets its own answer (its work, an earlier one for a retry, or
its own refusal), and none is answered before the transaction holding it committed.
When a group's transaction fails as a whole, its submissions are tried again one
transaction each, so that one bad submission cannot fail the others.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import structlog

from cloud.store.errors import QueueFullError, StoreUnavailableError, TenantNotFoundError
from cloud.store.records import SubmitResult
from cloud.store.work import NewWork, Submitted

MAX_GROUP: Final = 256

CommitGroup = Callable[[Sequence[NewWork]], Awaitable[list[Submitted]]]


class GroupCommit:
    def __init__(self, commit: CommitGroup, *, max_group: int = MAX_GROUP) -> None:
        """`commit`: inserts a group in one transaction and commits it."""
        self._commit = commit
        self._max_group = max_group
        self._waiting: list[tuple[NewWork, asyncio.Future[Submitted]]] = []
        self._committer: asyncio.Task[None] | None = None
        self._log = structlog.get_logger("greenfed.store")
        self.groups = 0  # transactions committed (tests and benchmarks read them)

    async def submit(self, item: NewWork) -> SubmitResult:
        """Commit `item` with whatever arrives alongside; raises `QueueFullError`,
        `TenantNotFoundError`, or what the transaction raised."""
        future: asyncio.Future[Submitted] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._drain(), name="group-commit")
        result = await future
        if isinstance(result, QueueFullError | TenantNotFoundError):
            raise result
        return result

    async def drained(self) -> None:
        """Wait until every submission handed in so far was answered."""
        if self._committer is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(self._committer)

    async def _drain(self) -> None:
        while self._waiting:
            group = self._waiting[: self._max_group]
            del self._waiting[: self._max_group]
            await self._commit_group(group)

    async def _commit_group(self, group: list[tuple[NewWork, asyncio.Future[Submitted]]]) -> None:
        try:
            results = await self._commit([item for item, _ in group])
        except StoreUnavailableError as error:
            for _, future in group:
                _answer(future, error=error)
            return
        except Exception as error:
            if len(group) == 1:
                _answer(group[0][1], error=error)
                return
            self._log.warning(
                "group commit failed; committing its submissions one by one",
                submissions=len(group),
                error=str(error),
            )
            for one in group:
                await self._commit_group([one])
            return
        self.groups += 1
        for (_, future), result in zip(group, results, strict=True):
            _answer(future, result=result)


def _answer(
    future: asyncio.Future[Submitted],
    *,
    result: Submitted | None = None,
    error: BaseException | None = None,
) -> None:
    if future.done():  # its caller was cancelled: the outcome stands in the store
        return
    if error is not None:
        future.set_exception(error)
    else:
        assert result is not None
        future.set_result(result)
