"""Where a model is fetched at the edge, into the agent's model cache:
`<dir>/<sha256>.onnx`, bounded in bytes, least recently used first out.

A download is streamed into `<sha256>.part`, resumed from where a broken transfer
stopped (an HTTP Range request), retried with backoff, verified against the sha256
the cloud announced, and only then renamed into place: a cached file is always a
whole, verified model. Files a running deployment uses are pinned and never evicted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import aiohttp

from shared.file_digests import file_sha256
from shared.lean_logs import get_logger

_CHUNK_BYTES = 1 << 20
# A control plane that restarts or a link that drops is waited out (about two
# minutes in all); a refusal (bad signature, unknown model) or a wrong file is not.
ATTEMPTS = 8
RETRY_BASE_S = 0.5
RETRY_MAX_S = 30.0


class ModelFetchError(RuntimeError):
    """The model could not be fetched or is not the announced file; says why."""


class _Retryable(Exception):
    """A failure worth another attempt (the control plane answered 5xx)."""


class ModelCache:
    def __init__(
        self,
        directory: Path,
        max_bytes: int,
        *,
        timeout_s: float = 300.0,
        attempts: int = ATTEMPTS,
        retry_base_s: float = RETRY_BASE_S,
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._attempts = attempts
        self._retry_base_s = retry_base_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, sock_read=30.0)
        self._locks: dict[str, asyncio.Lock] = {}
        self._log = get_logger("greenfed.inference.cache")
        self.downloads = 0
        self.resumed = 0

    def path(self, sha256: str) -> Path:
        return self.directory / f"{sha256}.onnx"

    async def fetch(
        self,
        session: aiohttp.ClientSession,
        url: str,
        sha256: str,
        pinned: Iterable[str] = (),
        on_retry: Callable[[str], None] | None = None,
        size_bytes: int | None = None,
    ) -> Path:
        """The verified file, downloading it unless cached; evicts others to stay in bounds.
        `on_retry(why)` is told about each failed attempt that will be retried.
        `size_bytes`: the size the signed `desired` document gives it; a download is
        stopped as soon as it is longer (else at the cache's size), not once on disk."""
        most_bytes = min(size_bytes, self.max_bytes) if size_bytes is not None else self.max_bytes
        lock = self._locks.setdefault(sha256, asyncio.Lock())
        async with lock:
            path = self.path(sha256)
            if await asyncio.to_thread(path.is_file):
                await asyncio.to_thread(os.utime, path)  # most recently used
                return path
            await asyncio.to_thread(self.directory.mkdir, parents=True, exist_ok=True)
            why = ""
            for attempt in range(self._attempts):
                try:
                    await self._download(session, url, sha256, most_bytes)
                    break
                except (aiohttp.ClientError, TimeoutError, OSError, _Retryable) as failure:
                    why = str(failure) or type(failure).__name__
                    self._log.warning(
                        "model download failed", sha256=sha256[:12], attempt=attempt + 1,
                        error=why,
                    )  # fmt: skip
                    if attempt + 1 < self._attempts:
                        if on_retry is not None:
                            on_retry(f"download attempt {attempt + 1} failed ({why}); retrying")
                        await asyncio.sleep(min(RETRY_MAX_S, self._retry_base_s * 2**attempt))
            else:
                raise ModelFetchError(
                    f"could not download the model after {self._attempts} attempts: {why}"
                )
            await self._verify_and_keep(sha256)
        await asyncio.to_thread(self._evict, {sha256, *pinned})
        return self.path(sha256)

    async def _download(
        self, session: aiohttp.ClientSession, url: str, sha256: str, most_bytes: int
    ) -> None:
        part = self.directory / f"{sha256}.part"
        have = await asyncio.to_thread(lambda: part.stat().st_size if part.exists() else 0)
        headers = {"Range": f"bytes={have}-"} if have else {}
        async with session.get(url, headers=headers, timeout=self._timeout) as response:
            if response.status == 416:  # the part file is already whole (or longer)
                return
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

    async def _verify_and_keep(self, sha256: str) -> None:
        part = self.directory / f"{sha256}.part"

        actual, _ = await asyncio.to_thread(file_sha256, part)
        if actual != sha256:
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(part.unlink)
            raise ModelFetchError(
                f"checksum mismatch: the file has sha256 {actual[:16]}…, the registry "
                f"says {sha256[:16]}…"
            )
        await asyncio.to_thread(os.replace, part, self.path(sha256))

    def _evict(self, pinned: set[str]) -> None:
        files = [
            (entry.stat().st_mtime, entry)
            for entry in self.directory.glob("*.onnx")
            if entry.stem not in pinned
        ]
        total = sum(entry.stat().st_size for entry in self.directory.glob("*.onnx"))
        for _, entry in sorted(files):
            if total <= self.max_bytes:
                break
            size = entry.stat().st_size
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
                total -= size
                self._log.info("model evicted from the cache", sha256=entry.stem[:12])
