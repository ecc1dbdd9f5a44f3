"""Which account already on the broker is this fleet's own (cloud/broker_accounts/
ownership.py), without a broker: only positive evidence makes it so."""

from __future__ import annotations

from cloud.broker_accounts.dynsec_protocol import ClientInfo, GroupRef, RoleRef, node_client_id
from cloud.broker_accounts.ownership import foreign_reason, own_node_account, own_reader_account
from shared.topics import DEFAULT_TOPIC_ROOT, Topics


def test_only_positive_evidence_makes_an_account_a_nodes() -> None:
    """The rule itself (cloud/broker_accounts/ownership.py), for each way an account
    can differ from the one greenfed makes."""
    topics = Topics("fleet-a")
    own = own_node_account(topics, "edge-1")
    ours = ClientInfo(
        username="edge-1", clientid=own.client_id, roles=(RoleRef(rolename=own.role),)
    )
    assert foreign_reason(ours, own) is None
    # Made before role names carried the root: still bound to this root's agent.
    unscoped = RoleRef(rolename="greenfed-node-edge-1")
    assert (
        foreign_reason(ClientInfo("edge-1", clientid=own.client_id, roles=(unscoped,)), own) is None
    )
    refused = {
        "in a group": ClientInfo(
            "edge-1",
            clientid=own.client_id,
            roles=(RoleRef(rolename=own.role),),
            groups=(GroupRef(groupname="operators"),),
        ),
        "no role": ClientInfo("edge-1", clientid=own.client_id),
        "another role too": ClientInfo(
            "edge-1",
            clientid=own.client_id,
            roles=(RoleRef(rolename=own.role), RoleRef(rolename="admin")),
        ),
        "another fleet's": ClientInfo(
            "edge-1",
            clientid=node_client_id(Topics("fleet-b"), "edge-1"),
            roles=(unscoped,),
        ),
        "unbound outside the default root": ClientInfo("edge-1", roles=(unscoped,)),
    }
    for case, found in refused.items():
        assert foreign_reason(found, own) is not None, case
    default = own_node_account(Topics(DEFAULT_TOPIC_ROOT), "edge-1")
    assert foreign_reason(ClientInfo("edge-1", roles=(unscoped,)), default) is None


def test_role_names_carry_the_root_except_the_default_roots() -> None:
    default, other = Topics(DEFAULT_TOPIC_ROOT), Topics("fleet-a")
    assert own_node_account(default, "edge-1").role == "greenfed-node-edge-1"
    assert own_node_account(other, "edge-1").role == "greenfed-node-edge-1@fleet-a"
    assert own_reader_account(default, "dash").role == "greenfed-telemetry-reader"
    assert own_reader_account(other, "dash").role == "greenfed-telemetry-reader@fleet-a"
