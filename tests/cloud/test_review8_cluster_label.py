"""Only the control plane's cluster bridge declares a node's cluster (`greenfed.io/cluster`):
a node of a cluster registered with accepts_secrets is sealed secrets at isolation
"none" (cloud/fleet/secret_receivers.py), so an agent declaring the label (its settings'
`labels`) would have had other tenants' secrets sealed to it at "none". Its births are
refused at the boundary, and its settings say so before it starts."""

from __future__ import annotations

import pytest

from cloud.fleet.plausibility import Implausible, check_status
from shared.errors import FieldError
from shared.placement_names import CLUSTER_LABEL
from shared.settings import AgentSettings
from tests.cloud.test_plausibility import LIMITS, NOW_S, birth


def test_a_birth_declaring_a_cluster_is_refused() -> None:
    violation = check_status(birth(labels={CLUSTER_LABEL: "lab"}), LIMITS, NOW_S)
    assert violation is not None
    assert violation.reason == Implausible.INVALID_NAME
    assert violation.field == f"$.labels.{CLUSTER_LABEL}"
    assert check_status(birth(labels={"greenfed.io/rack": "r1"}), LIMITS, NOW_S) is None


def test_an_agent_may_not_declare_a_cluster_in_its_settings() -> None:
    with pytest.raises(FieldError) as refused:
        AgentSettings(labels={CLUSTER_LABEL: "lab"})
    assert CLUSTER_LABEL in str(refused.value)
    assert "reserved" in str(refused.value)
