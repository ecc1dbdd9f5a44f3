"""Whether an account already on the broker is this fleet's own, for one name.

A node id is its broker username, and so is a telemetry reader's name: provisioning
resets the account's password and hands it out, so a join token (or an admin's `greenfed
mqtt accounts create`) must never reach an account that greenfed did not make for that
name under this topic root: the control plane's own, an operator's, or another fleet's
on the same broker. An account is taken as this fleet's only on positive evidence:

- it is in no group (a Mosquitto group's roles, `admin` among them, apply to its clients
  without showing in their own roles);
- it holds a role, and none but the one greenfed gives that name under this root (or the
  one releases before root-scoped role names gave it, `role_for_root`);
- it is bound to the client id greenfed binds it to under this root
  (`greenfed-agent-{node_id}@{root}`, `greenfed-reader-{name}@{root}`): the root is in
  it, so another fleet's account of the same name is refused. Releases before client
  ids were bound left accounts unbound: only the default root takes one of those, and
  only holding exactly its role.
"""

from __future__ import annotations

from dataclasses import dataclass

from cloud.broker_accounts.dynsec_protocol import (
    UNSCOPED_READER_ROLE,
    ClientInfo,
    node_client_id,
    node_role_name,
    reader_client_id,
    reader_role_name,
    unscoped_node_role_name,
)
from shared.topics import Topics


@dataclass(frozen=True, slots=True)
class OwnAccount:
    """What this fleet's account of one name looks like on the broker."""

    # For messages: "a greenfed node's", "a greenfed telemetry reader's".
    whose: str
    client_id: str
    # The role this release gives it, and the one releases before root-scoped role
    # names gave it (the same name on the default root).
    role: str
    unscoped_role: str


def own_node_account(topics: Topics, node_id: str) -> OwnAccount:
    return OwnAccount(
        whose="a greenfed node's",
        client_id=node_client_id(topics, node_id),
        role=node_role_name(topics, node_id),
        unscoped_role=unscoped_node_role_name(node_id),
    )


def own_reader_account(topics: Topics, name: str) -> OwnAccount:
    return OwnAccount(
        whose="a greenfed telemetry reader's",
        client_id=reader_client_id(topics, name),
        role=reader_role_name(topics),
        unscoped_role=UNSCOPED_READER_ROLE,
    )


def foreign_reason(found: ClientInfo, own: OwnAccount) -> str | None:
    """Why `found` is not `own` (for the refusal's message); None when it is."""
    if found.groups:
        groups = ", ".join(sorted(group.groupname for group in found.groups))
        return f"it is in the group(s) {groups}"
    roles = {ref.rolename for ref in found.roles}
    if not roles:
        return "it has no role"
    others = roles - {own.role, own.unscoped_role}
    if others:
        return f"it has the role(s) {', '.join(sorted(others))}"
    if found.clientid == own.client_id:
        return None
    if not found.clientid:
        made_before_client_ids = own.role == own.unscoped_role and roles == {own.role}
        return None if made_before_client_ids else "it is bound to no client id"
    return f"it is bound to the client id {found.clientid!r}, not {own.client_id!r}"
