"""Whom a worker runs as: never the agent's user, never root.

Either every worker runs as one configured user (`agent.worker_user`: a name from the
user database or a numeric uid), or each tenant gets a uid (and a group of the same
number) of its own from `agent.worker_uid_range`, the lowest one free, remembered in
`data_dir/state/worker-uids.json` so that a tenant keeps its uid across restarts and
its files stay its own. Tenants with their own uids cannot read each other's files or
signal each other's processes; with one configured user only the sandbox's namespaces
keep them apart (docs/isolation.md).

The uids need no entry in the user database: the worker is told USER and LOGNAME. A
uid the host's user database has (or a group of the same number) is never handed out:
its account's files and processes would be the tenant's.
"""

from __future__ import annotations

import grp
import os
import pwd
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from edge.atomic_files import write_atomically

_MAP = msgspec.json.Decoder(dict[str, int])


class WorkUserError(ValueError):
    """No user a worker may run as: a bad setting, or the uid range is used up."""


@dataclass(frozen=True, slots=True)
class WorkUser:
    uid: int
    gid: int
    name: str  # USER and LOGNAME


def resolve_configured_user(text: str) -> WorkUser:
    """`agent.worker_user`: a user name, or a uid (its group: the user's, else the uid)."""
    try:
        entry = pwd.getpwuid(int(text)) if text.isdigit() else pwd.getpwnam(text)
    except KeyError:
        if not text.isdigit():
            raise WorkUserError(f"agent.worker_user: no user {text!r} on this host") from None
        user = WorkUser(int(text), int(text), f"greenfed-{text}")
    else:
        user = WorkUser(entry.pw_uid, entry.pw_gid, entry.pw_name)
    _check_unprivileged(user.uid, "agent.worker_user")
    return user


def known_to_host(number: int) -> bool:
    """Whether the host's user database has a user with this uid or a group with this
    gid (local files, LDAP, whatever NSS asks)."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(number)
        except KeyError:
            continue
        return True
    return False


def _check_unprivileged(uid: int, setting: str) -> None:
    if uid == 0:
        raise WorkUserError(f"{setting}: workers never run as root")
    if uid == os.geteuid():
        raise WorkUserError(f"{setting}: uid {uid} is the agent's own; workers need another")


class WorkUsers:
    def __init__(
        self,
        *,
        configured: str = "",
        uid_range: tuple[int, int] = (70000, 79999),
        map_path: Path | None = None,
        taken_on_host: Callable[[int], bool] = known_to_host,
    ) -> None:
        """`configured`: one user for every worker (empty: a uid per tenant from
        `uid_range`, kept in `map_path`; None: in memory only); `taken_on_host`: whether
        a number is a uid or gid of the host's, never handed out. Raises WorkUserError."""
        self._configured = resolve_configured_user(configured) if configured else None
        low, high = uid_range
        for uid in (low, high):
            _check_unprivileged(uid, "agent.worker_uid_range")
        if low <= os.geteuid() <= high:
            raise WorkUserError(
                f"agent.worker_uid_range: [{low}, {high}] holds the agent's own uid"
            )
        self._range = uid_range
        self._map_path = map_path
        self._taken_on_host = taken_on_host
        self._uids: dict[str, int] | None = None  # read at the first use
        self._lock = threading.Lock()

    def for_tenant(self, tenant: str) -> WorkUser:
        if self._configured is not None:
            return self._configured
        with self._lock:
            uids = self._load()
            uid = uids.get(tenant)
            if uid is None:
                uid = self._allocate(uids)
                uids[tenant] = uid
                if self._map_path is not None:
                    write_atomically(self._map_path, msgspec.json.encode(uids))
        return WorkUser(uid, uid, f"greenfed-{uid}")

    def _load(self) -> dict[str, int]:
        if self._uids is None:
            self._uids = {}
            if self._map_path is not None:
                try:
                    self._uids = _MAP.decode(self._map_path.read_bytes())
                except FileNotFoundError:
                    pass
                except msgspec.DecodeError as error:
                    raise WorkUserError(f"{self._map_path} is corrupt ({error})") from None
        return self._uids

    def _allocate(self, uids: dict[str, int]) -> int:
        low, high = self._range
        taken = set(uids.values())
        on_host = 0
        for uid in range(low, high + 1):
            if uid in taken:
                continue
            # An account of the host's (an LDAP user, a service) or its group: the tenant
            # would own its files and could signal its processes.
            if self._taken_on_host(uid):
                on_host += 1
                continue
            return uid
        raise WorkUserError(
            f"agent.worker_uid_range [{low}, {high}] is used up by {len(taken)} tenants "
            f"and {on_host} of the host's users or groups: widen it"
        )
