"""Which tenants' registry credentials brought an image to this node.

Every tenant's images share the container runtime's one store, and a runtime asked for
an image it holds runs it without asking its registry. So an image one tenant pulled
from a private registry with its own credentials would run for any tenant that names
it with `if-not-present` or `never`. As Kubernetes' AlwaysPullImages admission does, a
job of another tenant pulls such an image again, with its own credentials (none: the
registry decides whether it may), and cannot use it with `never`.

What is owned is the image's repository (shared/images.py `repository_of`), never the
reference as a job spelled it: the store runs the same image for `x`, `x:latest` and
`x@sha256:...`, and a registry that gives one tag of a repository gives them all.

Kept in `data_dir/state/image-owners.json`, so that a restarted agent still knows; a
file that cannot be read is started afresh (logged): the images it named are then
pulled again only by tenants that give credentials, as on a node that never had them.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from edge.atomic_files import write_atomically
from shared.images import repository_of
from shared.lean_logs import get_logger

_log = get_logger("greenfed.sandbox")
# Images remembered at most (each with the tenants whose credentials pulled it): the
# oldest are forgotten first, and a forgotten one is pulled again by its next tenant.
MAX_IMAGES = 4096
_DECODER = msgspec.json.Decoder(dict[str, list[str]])


class ImageOwners:
    """Image repository -> the tenants whose credentials pulled it here."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._owners: dict[str, list[str]] = {}
        if path is not None:
            try:
                saved = _DECODER.decode(path.read_bytes())
            except FileNotFoundError:
                saved = {}
            except (OSError, msgspec.DecodeError) as error:
                _log.warning(
                    "image owners not read: started afresh", path=str(path), error=str(error)
                )
                saved = {}
            # An older agent kept references as jobs spelled them: merged by repository.
            for image, tenants in saved.items():
                owners = self._owners.setdefault(repository_of(image), [])
                owners += [tenant for tenant in tenants if tenant not in owners]

    def others_than(self, image: str, tenant: str) -> list[str]:
        """The other tenants whose credentials brought `image`'s repository here."""
        owners = self._owners.get(repository_of(image), ())
        return [owner for owner in owners if owner != tenant]

    def record(self, image: str, tenant: str) -> None:
        """`tenant`'s credentials are about to pull `image` here."""
        repository = repository_of(image)
        owners = self._owners.pop(repository, [])
        if tenant not in owners:
            owners.append(tenant)
        self._owners[repository] = owners  # the most recent last
        while len(self._owners) > MAX_IMAGES:
            del self._owners[next(iter(self._owners))]
        if self._path is not None:
            try:
                write_atomically(self._path, msgspec.json.encode(self._owners))
            except OSError as error:  # a full disk: known until the agent restarts
                _log.warning("image owners not saved", path=str(self._path), error=str(error))
