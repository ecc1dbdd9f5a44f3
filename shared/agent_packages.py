"""Agent packages: the wheels a control plane serves for agents to upgrade themselves to.

A package is one greenfed wheel. The control plane signs what it vouches for, the
statement `greenfed-agent-package/1`, the version, the wheel's sha256 and its size,
one per line, with the Ed25519 key it signs `desired` documents with
(shared/desired_signature.py), so an agent checks a package with the key it already
trusts: a package it did not get from its own control plane, or one changed on the
way or on disk, never runs. The statement is its own (not the `desired` document's
bytes) so that a staged package can be checked again long after the document that
named it is gone.

Installing is unpacking: a greenfed wheel is pure Python, and an agent upgrades only
its own code beside the running one (edge/upgrade/), never the dependencies it shares
with the running version.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Final

from shared.ed25519 import VerifyKey, is_signature
from shared.file_digests import file_sha256

if TYPE_CHECKING:
    import zipfile

    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

PACKAGE_NAME: Final = "greenfed"
# A PEP 440 version as a topic- and path-safe token (no separators, no spaces).
AGENT_VERSION_PATTERN: Final = r"[0-9][0-9A-Za-z.+!_-]{0,63}"
_VERSION = re.compile(AGENT_VERSION_PATTERN)
_METADATA = re.compile(r"[^/]+\.dist-info/METADATA")
# Far above a greenfed wheel (about 1 MB) and far below what would hurt a device.
MAX_PACKAGE_BYTES: Final = 64 * 1024 * 1024
_MAX_MEMBERS: Final = 20_000
_MAX_UNPACKED_BYTES: Final = 512 * 1024 * 1024
# A wheel's METADATA is a few kB (its README at most): read whole, so read only if small.
_MAX_METADATA_BYTES: Final = 1024 * 1024


class PackageError(ValueError):
    """A file that is not a greenfed wheel we may install, or a signature that is not
    the control plane's; `str()` says which, for the person or the birth's report."""


@dataclass(frozen=True, slots=True)
class PackageFacts:
    """What a wheel says of itself, and its bytes' digest."""

    version: str
    sha256: str
    size_bytes: int


def is_valid_version(text: str) -> bool:
    return _VERSION.fullmatch(text) is not None


def statement(version: str, sha256: str, size_bytes: int) -> bytes:
    """The bytes the control plane signs for one package."""
    return f"greenfed-agent-package/1\n{version}\n{sha256}\n{size_bytes}\n".encode()


def sign_package(facts: PackageFacts, key: Ed25519PrivateKey) -> str:
    """Base64 (standard, padded) of the Ed25519 signature over the package's statement."""
    return base64.b64encode(
        key.sign(statement(facts.version, facts.sha256, facts.size_bytes))
    ).decode()


def verify_package_signature(
    facts: PackageFacts, signature: str, key: VerifyKey | Ed25519PublicKey
) -> None:
    """Raises `PackageError` unless `signature` is the control plane's over `facts`."""
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        raise PackageError("the package signature is not base64") from None
    if not is_signature(key, raw, statement(facts.version, facts.sha256, facts.size_bytes)):
        raise PackageError("the package is not signed by this node's control plane")


def inspect_wheel(path: Path) -> PackageFacts:
    """A greenfed wheel's version, digest and size; raises `PackageError` for anything
    else. Blocking."""
    sha256, size = file_sha256(path)
    if size > MAX_PACKAGE_BYTES:
        raise PackageError(f"the package is {size} bytes, more than {MAX_PACKAGE_BYTES}")
    with path.open("rb") as file:
        return PackageFacts(version=wheel_version(file), sha256=sha256, size_bytes=size)


def inspect_wheel_bytes(content: bytes) -> PackageFacts:
    """As `inspect_wheel`, for a wheel in memory (an upload)."""
    import io

    if len(content) > MAX_PACKAGE_BYTES:
        raise PackageError(f"the package is {len(content)} bytes, more than {MAX_PACKAGE_BYTES}")
    return PackageFacts(
        version=wheel_version(io.BytesIO(content)),
        sha256=hashlib.sha256(content).hexdigest(),
        size_bytes=len(content),
    )


def _unreadable() -> tuple[type[BaseException], ...]:
    """What zipfile raises for an archive it cannot read: a bad directory, a compression
    method it does not know (NotImplementedError), an encrypted member (RuntimeError),
    data cut short (EOFError) or corrupt (zlib.error), a read that fails (OSError), a
    member name flagged UTF-8 that is not (UnicodeDecodeError, a ValueError), an offset
    before the file's start (ValueError: a negative seek in memory), a header cut short
    (struct.error). PackageError is a ValueError too: callers let it through first."""
    import struct
    import zipfile
    import zlib

    return (
        zipfile.BadZipFile,
        OSError,
        NotImplementedError,
        RuntimeError,
        EOFError,
        zlib.error,
        ValueError,
        struct.error,
    )


def _check_members(wheel: zipfile.ZipFile) -> None:
    """PackageError unless every member unpacks inside its root as a plain file or
    directory, within the limits: checked when a package is published (before it is
    signed and sent to agents) and again by each agent as it unpacks."""
    members = wheel.infolist()
    if len(members) > _MAX_MEMBERS:
        raise PackageError(f"the wheel has more than {_MAX_MEMBERS} files")
    total = 0
    for member in members:
        name = PurePosixPath(member.filename)
        if name.is_absolute() or ".." in name.parts or "\\" in member.filename:
            raise PackageError(f"the wheel's member {member.filename[:120]!r} leaves its root")
        if not name.parts:  # ".", "./" or "": the root itself, which is no file of it
            raise PackageError(f"the wheel's member {member.filename[:120]!r} names its root")
        if (member.external_attr >> 16) & 0o170000 == 0o120000:
            raise PackageError(f"the wheel's member {member.filename[:120]!r} is a link")
        total += member.file_size
        if total > _MAX_UNPACKED_BYTES:
            raise PackageError(f"the wheel unpacks to more than {_MAX_UNPACKED_BYTES} bytes")


def _metadata_text(wheel: zipfile.ZipFile) -> str:
    """The wheel's one *.dist-info/METADATA, refused unless small: the size a member
    declares bounds what zipfile inflates of it, so a small upload whose METADATA would
    inflate to gigabytes is refused before any of it is read."""
    members = [member for member in wheel.infolist() if _METADATA.fullmatch(member.filename)]
    if len(members) != 1:
        raise PackageError("a wheel has exactly one *.dist-info/METADATA")
    (member,) = members
    if member.file_size > _MAX_METADATA_BYTES:
        raise PackageError(
            f"the wheel's METADATA is {member.file_size} bytes, more than {_MAX_METADATA_BYTES}"
        )
    with wheel.open(member) as file:
        return file.read(_MAX_METADATA_BYTES).decode("utf-8", errors="replace")


def wheel_version(source: IO[bytes]) -> str:
    """The version a greenfed wheel declares in its METADATA; raises `PackageError` for
    a file that is not a wheel, or another project's."""
    # Imported here, as in unpack_wheel: shared.messages imports this module for two
    # constants, and every agent holds what this module imports (zip and email parsing).
    import email.parser
    import zipfile

    try:
        with zipfile.ZipFile(source) as wheel:
            # Every member checked first, from the sizes the archive declares, before
            # any is inflated; then each read once: what an agent could not unpack is
            # refused here, not signed and sent to agents that would fail on it.
            _check_members(wheel)
            metadata = email.parser.Parser().parsestr(_metadata_text(wheel), headersonly=True)
            broken = wheel.testzip()
            if broken is not None:
                raise PackageError(f"the wheel's member {broken[:120]!r} is corrupt")
    except PackageError:
        raise
    except _unreadable() as error:
        raise PackageError(f"not a wheel: {error}") from None
    name = (metadata.get("Name") or "").strip()
    version = (metadata.get("Version") or "").strip()
    if name.lower() != PACKAGE_NAME:
        raise PackageError(f"the wheel is {name or 'unnamed'!r}, not {PACKAGE_NAME!r}")
    if not is_valid_version(version):
        raise PackageError(f"the wheel's version {version[:80]!r} is not a plain version")
    return version


def unpack_wheel(path: Path, target: Path) -> None:
    """Unpack the wheel's files into `target` (made here), as `pip install --no-deps
    --target` lays out a pure-Python wheel. Refuses members that would land outside
    `target`, links, and archives that unpack past the limits. Blocking.

    Whole and durable, or not there: the files are unpacked into `<target>.partial`,
    each file and directory fsynced, then renamed to `target`, and the rename made
    durable (with `target`'s parent's own entry, the version's directory). A power cut
    soon after the version is made active (its record is fsynced) would otherwise leave
    the files the kernel had not written yet empty, and an empty `__main__` exits at
    once. Modes are fixed (0644 files, 0755 directories; the umask can only narrow
    them): the supervisor runs only code no other user can write
    (edge/upgrade/versions.py)."""
    import contextlib
    import os
    import shutil
    import zipfile

    def fsync_directory(directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def make_directories(directory: Path, made: set[Path]) -> None:
        """`directory` and its parents not in `made` (the unpacked root is), 0755,
        each noted in `made` to be fsynced (which makes its entries durable)."""
        missing = []
        while directory not in made:
            if directory == directory.parent:  # past the filesystem's root: never ours
                raise PackageError(f"{directory} is not inside the unpacked root")
            missing.append(directory)
            directory = directory.parent
        for each in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(each, 0o755)
            made.add(each)

    if target.exists():
        raise FileExistsError(f"{target} exists already")
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    partial = target.with_name(f"{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # a half-unpacked earlier attempt
    try:
        os.mkdir(partial, 0o755)
        resolved = partial.resolve()
        made = {resolved}
        with zipfile.ZipFile(path) as wheel:
            _check_members(wheel)
            for member in wheel.infolist():
                name = PurePosixPath(member.filename)
                destination = (resolved / name).resolve()
                if destination == resolved or not destination.is_relative_to(resolved):
                    raise PackageError(
                        f"the wheel's member {member.filename[:120]!r} leaves its root"
                    )
                if member.is_dir():
                    make_directories(destination, made)
                    continue
                make_directories(destination.parent, made)
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
                with (
                    wheel.open(member) as source,
                    open(os.open(destination, flags, 0o644), "wb") as sink,
                ):
                    while chunk := source.read(1 << 20):
                        sink.write(chunk)
                    sink.flush()
                    os.fsync(sink.fileno())
        for directory in made:
            fsync_directory(directory)
        os.rename(partial, target)
    except BaseException as error:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(error, _unreadable()) and not isinstance(error, PackageError):
            raise PackageError(f"the wheel could not be unpacked: {error}") from None
        raise
    fsync_directory(target.parent)
    fsync_directory(target.parent.parent)
