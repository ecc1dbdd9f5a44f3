"""The enrolment certificate a node keeps is the control plane's answer to
`greenfed edge enrol`, read unverified when the agent starts. One whose payload is
nested too deeply to decode (msgspec raises RecursionError there, not DecodeError) is
an invalid certificate like any other: logged, not shown in births, and the agent
starts (edge/enrolment_proof.py); it used to stop the agent at start."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from edge.agent.birth import ExecutionFacts
from edge.enrolment_proof import certificate_path, save_certificate
from edge.main import with_enrolment_proof
from shared.base64url import b64url
from shared.enrolment_certificate import CERTIFICATE_PREFIX, MAX_CERTIFICATE_CHARS
from shared.settings import AgentSettings

pytestmark = pytest.mark.timeout(30)

# Deeper than msgspec's recursion guard (Python's default limit is 1,000 frames), and
# short enough for a certificate's 4,096 characters (MAX_CERTIFICATE_CHARS).
NESTING = 1_400


def test_a_certificate_nested_too_deeply_is_not_shown_and_the_agent_starts(
    tmp_path: Path,
) -> None:
    agent = AgentSettings(node_id="orin-1", data_dir=str(tmp_path / "agent-data"))
    payload = b'{"node_id":"orin-1","x":' + b"[" * NESTING + b"]" * NESTING + b"}"
    save_certificate(
        certificate_path(agent), f"{CERTIFICATE_PREFIX}{b64url(payload)}.{b64url(b'sig')}"
    )
    assert len(certificate_path(agent).read_text().strip()) <= MAX_CERTIFICATE_CHARS
    facts = ExecutionFacts()
    with capture_logs() as logs:
        assert with_enrolment_proof(agent, facts) is facts
    assert [entry["event"] for entry in logs] == ["enrolment certificate invalid"]
