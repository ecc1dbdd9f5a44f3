"""Model files stored by content: `<root>/sha256/<first two hex digits>/<hex>.onnx`.

An upload is streamed to a temporary file beside the store (same file system),
hashed and counted as it arrives, refused as soon as it passes the size limit, and
renamed into place only once it is complete and accepted: a reader never sees half
a file, and two uploads of the same bytes share one. Uploads in progress are bounded
and checked on a pool of their own (`checks`, cloud/models/checking.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import tempfile
from collections.abc import AsyncIterable
from dataclasses import dataclass
from pathlib import Path

from cloud.models.checking import ModelChecks

_FLUSH_BYTES = 1 << 20  # write to disk (off the event loop) in pieces of about this much


class ModelTooLargeError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class StagedBlob:
    path: Path  # the temporary file; `BlobStore.keep` or `discard` it
    sha256: str
    size_bytes: int


class BlobStore:
    def __init__(self, root: Path, max_bytes: int, checks: ModelChecks | None = None) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.checks = checks if checks is not None else ModelChecks()

    def path(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256[:2] / f"{sha256}.onnx"

    async def stage(self, chunks: AsyncIterable[bytes]) -> StagedBlob:
        """Write the stream to a temporary file; raises `ModelTooLargeError` past the limit."""
        staging = self.root / "staging"
        await asyncio.to_thread(staging.mkdir, parents=True, exist_ok=True)
        fd, name = await asyncio.to_thread(tempfile.mkstemp, dir=staging, suffix=".part")
        path = Path(name)
        digest = hashlib.sha256()
        size = 0
        pending: list[bytes] = []
        pending_bytes = 0
        try:
            with os.fdopen(fd, "wb") as file:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise ModelTooLargeError(
                            f"the model exceeds {self.max_bytes} bytes (cloud.max_model_bytes)"
                        )
                    digest.update(chunk)
                    pending.append(chunk)
                    pending_bytes += len(chunk)
                    if pending_bytes >= _FLUSH_BYTES:
                        await asyncio.to_thread(file.write, b"".join(pending))
                        pending, pending_bytes = [], 0
                if pending:
                    await asyncio.to_thread(file.write, b"".join(pending))
        except BaseException:
            await self.discard(path)
            raise
        return StagedBlob(path, digest.hexdigest(), size)

    async def keep(self, staged: StagedBlob) -> Path:
        """Move an accepted upload into place (or drop it: the same bytes are there)."""
        target = self.path(staged.sha256)

        def move() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged.path, target)  # atomic; equal content if it existed

        await asyncio.to_thread(move)
        return target

    async def discard(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(path.unlink)
