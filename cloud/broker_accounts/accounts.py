"""What enrolment and revocation ask of the broker, whichever broker it is.

A node's account may publish only on its own channels (`{root}/v1/nodes/{node_id}/status`
and the rest but `desired`), read only its own `desired` and `status` topics, and
connect only with its agent's client id (`dynsec_protocol.node_client_id`). The control
plane's own account (the one in `[mqtt]`) must be allowed to administer accounts when
`cloud.broker_accounts = "dynamic-security"`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


class BrokerAccountError(RuntimeError):
    """The broker refused or did not answer an account change; the message says which."""


class ForeignAccountError(BrokerAccountError):
    """The broker has an account of that name that greenfed did not make for the node
    (or reader) under this topic root (the control plane's own, an operator's, another
    fleet's on the same broker): it is never taken over."""


class InvalidAccountNameError(BrokerAccountError):
    """The name can be no account's: a broker username is one topic level (a node id's
    shape), or it would become a wildcard in its ACLs. The caller's mistake, never the
    broker's: retrying it changes nothing."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"{name!r} is not a valid topic level, so no account's name: a letter or "
            "digit, then up to 127 letters, digits, '.', '_' or '-'"
        )
        self.name = name


class AccountsNotManagedError(BrokerAccountError):
    """This control plane does not manage the broker's accounts (`broker_accounts =
    "none"`): the operator makes them by hand."""


@dataclass(frozen=True, slots=True)
class NodeCredentials:
    """What a node (or a telemetry reader) connects with. `password` is None where
    accounts are managed by hand; `client_id`: the one client id the account may use,
    where the broker binds one."""

    username: str
    password: str | None
    client_id: str | None = None


class BrokerAccounts(ABC):
    @abstractmethod
    async def provision(self, node_id: str) -> NodeCredentials:
        """Create (or reset the password of, and re-enable) the node's account, with a
        role that confines it to its own topics, bound to its agent's client id. Raises
        `BrokerAccountError`."""

    @abstractmethod
    async def revoke(self, node_id: str) -> None:
        """Disable the node's account at once (its connection is dropped). Idempotent;
        raises `BrokerAccountError`."""

    @abstractmethod
    async def provision_reader(self, name: str) -> NodeCredentials:
        """Create (or reset the password of, and re-enable) a third party's read-only
        account: every node's telemetry and births, never `desired`, no publishing.
        Raises `BrokerAccountError` (`ForeignAccountError` for a name some other account
        holds, `InvalidAccountNameError` for a name no account can have)."""

    @abstractmethod
    async def revoke_reader(self, name: str) -> None:
        """Disable a reader's account (its connection is dropped). Idempotent; raises
        `BrokerAccountError` (`InvalidAccountNameError` for a name no account can have)."""

    async def close(self) -> None:  # noqa: B027 (optional: most hold nothing)
        """Release whatever connection the implementation holds."""


class ManualAccounts(BrokerAccounts):
    """`cloud.broker_accounts = "none"`: the operator runs the broker's accounts; nodes
    keep the MQTT credentials already in their settings."""

    async def provision(self, node_id: str) -> NodeCredentials:
        return NodeCredentials(username=node_id, password=None)

    async def revoke(self, node_id: str) -> None:
        return None

    async def provision_reader(self, name: str) -> NodeCredentials:
        raise AccountsNotManagedError(
            "this control plane does not manage the broker's accounts "
            '(cloud.broker_accounts = "none"): give the subscriber an account on the '
            "broker by hand, reading only <root>/v1/nodes/+/telemetry and +/status"
        )

    async def revoke_reader(self, name: str) -> None:
        await self.provision_reader(name)
