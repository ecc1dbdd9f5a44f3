"""`[scheduling.cohorts.<name>]` and `scheduling.fair_share_half_life_s`: read from
TOML; a typo, an unknown kind or a cycle of parents is refused naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.settings import CohortSettings, ConfigError, load_settings

TREE = """
[scheduling]
fair_share_half_life_s = 3600

[scheduling.cohorts.org]
quotas = { gpu = 32 }

[scheduling.cohorts.research]
parent = "org"
borrowing_limit = { gpu = 8 }
lending_limit = { gpu = 2, cpu = 16 }
"""


def test_the_cohort_tree_and_half_life_are_read(tmp_path: Path) -> None:
    path = tmp_path / "greenfed.toml"
    path.write_text(TREE)
    scheduling = load_settings(path, {}).scheduling
    assert scheduling.fair_share_half_life_s == 3600
    assert scheduling.cohorts == {
        "org": CohortSettings(quotas={"gpu": 32}),
        "research": CohortSettings(
            parent="org", borrowing_limit={"gpu": 8}, lending_limit={"gpu": 2, "cpu": 16}
        ),
    }
    assert load_settings(None, {}).scheduling.fair_share_half_life_s == 7 * 86400


@pytest.mark.parametrize(
    ("text", "named", "reason"),
    [
        ("\nborowing_limit = { gpu = 1 }", "borowing_limit", "unknown key"),
        ("\nquotas = { tpu = 1 }", "quotas", "tpu"),
        ("\nquotas = { gpu = -1 }", "quotas", ">= 0"),
    ],
)
def test_a_bad_cohort_key_is_refused_naming_it(
    tmp_path: Path, text: str, named: str, reason: str
) -> None:
    path = tmp_path / "greenfed.toml"
    path.write_text(TREE + text)
    with pytest.raises(ConfigError) as refused:
        load_settings(path, {})
    assert named in str(refused.value)
    assert reason in str(refused.value)
    assert str(path) in str(refused.value)


def test_parents_that_form_a_cycle_are_refused_naming_the_parent(tmp_path: Path) -> None:
    path = tmp_path / "greenfed.toml"
    path.write_text(TREE.replace("quotas = { gpu = 32 }", 'parent = "research"'))
    with pytest.raises(ConfigError) as refused:
        load_settings(path, {})
    assert "cohorts.org.parent: parents form a cycle: org -> research -> org" in str(refused.value)
