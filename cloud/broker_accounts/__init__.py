"""Node accounts on the MQTT broker: who may connect, and which topics each may use.

| question | file |
|---|---|
| what enrolment asks of a broker | `accounts.py` (`BrokerAccounts`) |
| how Mosquitto (or the embedded broker) is told | `dynamic_security.py` |
| the operator manages accounts by hand | `accounts.py` (`ManualAccounts`) |
"""
