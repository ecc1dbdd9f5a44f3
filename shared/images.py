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


def qualified(image: str) -> str:
    """The reference with its registry spelled out (and Docker Hub's `library/` for a
    one-word name), as greenfed reads it. A runtime resolves a short name against any
    local image of the same path whoever pulled it (podman runs a local
    `evil.example/acme/trainer:2` for `acme/trainer:2`): a node is only ever asked for
    qualified names."""
    if registry_of(image) != DEFAULT_REGISTRY or image.startswith(f"{DEFAULT_REGISTRY}/"):
        return image
    if "/" in image:
        return f"{DEFAULT_REGISTRY}/{image}"
    return f"{DEFAULT_REGISTRY}/library/{image}"
