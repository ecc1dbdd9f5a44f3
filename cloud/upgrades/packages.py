"""Publishing an agent package: a greenfed wheel, checked (`shared/agent_packages.py`),
signed with the key `desired` documents are signed with, kept in the store so that every
replica serves it, and offered to agents at a signed URL (as models are:
cloud/models/signing.py)."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from cloud.models.signing import ModelUrlSigner
from cloud.store.agent_upgrades import AgentPackageRecord
from cloud.upgrades.views import PackageView
from shared.agent_packages import inspect_wheel_bytes, sign_package
from shared.messages import AgentUpgrade

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

# What the URL signer signs for a package: no model id has a slash.
_URL_SUBJECT = "agent-package/{version}"


def package_record(
    content: bytes, key: Ed25519PrivateKey, *, published_by: str, now: float | None = None
) -> AgentPackageRecord:
    """The record of the wheel in `content`, signed; raises `PackageError`."""
    facts = inspect_wheel_bytes(content)
    return AgentPackageRecord(
        version=facts.version,
        sha256=facts.sha256,
        size_bytes=facts.size_bytes,
        signature=sign_package(facts, key),
        published_at=time.time() if now is None else now,
        published_by=published_by,
    )


def package_view(record: AgentPackageRecord) -> PackageView:
    return PackageView(**dataclasses.asdict(record))  # the same facts, field for field


def package_url_signature(signer: ModelUrlSigner, version: str, sha256: str) -> str:
    return signer.signature(_URL_SUBJECT.format(version=version), sha256)


def package_url(signer: ModelUrlSigner, version: str, sha256: str) -> str:
    return (
        f"{signer.base_url}/v1/agent-packages/{version}/wheel"
        f"?sig={package_url_signature(signer, version, sha256)}"
    )


def verify_package_url(signer: ModelUrlSigner, version: str, sha256: str, signature: str) -> bool:
    return signer.verify(_URL_SUBJECT.format(version=version), sha256, signature)


def agent_upgrade(
    record: AgentPackageRecord,
    signer: ModelUrlSigner,
    *,
    rollout_id: str,
    health_timeout_s: float,
) -> AgentUpgrade:
    """What a node's `desired` document says to run this package."""
    return AgentUpgrade(
        version=record.version,
        rollout_id=rollout_id,
        url=package_url(signer, record.version, record.sha256),
        sha256=record.sha256,
        size_bytes=record.size_bytes,
        signature=record.signature,
        health_timeout_s=health_timeout_s,
    )
