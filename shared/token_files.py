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


class MalformedTokenFile(ValueError):
    """A token file that does not hold text (a ValueError, as the decoding error it
    replaces was: its callers see the same kind of failure, now with a sentence)."""


def token_problem(token: str) -> str | None:
    """Why `token` cannot be a bearer token, or None when it can: a token is one line of
    printable ASCII without spaces (an HTTP header carries it; a line break in it would be
    refused there as an attempt at header injection). The sentence never quotes the
    token: a secret."""
    if not token:
        return "is empty"
    if "\n" in token or "\r" in token:
        return "holds more than one line (a token is one line)"
    if not all("!" <= character <= "~" for character in token):
        return "holds a space or a character other than printable ASCII (a token has neither)"
    return None


def read_token_file(path: Path) -> str | None:
    """The text of a token file without surrounding whitespace, or None when there is no
    such file or it is empty; `token_problem` says whether it is a token. Raises
    `MalformedTokenFile` for a file that is not UTF-8 text, OSError for one that cannot
    be read."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedTokenFile(f"{path} is not a token file: it is not text") from None
    return text.strip() or None
