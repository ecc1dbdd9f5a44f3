"""Private key files: readable by their owner only, made once, refused when exposed.

One rule for every key greenfed keeps on disk (the control plane's `desired` signing
key, its store's secrets key, a node's sealing key): the file is read if it exists and
made if it does not. Two processes making it at once agree on one key: the new key is
written to a private temporary file and hard-linked into place, which fails instead of
overwriting when another process got there first. A file that others can read is
refused with an error naming the setting, as is one that does not parse: a leaked or
half-written key must stop the program, not be used.

The key's format is the caller's (`make` gives the bytes of a new key, `parse` turns
the file's bytes into a key or raises ValueError), so this module needs no crypto.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from shared.settings import ConfigError

KeyT = TypeVar("KeyT")


def load_or_create_key(
    path: Path, *, setting: str, make: Callable[[], bytes], parse: Callable[[bytes], KeyT]
) -> KeyT:
    """The key in `path`, made there first if there is none. Errors name `setting`."""
    try:
        return load_key(path, setting=setting, parse=parse)
    except FileNotFoundError:
        pass
    _create(path, setting, make())
    return load_key(path, setting=setting, parse=parse)


def load_key(path: Path, *, setting: str, parse: Callable[[bytes], KeyT]) -> KeyT:
    """The key in `path`; FileNotFoundError when there is none. Never through a link
    (whoever could plant one would choose the key), never a file another user owns."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise ConfigError(
            f"{setting}: {path} is a symbolic link; a key file is a plain file", key=setting
        ) from None
    with os.fdopen(descriptor, "rb") as file:
        status = os.fstat(file.fileno())
        mode = status.st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{setting}: {path} is not a plain file", key=setting)
        if status.st_uid != os.geteuid():
            raise ConfigError(
                f"{setting}: {path} is owned by uid {status.st_uid}, not by this process's "
                f"({os.geteuid()}); run chown {os.geteuid()} {path}",
                key=setting,
            )
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"{setting}: {path} is readable by others (mode {stat.S_IMODE(mode):04o}); "
                f"run chmod 600 {path}",
                key=setting,
            )
        data = file.read()
    try:
        return parse(data)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"{setting}: {path}: {error}", key=setting) from None


def make_private_dir(directory: Path) -> None:
    """Make `directory` (and its parents) if it is missing, then readable by its owner
    only (0700): what `greenfed edge doctor` holds the agent's state directory to. The
    mode is set again after mkdir, whose mode the umask may mask. A directory that was
    already there is left as it is: it may be one the operator made, and shares."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        if not directory.is_dir():
            raise  # as mkdir(exist_ok=True) does: a file is in the way
        return
    os.chmod(directory, 0o700)


def _create(path: Path, setting: str, data: bytes) -> None:
    try:
        make_private_dir(path.parent)
    except OSError as error:
        raise ConfigError(f"{setting}: cannot create {path.parent}: {error}", key=setting) from None
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        # link, not rename: a key another process linked first must win, or the two would
        # use different keys.
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    except OSError as error:
        raise ConfigError(f"{setting}: cannot write {path}: {error}", key=setting) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
