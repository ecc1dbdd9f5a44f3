"""This node's sealing key: the X25519 key pair the control plane seals job secrets to
(shared/sealing.py).

It lives in `<agent data_dir>/state/sealing.key`, PEM, mode 0600, made by
`greenfed edge enrol` (which sends the public half with the enrolment, so the control
plane knows the key the node enrolled with) or at the agent's first start. A node that
loses it (reimaged, data directory wiped) makes a new one, whose public half no longer
matches the enrolled one: it gets no secrets until it enrols again.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final

from shared.key_files import load_or_create_key
from shared.pem_keys import new_pem_key, parse_pem_key
from shared.settings import AgentSettings

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

SETTING: Final = "agent.data_dir"
FILE_NAME: Final = "sealing.key"


def sealing_key_path(settings: AgentSettings) -> Path:
    return settings.resolved_data_dir() / "state" / FILE_NAME


def load_or_create_sealing_key(path: Path) -> X25519PrivateKey:
    return load_or_create_key(path, setting=SETTING, make=_new, parse=_parse)


def _new() -> bytes:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    return new_pem_key(X25519PrivateKey.generate)


def _parse(data: bytes) -> X25519PrivateKey:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    return parse_pem_key(data, X25519PrivateKey, "the sealing key")  # type: ignore[type-abstract]
