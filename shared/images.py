"""OCI image references, as container runtimes read them."""

from __future__ import annotations

from typing import Final

DEFAULT_REGISTRY: Final = "docker.io"


def registry_of(image: str) -> str:
    """The registry an image reference pulls from: its first component when that names a
    host (a '.', a ':', an upper-case letter or localhost, as container runtimes read
    it), else docker.io."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        return first
    return DEFAULT_REGISTRY
