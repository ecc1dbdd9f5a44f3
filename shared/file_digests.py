"""A file's sha256 and size, read in pieces: what an agent checks a downloaded model
(edge/inference/model_fetch.py) and an agent package (edge/agent/upgrades.py) against.
Blocking: call it off the event loop."""

from __future__ import annotations

import hashlib
from pathlib import Path

_PIECE_BYTES = 1 << 20


def file_sha256(path: Path) -> tuple[str, int]:
    """The file's sha256 (lower-case hex) and its size in bytes."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as file:
        while piece := file.read(_PIECE_BYTES):
            digest.update(piece)
            size += len(piece)
    return digest.hexdigest(), size
