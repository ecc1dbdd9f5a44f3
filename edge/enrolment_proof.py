"""This node's enrolment certificate and the proof its births carry with it
(shared/enrolment_certificate.py): what lets a control plane that lost its store
re-admit the node without anyone visiting it.

`greenfed edge enrol` keeps the certificate the control plane answered with in
`<agent data_dir>/state/enrolment.cert`, beside the sealing key it names. At start the
agent reads both; a certificate that does not name this node or this sealing key (the
key was made anew, the data directory copied from another node) is not shown: the node
then proves nothing, and only enrolling it again helps.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from shared.enrolment_certificate import (
    CertificateError,
    certificate_head,
    identity_proof,
)
from shared.key_files import make_private_dir
from shared.lean_logs import get_logger
from shared.sealing import SealingKeyError, load_public_key, public_key_text
from shared.settings import AgentSettings

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

FILE_NAME: Final = "enrolment.cert"
_log = get_logger("greenfed.agent")


def certificate_path(settings: AgentSettings) -> Path:
    return settings.resolved_data_dir() / "state" / FILE_NAME


def save_certificate(path: Path, certificate: str) -> None:
    """Write it atomically (it is public: no secret in it)."""
    make_private_dir(path.parent)  # the agent's state directory: the sealing key's too
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(certificate + "\n", encoding="ascii")
    os.replace(partial, path)


@dataclass(frozen=True, slots=True)
class EnrolmentProof:
    """The certificate a birth shows and how to prove it for one agent instance."""

    certificate: str
    sealing_key: X25519PrivateKey

    def proof(self, instance_id: str) -> str:
        head = certificate_head(self.certificate)
        return identity_proof(
            self.sealing_key,
            load_public_key(head.exchange_key),
            instance_id=instance_id,
            certificate=self.certificate,
        )


def load_enrolment_proof(
    path: Path, node_id: str, sealing_key: X25519PrivateKey
) -> EnrolmentProof | None:
    """The node's certificate with its key, or None (no certificate, or not this node's
    or this key's: logged once, at start)."""
    try:
        certificate = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        _log.warning("enrolment certificate unreadable", path=str(path), error=str(error))
        return None
    try:
        head = certificate_head(certificate)
        load_public_key(head.exchange_key)
    # RecursionError: a payload nested too deeply for msgspec (certificate_head reads it
    # unverified; the control plane's enrolment answer is where it came from).
    except (CertificateError, SealingKeyError, RecursionError) as error:
        _log.warning("enrolment certificate invalid", path=str(path), error=str(error))
        return None
    if head.node_id != node_id or head.sealing_public_key != public_key_text(sealing_key):
        _log.warning(
            "enrolment certificate is not this node's: not shown (enrol the node again)",
            path=str(path),
            certificate_node_id=head.node_id,
            node_id=node_id,
        )
        return None
    return EnrolmentProof(certificate, sealing_key)
