"""Node accounts on the MQTT broker: who may connect, and which topics each may use.

| question | file |
|---|---|
| what enrolment asks of a broker | `accounts.py` (`BrokerAccounts`) |
| how Mosquitto (or the embedded broker) is told | `dynamic_security.py` |
| the commands and a node's ACLs, on the wire | `dynsec_protocol.py` |
| whether an account already there is this fleet's own | `ownership.py` |
| the operator manages accounts by hand | `accounts.py` (`ManualAccounts`) |
| a third party's read-only account, over REST | `views.py`, cloud/api/mqtt_accounts.py |
| which one a control plane uses | `broker_accounts_from` below |
"""

from __future__ import annotations

from cloud.broker_accounts.accounts import (
    AccountsNotManagedError,
    BrokerAccountError,
    BrokerAccounts,
    ForeignAccountError,
    InvalidAccountNameError,
    ManualAccounts,
    NodeCredentials,
)
from shared.settings import Settings

__all__ = [
    "AccountsNotManagedError",
    "BrokerAccountError",
    "BrokerAccounts",
    "ForeignAccountError",
    "InvalidAccountNameError",
    "ManualAccounts",
    "NodeCredentials",
    "broker_accounts_from",
]


def broker_accounts_from(settings: Settings) -> BrokerAccounts:
    """The accounts seam `cloud.broker_accounts` names; nothing connects until first use."""
    if settings.cloud.broker_accounts == "dynamic-security":
        from cloud.broker_accounts.dynamic_security import DynamicSecurityAccounts

        return DynamicSecurityAccounts(settings.mqtt)
    return ManualAccounts()
