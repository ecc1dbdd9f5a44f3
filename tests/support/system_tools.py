"""Debian tools some tests drive (promtool, prometheus, chromium): found on the PATH or
where Debian puts them; a missing one skips the test on a laptop and fails it in CI."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.brokers import require_or_skip

_DEBIAN_PLACES = ("/usr/bin", "/usr/sbin", "/usr/local/bin")


def find_tool(name: str) -> str | None:
    found = shutil.which(name)
    if found is not None:
        return found
    return next(
        (str(Path(place) / name) for place in _DEBIAN_PLACES if (Path(place) / name).exists()),
        None,
    )


def require_tool(name: str, debian_package: str) -> str:
    """The path of `name`; skips (or, under GREENFED_TEST_REQUIRE_SERVICES=1, fails) the
    test when it is not installed."""
    path = find_tool(name)
    if path is None:
        require_or_skip(f"{name} is not installed (Debian package {debian_package!r})")
        raise AssertionError("unreachable")  # require_or_skip raises
    return path
