"""greenfed wheels built from this checkout in a moment, for agent-upgrade tests: the
packages the real wheel holds (pyproject.toml's `[tool.hatch.build.targets.wheel]`),
with a dist-info naming the version asked for (what `python -m build` would need the
network for: the build backend). `replace` swaps files' contents, to make a package
that is deliberately broken."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Mapping
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "cloud", "edge", "sim_devices", "greenfed")


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(directory: Path, version: str, *, replace: Mapping[str, str] | None = None) -> Path:
    """`greenfed-VERSION-py3-none-any.whl` in `directory`; `replace`: path in the wheel
    -> the text it holds instead."""
    replace = dict(replace or {})
    dist_info = f"greenfed-{version}.dist-info"
    path = directory / f"greenfed-{version}-py3-none-any.whl"
    records: list[str] = []
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as wheel:

        def add(name: str, data: bytes) -> None:
            wheel.writestr(name, data)
            records.append(_record_line(name, data))

        for package in PACKAGES:
            for file in sorted((CHECKOUT / package).rglob("*")):
                if not file.is_file() or "__pycache__" in file.parts:
                    continue
                name = file.relative_to(CHECKOUT).as_posix()
                data = replace.pop(name).encode() if name in replace else file.read_bytes()
                add(name, data)
        assert not replace, f"not in the wheel: {sorted(replace)}"
        add(
            f"{dist_info}/METADATA",
            f"Metadata-Version: 2.1\nName: greenfed\nVersion: {version}\n".encode(),
        )
        add(
            f"{dist_info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: greenfed-tests\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n",
        )
        wheel.writestr(f"{dist_info}/RECORD", "\n".join([*records, f"{dist_info}/RECORD,,"]))
    return path
