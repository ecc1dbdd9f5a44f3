"""OCI image references, as container runtimes read them."""

from __future__ import annotations

from typing import Final

DEFAULT_REGISTRY: Final = "docker.io"
# Docker Hub's older name, which runtimes read as docker.io.
LEGACY_DEFAULT_REGISTRY: Final = "index.docker.io"


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


def repository_of(image: str) -> str:
    """The repository a reference names, spelled one way whatever way the reference
    spells it: its tag and digest dropped (a runtime's store finds one image by tag,
    `:latest` left out or not, or by digest), its registry spelled out, lower-case and
    Docker Hub's long forms as `docker.io/library/...`. A registry gives every tag
    and digest of a repository to whoever it gives one: what tenants are told apart by."""
    name = image.partition("@")[0]
    tag_at = name.rfind(":")
    if tag_at > name.rfind("/"):  # a ':' in the registry's component is its port
        name = name[:tag_at]
    registry, _, path = qualified(name).partition("/")
    registry = registry.lower()
    if registry == LEGACY_DEFAULT_REGISTRY:
        registry = DEFAULT_REGISTRY
    if registry == DEFAULT_REGISTRY and "/" not in path:
        path = f"library/{path}"
    return f"{registry}/{path}"
