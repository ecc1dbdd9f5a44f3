"""Taints as people write them (shared/taints.py) and in the agent's settings."""

from __future__ import annotations

import pytest

from shared.errors import FieldError
from shared.messages import NodeTaint
from shared.settings import AgentSettings
from shared.taints import parse_taint


def test_key_value_and_effect_with_the_kubernetes_defaults() -> None:
    assert parse_taint("dedicated=inference:NoSchedule") == ("dedicated", "inference", "NoSchedule")
    assert parse_taint("team=risk") == ("team", "risk", "NoSchedule")
    assert parse_taint("greenfed.io/maintenance:PreferNoSchedule") == (
        "greenfed.io/maintenance",
        "",
        "PreferNoSchedule",
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("dedicated=inference:NoExecute", "effect must be one of"),
        ("=inference", "the key must be"),
        ("bad key", "the key must be"),
        ("k=a b", "no '=', ':' or spaces"),
    ],
)
def test_a_bad_taint_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_taint(text)


def test_the_agents_settings_name_the_key_at_fault_and_feed_the_birth() -> None:
    with pytest.raises(FieldError, match="effect must be one of") as refused:
        AgentSettings(taints=("gpu:Sometimes",))
    assert refused.value.path[-1] == "taints"
    settings = AgentSettings(taints=("dedicated=camera:PreferNoSchedule",))
    assert settings.node_taints() == (
        NodeTaint(key="dedicated", value="camera", effect="PreferNoSchedule"),
    )
