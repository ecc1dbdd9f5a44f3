"""Agent packages (shared/agent_packages.py): what an agent installs only if its control
plane signed it, and unpacks only inside its own directory."""

from __future__ import annotations

import io
import stat
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from shared.agent_packages import (
    PackageError,
    PackageFacts,
    inspect_wheel,
    inspect_wheel_bytes,
    sign_package,
    unpack_wheel,
    verify_package_signature,
)


def wheel(path: Path, *, extra: tuple[str | zipfile.ZipInfo, ...] = ()) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("greenfed/__init__.py", "")
        archive.writestr(
            "greenfed-1.2.3.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: greenfed\nVersion: 1.2.3\n",
        )
        for member in extra:
            archive.writestr(member, "x")
    return path


def test_a_wheel_says_its_version_and_the_same_bytes_say_the_same(tmp_path: Path) -> None:
    path = wheel(tmp_path / "a.whl")
    facts = inspect_wheel(path)
    assert facts.version == "1.2.3"
    assert facts == inspect_wheel_bytes(path.read_bytes())
    assert facts.size_bytes == path.stat().st_size


@pytest.mark.parametrize(
    ("name", "version", "why"),
    [
        ("numpy", "1.2.3", "not 'greenfed'"),
        ("greenfed", "1.2.3 beta", "not a plain version"),
        ("greenfed", "../../etc", "not a plain version"),
    ],
)
def test_another_projects_wheel_or_a_strange_version_is_refused(
    tmp_path: Path, name: str, version: str, why: str
) -> None:
    path = tmp_path / "a.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("greenfed-x.dist-info/METADATA", f"Name: {name}\nVersion: {version}\n")
    with pytest.raises(PackageError, match=why):
        inspect_wheel(path)


def test_a_file_that_is_no_wheel_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.whl"
    path.write_bytes(b"MZ\x90\x00 not a zip")
    with pytest.raises(PackageError, match="not a wheel"):
        inspect_wheel(path)


def test_only_the_control_planes_signature_over_these_facts_verifies() -> None:
    key = Ed25519PrivateKey.generate()
    facts = PackageFacts(version="1.2.3", sha256="a" * 64, size_bytes=10)
    signature = sign_package(facts, key)
    verify_package_signature(facts, signature, key.public_key())
    for changed in (
        PackageFacts(version="1.2.4", sha256="a" * 64, size_bytes=10),
        PackageFacts(version="1.2.3", sha256="b" * 64, size_bytes=10),
        PackageFacts(version="1.2.3", sha256="a" * 64, size_bytes=11),
    ):
        with pytest.raises(PackageError, match="not signed by this node's control plane"):
            verify_package_signature(changed, signature, key.public_key())
    with pytest.raises(PackageError, match="not signed"):
        verify_package_signature(facts, signature, Ed25519PrivateKey.generate().public_key())
    with pytest.raises(PackageError, match="not base64"):
        verify_package_signature(facts, "%%%", key.public_key())


def test_a_wheel_unpacks_into_its_directory(tmp_path: Path) -> None:
    path = wheel(tmp_path / "a.whl", extra=("greenfed/sub/mod.py",))
    unpack_wheel(path, tmp_path / "site")
    assert (tmp_path / "site" / "greenfed" / "sub" / "mod.py").read_text() == "x"
    assert (tmp_path / "site" / "greenfed-1.2.3.dist-info" / "METADATA").is_file()


def _link(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info


@pytest.mark.parametrize(
    "member",
    ["../escaped.py", "/etc/escaped.py", "greenfed/../../escaped.py", _link("greenfed/link")],
    ids=["parent", "absolute", "nested-parent", "symlink"],
)
def test_a_member_that_would_land_outside_or_link_is_refused(
    tmp_path: Path, member: str | zipfile.ZipInfo
) -> None:
    path = wheel(tmp_path / "a.whl", extra=(member,))
    # Refused when it is published, before it is signed and sent to every agent...
    with pytest.raises(PackageError):
        inspect_wheel_bytes(path.read_bytes())
    # ...and by each agent as it unpacks.
    with pytest.raises(PackageError):
        unpack_wheel(path, tmp_path / "site")
    assert not (tmp_path / "escaped.py").exists()


def _with_undecodable_name(content: bytes, placeholder: bytes) -> bytes:
    """`content` (a zip) with the member name holding `placeholder` flagged UTF-8 (bit
    11) but holding bytes that are not UTF-8, in its local and central headers."""
    data = bytearray(content)
    for signature, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = data.find(signature)
        while at != -1:
            name_at = data.find(placeholder, at)
            if name_at != -1 and name_at - at < 80:
                flags = int.from_bytes(data[at + flags_at : at + flags_at + 2], "little")
                data[at + flags_at : at + flags_at + 2] = (flags | 0x800).to_bytes(2, "little")
                data[name_at : name_at + len(placeholder)] = b"\xff\xfe\xfd\xfc"
            at = data.find(signature, at + 4)
    return bytes(data)


def _with_compression_method(content: bytes, member: str, method: int) -> bytes:
    """`content` (a zip) with `member` marked as compressed by `method`, in its local
    and central headers: what zipfile can list but not read."""
    data = bytearray(content)
    name = member.encode()
    for signature, header_size, method_at in ((b"PK\x03\x04", 30, 8), (b"PK\x01\x02", 46, 10)):
        at = data.find(signature)
        while at != -1:
            if data[at + header_size : at + header_size + len(name)] == name:
                data[at + method_at : at + method_at + 2] = method.to_bytes(2, "little")
            at = data.find(signature, at + 4)
    return bytes(data)


def _with_central_directory_moved(content: bytes, by_bytes: int) -> bytes:
    """`content` (a zip) whose end record says its central directory starts `by_bytes`
    later than it does: every member's offset comes out before the file's start."""
    data = bytearray(content)
    end = data.rfind(b"PK\x05\x06")
    offset = int.from_bytes(data[end + 16 : end + 20], "little")
    data[end + 16 : end + 20] = (offset + by_bytes).to_bytes(4, "little")
    return bytes(data)


@pytest.mark.parametrize(
    "damage",
    ["unknown compression", "corrupt data", "undecodable name", "central directory moved"],
)
def test_a_wheel_zipfile_cannot_read_is_refused_as_a_package_error(
    tmp_path: Path, damage: str
) -> None:
    """Never signed on upload, and never an exception other than PackageError where an
    agent unpacks one (an agent's upgrade fails and is recorded, it does not crash)."""
    path = tmp_path / "a.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("greenfed/__init__.py", "x = 1\n" * 200)
        archive.writestr(
            "greenfed-1.2.3.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: greenfed\nVersion: 1.2.3\n",
        )
    content = path.read_bytes()
    if damage == "unknown compression":
        content = _with_compression_method(content, "greenfed/__init__.py", 99)
    elif damage == "undecodable name":  # a 500 at POST /v1/agent-packages
        content = _with_undecodable_name(content, b"init")
    elif damage == "central directory moved":  # a negative seek: a 500 too
        content = _with_central_directory_moved(content, 200)
    else:
        start = content.find(b"greenfed/__init__.py") + len("greenfed/__init__.py")
        content = (
            content[:start]
            + bytes(b ^ 0xFF for b in content[start : start + 20])
            + (content[start + 20 :])
        )
    path.write_bytes(content)
    with pytest.raises(PackageError):
        inspect_wheel_bytes(content)
    with pytest.raises(PackageError):
        unpack_wheel(path, tmp_path / "unpacked")


def test_a_small_upload_whose_metadata_inflates_is_refused_before_it_is_read() -> None:
    """What the control plane reads of an upload before any limit is its METADATA: a
    few hundred kB that inflate to gigabytes must not be inflated to be refused."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("greenfed/__init__.py", "")
        with archive.open("greenfed-1.2.3.dist-info/METADATA", "w") as metadata:
            metadata.write(b"Metadata-Version: 2.1\nName: greenfed\nVersion: 1.2.3\n\n")
            for _ in range(64):
                metadata.write(b" " * (1 << 20))
    content = buffer.getvalue()
    assert len(content) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(PackageError, match="METADATA"):
            inspect_wheel_bytes(content)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_bytes < 8 << 20


@pytest.mark.parametrize("name", [".", "./", "greenfed/..", ""])
def test_a_member_that_names_the_root_itself_is_refused(tmp_path: Path, name: str) -> None:
    """A member with no name of its own would be the unpacked root: never signed, and an
    agent given one refuses it (it does not climb past its root looking for it)."""
    path = wheel(tmp_path / "a.whl", extra=(zipfile.ZipInfo(name),))
    with pytest.raises(PackageError):
        inspect_wheel_bytes(path.read_bytes())
    with pytest.raises(PackageError):
        unpack_wheel(path, tmp_path / "site")
    assert not (tmp_path / "site").exists()
