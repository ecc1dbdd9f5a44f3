"""Which uids tenants get (edge/sandbox/users.py): never one of the host's own users or
groups, whose files and processes the tenant would then own."""

from __future__ import annotations

import grp
import pwd

import pytest

from edge.sandbox.users import WorkUserError, WorkUsers


def test_a_uid_or_gid_the_host_has_is_never_a_tenants() -> None:
    """An LDAP user or a service account inside the range: a tenant given its uid would
    own its files and could signal its processes; given its gid, read its group's."""
    host_users, host_groups = {70000}, {70001}
    users = WorkUsers(
        uid_range=(70000, 70010),
        taken_on_host=lambda number: number in host_users or number in host_groups,
    )
    assert users.for_tenant("acme").uid == 70002
    assert users.for_tenant("globex").uid == 70003


def test_a_range_used_up_by_the_hosts_own_users_says_so() -> None:
    users = WorkUsers(uid_range=(70000, 70002), taken_on_host=lambda number: number != 70001)
    assert users.for_tenant("acme").uid == 70001
    with pytest.raises(WorkUserError, match="used up by 1 tenants and 2 of the host's users"):
        users.for_tenant("globex")


def test_the_hosts_user_database_is_what_is_asked() -> None:
    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user nobody on this host")
    after = nobody + 1
    if _known(after):
        pytest.skip(f"uid {after} is the host's too")
    assert WorkUsers(uid_range=(nobody, after)).for_tenant("acme").uid == after


def test_a_group_of_the_hosts_alone_keeps_its_number_from_tenants() -> None:
    """A group with no user of the same number (Debian's `users`, 100) counts too: the
    tenant's gid would be that group's."""
    uids = {entry.pw_uid for entry in pwd.getpwall()}
    lone = next(
        (
            group.gr_gid
            for group in grp.getgrall()
            if group.gr_gid and group.gr_gid not in uids and not _known(group.gr_gid + 1)
        ),
        None,
    )
    if lone is None:
        pytest.skip("no group of the host's without a user of its number, and one free after")
    assert WorkUsers(uid_range=(lone, lone + 1)).for_tenant("acme").uid == lone + 1


def _known(number: int) -> bool:
    """What the test knows of the host's user database, asked by itself."""
    try:
        pwd.getpwuid(number)
    except KeyError:
        try:
            grp.getgrgid(number)
        except KeyError:
            return False
    return True
