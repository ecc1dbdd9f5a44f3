"""Where a model is fetched at the edge, into the agent's model cache:
`<dir>/<sha256>.onnx`, bounded in bytes, least recently used first out.

A download is streamed into `<sha256>.part`, resumed from where a broken transfer
stopped (an HTTP Range request), retried with backoff (the count of failed attempts
starts again after one that added bytes: a slow or flaky link that makes progress is
never given up on, however long the model takes), verified against the sha256
the cloud announced, flushed to disk and only then renamed into place; the `.part` of
a fetch that gives up is deleted. A resumed download that fails its checksum is
downloaded once more from its first byte, since the bytes kept from before may be the
damaged ones (written but not on disk before a power cut). A cached file is verified
again (size, sha256) the first time each agent process uses it, since a power cut or a
bad disk can still damage it; a damaged one is deleted and downloaded again. The bound
counts `.part` files too. Files a running deployment uses, and downloads under way, are
never evicted: the runtime pins a model (`pin`, `unpin`) while a replica loads or serves
it, and eviction asks for the pins as it deletes, not as they were when the download
that evicts began (a deployment that arrived meanwhile would lose its file).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import aiohttp

from edge.atomic_files import sync_to_disk
from shared.file_digests import file_sha256
from shared.lean_logs import get_logger

_CHUNK_BYTES = 1 << 20
# A control plane that restarts or a link that drops is waited out (about two
# minutes of attempts that add no byte); a refusal (bad signature, unknown model) or a
# wrong file is not.
ATTEMPTS = 8
RETRY_BASE_S = 0.5
RETRY_MAX_S = 30.0
# How long a connection may take to open, or a transfer may go without a byte, before
# the attempt counts as failed. A transfer that keeps going has no time limit: a model
# of gigabytes over a slow uplink takes hours.
STALL_TIMEOUT_S = 30.0


class ModelFetchError(RuntimeError):
    """The model could not be fetched or is not the announced file; says why."""


class _ChecksumMismatch(ModelFetchError):
    """The downloaded file is not the model the registry announced."""


class ModelUnreachable(ModelFetchError):
    """Every attempt failed for a reason that may pass (the control plane unreachable,
    restarting or busy): worth fetching again later, unlike a refusal or a wrong file."""


class _Retryable(Exception):
    """A failure worth another attempt (the control plane answered 5xx)."""


class ModelCache:
    def __init__(
        self,
        directory: Path,
        max_bytes: int,
        *,
        timeout_s: float = STALL_TIMEOUT_S,
        attempts: int = ATTEMPTS,
        retry_base_s: float = RETRY_BASE_S,
    ) -> None:
        """`timeout_s`: the longest wait for a connection, or for the next bytes of a
        transfer (never for a whole transfer). `attempts`: how many failed ones in a row,
        none of them adding a byte, before a fetch gives up."""
        self.directory = directory
        self.max_bytes = max_bytes
        self._attempts = attempts
        self._retry_base_s = retry_base_s
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout_s, sock_connect=timeout_s, sock_read=timeout_s
        )
        self._locks: dict[str, asyncio.Lock] = {}
        self._fetching: set[str] = set()  # sha256s whose fetch is under way: never evicted
        # Models in use (served or being loaded), each pin counted: never evicted. The
        # lock makes "not pinned, so delete it" one step for eviction, which runs in a
        # thread: a model pinned meanwhile is found cached and then opened, never deleted
        # in between.
        self._pins: Counter[str] = Counter()
        self._pins_lock = threading.Lock()
        # Files this process checked against their sha256, as they were then: not hashed
        # again on each load, unless the file has changed since.
        self._verified: dict[str, _Fingerprint] = {}
        self._log = get_logger("greenfed.inference.cache")
        self.downloads = 0
        self.resumed = 0

    def path(self, sha256: str) -> Path:
        return self.directory / f"{sha256}.onnx"

    def pin(self, sha256: str) -> None:
        """Keeps the model's file (and its `.part`) out of eviction until `unpin`ned as
        many times: pin before fetching a model to load, for as long as it is used."""
        with self._pins_lock:
            self._pins[sha256] += 1

    def unpin(self, sha256: str) -> None:
        with self._pins_lock:
            self._pins[sha256] -= 1
            if self._pins[sha256] <= 0:
                del self._pins[sha256]

    async def fetch(
        self,
        session: aiohttp.ClientSession,
        url: str,
        sha256: str,
        pinned: Iterable[str] = (),
        on_retry: Callable[[str], None] | None = None,
        size_bytes: int | None = None,
    ) -> Path:
        """The verified file, downloading it unless cached; evicts others to stay in bounds,
        never a `pin`ned one nor one in `pinned` (kept for this eviction only; a model to
        be loaded is `pin`ned before its fetch instead, since a download may take hours).
        `on_retry(why)` is told about each failed attempt that will be retried. Raises
        `ModelUnreachable` where the attempts ran out (worth a fetch later), another
        `ModelFetchError` where the answer was final (a refusal, a wrong file).
        `size_bytes`: the size the signed `desired` document gives it; a download is
        stopped as soon as it is longer (else at the cache's size), not once on disk."""
        most_bytes = min(size_bytes, self.max_bytes) if size_bytes is not None else self.max_bytes
        lock = self._locks.setdefault(sha256, asyncio.Lock())
        async with lock:
            path = self.path(sha256)
            if await asyncio.to_thread(self._use_cached, sha256, size_bytes):
                return path
            await asyncio.to_thread(self.directory.mkdir, parents=True, exist_ok=True)
            self._fetching.add(sha256)
            try:
                resumed = await self._download_with_retries(
                    session, url, sha256, most_bytes, on_retry
                )
                try:
                    await self._verify_and_keep(sha256)
                except _ChecksumMismatch as mismatch:
                    if not resumed:
                        raise
                    # Only a whole download tells a damaged `.part` from a wrong model.
                    self._log.warning(
                        "resumed model download is damaged: downloading it whole",
                        sha256=sha256[:12],
                        error=str(mismatch),
                    )
                    await asyncio.to_thread(self._part(sha256).unlink, missing_ok=True)
                    await self._download_with_retries(session, url, sha256, most_bytes, on_retry)
                    await self._verify_and_keep(sha256)
            except ModelFetchError:
                # Given up: nothing would resume it. (A cancelled fetch keeps its part for
                # the next try; eviction bounds it.)
                with contextlib.suppress(FileNotFoundError):
                    await asyncio.to_thread(self._part(sha256).unlink)
                raise
            finally:
                self._fetching.discard(sha256)
        await asyncio.to_thread(self._evict, {sha256, *pinned})
        return self.path(sha256)

    def _part(self, sha256: str) -> Path:
        return self.directory / f"{sha256}.part"

    def _use_cached(self, sha256: str, size_bytes: int | None) -> bool:
        """Whether the cached file is there and is the model (then marked most recently
        used); a damaged one is deleted. Blocking: its sha256 is read once per process
        and file (a model of gigabytes takes seconds), again only if the file changed."""
        path = self.path(sha256)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return False
        if size_bytes is not None and stat.st_size != size_bytes:
            why = f"it has {stat.st_size} bytes, the model {size_bytes}"
        elif self._verified.get(sha256) == _fingerprint(stat):
            why = ""
        else:
            actual, _ = file_sha256(path)
            why = "" if actual == sha256 else f"its sha256 is {actual[:16]}…"
        if not why:
            os.utime(path)  # most recently used
            self._verified[sha256] = _fingerprint(path.stat())
            return True
        self._log.warning("cached model damaged: downloading it again", sha256=sha256[:12], why=why)
        self._verified.pop(sha256, None)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return False

    async def _download_with_retries(
        self,
        session: aiohttp.ClientSession,
        url: str,
        sha256: str,
        most_bytes: int,
        on_retry: Callable[[str], None] | None,
    ) -> bool:
        """Whether the `.part` downloaded holds bytes of an earlier transfer (resumed).
        Gives up after `attempts` failures in a row; one that made the `.part` grow starts
        the count (and the backoff) again."""
        attempt = 0
        failures = 0  # in a row, counted from the last attempt that added bytes
        while True:
            attempt += 1
            before = await asyncio.to_thread(self._part_size, sha256)
            try:
                return await self._download(session, url, sha256, most_bytes)
            except (aiohttp.ClientError, TimeoutError, OSError, _Retryable) as failure:
                why = str(failure) or type(failure).__name__
            if await asyncio.to_thread(self._part_size, sha256) > before:
                failures = 0  # a slow or flaky link, making progress: not a dead one
            failures += 1
            self._log.warning(
                "model download failed",
                sha256=sha256[:12],
                attempt=attempt,
                failures_in_a_row=failures,
                error=why,
            )
            if failures >= self._attempts:
                raise ModelUnreachable(
                    f"could not download the model after {attempt} attempts: {why}"
                )
            if on_retry is not None:
                on_retry(f"download attempt {attempt} failed ({why}); retrying")
            await asyncio.sleep(min(RETRY_MAX_S, self._retry_base_s * 2 ** (failures - 1)))

    def _part_size(self, sha256: str) -> int:
        try:
            return self._part(sha256).stat().st_size
        except FileNotFoundError:
            return 0

    async def _download(
        self, session: aiohttp.ClientSession, url: str, sha256: str, most_bytes: int
    ) -> bool:
        """Whether the `.part` it leaves holds bytes of an earlier transfer (resumed)."""
        part = self._part(sha256)
        have = await asyncio.to_thread(self._part_size, sha256)
        headers = {"Range": f"bytes={have}-"} if have else {}
        async with session.get(url, headers=headers, timeout=self._timeout) as response:
            if response.status == 416:  # the part file is already whole (or longer)
                return have > 0
            if response.status not in (200, 206):
                body = (await response.text())[:300]
                answer = f"the control plane answered {response.status}: {body}"
                if response.status >= 500 or response.status in (408, 410, 429):
                    raise _Retryable(answer)  # busy, restarting, or this replica lacks it
                raise ModelFetchError(answer)
            resume = response.status == 206
            if resume:
                self.resumed += 1
            self.downloads += 1
            written = have if resume else 0
            with open(part, "ab" if resume else "wb") as file:  # noqa: ASYNC230 - writes are off-loop below
                async for chunk in response.content.iter_chunked(_CHUNK_BYTES):
                    written += len(chunk)
                    if written > most_bytes:
                        break
                    await asyncio.to_thread(file.write, chunk)
            if written > most_bytes:
                with contextlib.suppress(FileNotFoundError):
                    await asyncio.to_thread(part.unlink)
                raise ModelFetchError(
                    f"the download is longer than the model can be ({most_bytes} bytes: its "
                    "size in the signed document, or the model cache's): stopped"
                )
            return resume

    async def _verify_and_keep(self, sha256: str) -> None:
        """Raises `_ChecksumMismatch` where the file is not the model (the caller deletes
        it, or downloads it whole once more if it was resumed)."""
        part = self._part(sha256)
        actual, _ = await asyncio.to_thread(file_sha256, part)
        if actual != sha256:
            raise _ChecksumMismatch(
                f"checksum mismatch: the file has sha256 {actual[:16]}…, the registry "
                f"says {sha256[:16]}…"
            )
        # On disk before the rename, and the rename on disk after it: after a power cut
        # the cache holds the whole model or none (a damaged file is caught on a hit too).
        await asyncio.to_thread(sync_to_disk, part)
        await asyncio.to_thread(os.replace, part, self.path(sha256))
        await asyncio.to_thread(sync_to_disk, self.directory)
        stat = await asyncio.to_thread(self.path(sha256).stat)
        self._verified[sha256] = _fingerprint(stat)

    def _evict(self, pinned: set[str]) -> None:
        """Deletes the least recently used files, `.part` ones too, until the cache is
        within its bound; never a pinned model's (`pinned` or `pin`) nor one being
        fetched. Over the bound where the rest is in use."""
        entries: list[tuple[float, int, Path]] = []  # modified at, bytes, file
        for entry in self.directory.iterdir():
            if entry.suffix not in (".onnx", ".part"):
                continue
            with contextlib.suppress(FileNotFoundError):
                stat = entry.stat()
                entries.append((stat.st_mtime, stat.st_size, entry))
        total = sum(size for _, size, _ in entries)
        for _, size, entry in sorted(entries):
            if total <= self.max_bytes:
                break
            if entry.stem in pinned or not self._unlink_unless_in_use(entry):
                continue
            total -= size
            self._verified.pop(entry.stem, None)
            self._log.info("model evicted from the cache", sha256=entry.stem[:12], file=entry.name)

    def _unlink_unless_in_use(self, entry: Path) -> bool:
        """Whether `entry` was deleted: not while its model is pinned or being fetched,
        asked at the moment of deleting (a fetch or a pin may come while eviction runs)."""
        with self._pins_lock:
            if entry.stem in self._pins or entry.stem in self._fetching:
                return False
            try:
                entry.unlink()
            except FileNotFoundError:
                return False
            return True


_Fingerprint = tuple[int, int, int]  # inode, bytes, modified at (ns)


def _fingerprint(stat: os.stat_result) -> _Fingerprint:
    """Changes when the file is replaced or written (a write sets its modified time)."""
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)
