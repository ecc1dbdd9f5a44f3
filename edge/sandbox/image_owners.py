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

Forgetting must never make an image look public: a tenant that could push another's
entry out (by naming many images with credentials, bogus ones too: a job's
repository is recorded before its pull, which may fail) would then run the other's
image from the store unasked. So the record of owners is bounded (`MAX_IMAGES`,
the least recently recorded pushed out first), and a repository pushed out leaves a
mark behind: one bit of a fixed table of `FORGOTTEN_BUCKETS`, picked by a hash of
its name. Every repository whose bit is set, recorded or not, is taken for one an
unknown tenant owns: each job pulls it again, on its own credentials, and none may
use it with `never`. Repositories that share a bit with a forgotten one are pulled
again for nothing (and refused with `never`): the price of a table bounded in
memory (8 KiB; in the file only once a bit is set). It only fills up (all bits set:
every image is pulled again by every job), never empties by itself: an operator who
emptied the image store may delete the file to start afresh.

Kept in `data_dir/state/image-owners.json`, so that a restarted agent still knows. A
file that cannot be read, and one this agent could not write (a full disk: it is
emptied, so that a restart cannot read it), know nothing of whose the store's images
are: every bit is set, and every image is pulled again by its next tenant.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec

from edge.atomic_files import write_atomically
from shared.images import repository_of
from shared.lean_logs import get_logger

_log = get_logger("greenfed.sandbox")
# Repositories remembered at most, each with the tenants whose credentials pulled it.
MAX_IMAGES = 4096
# Bits of the table that marks where a repository was forgotten (a power of two).
FORGOTTEN_BUCKETS = 1 << 16
_FORGOTTEN_BYTES = FORGOTTEN_BUCKETS // 8


class _Saved(msgspec.Struct, forbid_unknown_fields=True):
    owners: dict[str, list[str]]
    forgotten: bytes = b""  # the table's bits; none set when empty


_SAVED_DECODER = msgspec.json.Decoder(_Saved)
# What agents before the table wrote: repository (or reference) -> tenants.
_OLDER_DECODER = msgspec.json.Decoder(dict[str, list[str]])
_ENCODER = msgspec.json.Encoder()


def _bucket(repository: str) -> int:
    """The table's bit for `repository`: the same on every start of every agent."""
    digest = hashlib.sha256(repository.encode()).digest()
    return int.from_bytes(digest[:4], "big") % FORGOTTEN_BUCKETS


def _decoded(data: bytes) -> _Saved:
    try:
        return _SAVED_DECODER.decode(data)
    except msgspec.DecodeError:
        return _Saved(owners=_OLDER_DECODER.decode(data))


class ImageOwners:
    """Image repository -> the tenants whose credentials pulled it here, and where a
    repository was forgotten."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._owners: dict[str, list[str]] = {}
        self._forgotten = bytearray(_FORGOTTEN_BYTES)
        if path is None:
            return
        try:
            saved = _decoded(path.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, msgspec.DecodeError) as error:
            _log.warning(
                "image owners not read: every image is pulled again by its next tenant",
                path=str(path),
                error=str(error),
            )
            self._forget_everything()
            return
        if saved.forgotten and len(saved.forgotten) != _FORGOTTEN_BYTES:
            _log.warning(
                "image owners' forgotten table has the wrong size: every image is pulled "
                "again by its next tenant",
                path=str(path),
                size_bytes=len(saved.forgotten),
            )
            self._forget_everything()
        elif saved.forgotten:
            self._forgotten[:] = saved.forgotten
        # An older agent kept references as jobs spelled them: merged by repository.
        for image, tenants in saved.owners.items():
            owners = self._owners.setdefault(repository_of(image), [])
            owners += [tenant for tenant in tenants if tenant not in owners]
        self._forget_oldest()

    def others_than(self, image: str, tenant: str) -> list[str]:
        """The other tenants known to have brought `image`'s repository here (what
        decides is `owned_by_others`, which also counts the forgotten ones)."""
        owners = self._owners.get(repository_of(image), ())
        return [owner for owner in owners if owner != tenant]

    def owned_by_others(self, image: str, tenant: str) -> bool:
        """Whether `image`'s repository may have come here on credentials other than
        `tenant`'s: another tenant's, or ones this node has forgotten."""
        repository = repository_of(image)
        owners = self._owners.get(repository, ())
        return any(owner != tenant for owner in owners) or self._was_forgotten(repository)

    def record(self, image: str, tenant: str) -> None:
        """`tenant`'s credentials are about to pull `image` here."""
        repository = repository_of(image)
        owners = self._owners.pop(repository, [])
        if tenant not in owners:
            owners.append(tenant)
        self._owners[repository] = owners  # the most recent last
        self._forget_oldest()
        if self._path is not None:
            self._save(self._path)

    def _was_forgotten(self, repository: str) -> bool:
        bucket = _bucket(repository)
        return bool(self._forgotten[bucket >> 3] & (1 << (bucket & 7)))

    def _forget_oldest(self) -> None:
        """Down to `MAX_IMAGES`, each repository pushed out marked as forgotten."""
        while len(self._owners) > MAX_IMAGES:
            repository = next(iter(self._owners))
            del self._owners[repository]
            bucket = _bucket(repository)
            self._forgotten[bucket >> 3] |= 1 << (bucket & 7)

    def _forget_everything(self) -> None:
        self._forgotten[:] = b"\xff" * _FORGOTTEN_BYTES

    def _save(self, path: Path) -> None:
        forgotten = bytes(self._forgotten) if any(self._forgotten) else b""
        try:
            write_atomically(path, _ENCODER.encode(_Saved(self._owners, forgotten)))
            return
        except OSError as error:  # a full disk: known until the agent restarts
            _log.warning("image owners not saved", path=str(path), error=str(error))
        # What the file says now is less than this agent knows: once emptied (which
        # takes no space), a restarted agent cannot read it and forgets everything.
        try:
            with open(path, "wb"):
                pass
        except OSError as error:
            _log.warning("image owners not emptied", path=str(path), error=str(error))
