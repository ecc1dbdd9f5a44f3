"""Token files: where the admin token and the metrics scrape token of a data directory
are, and how a secret is written (owner-only, atomically) and read back. The control
plane writes them; the CLI (and Prometheus, for the scrape token) reads them."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

from shared.settings import StoreSettings

ADMIN_TOKEN_FILE_NAME: Final = "admin-token"
METRICS_TOKEN_FILE_NAME: Final = "metrics-token"


def admin_token_path(settings: StoreSettings) -> Path:
    return settings.resolved_data_dir() / ADMIN_TOKEN_FILE_NAME


def metrics_token_path(settings: StoreSettings) -> Path:
    """Where the control plane writes the token a Prometheus scrape of /metrics sends."""
    return settings.resolved_data_dir() / METRICS_TOKEN_FILE_NAME


def write_secret(path: Path, secret: str) -> None:
    """Write `secret` to `path` readable by its owner only, replacing it atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(secret + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def read_token_file(path: Path) -> str | None:
    """The token in a token file, or None when there is no such file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return text.strip() or None
