"""An error inside a table keyed by name (`[scheduling.cohorts.<name>]`,
`[signals.static_table.<zone>]`) names the key, where msgspec says only `[...]`."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.settings import ConfigError, load_settings

NO_ENV: dict[str, str] = {}


def refusal(tmp_path: Path, text: str) -> ConfigError:
    path = tmp_path / "greenfed.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_settings(path, NO_ENV)
    return refused.value


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        (
            '[scheduling.cohorts.lab]\nparnt = "x"\n[scheduling.cohorts.other]\n',
            "scheduling.cohorts.lab.parnt",
            "unknown key",
        ),
        (
            '[scheduling.cohorts.lab]\n[scheduling.cohorts.other]\nparnt = "x"\n',
            "scheduling.cohorts.other.parnt",
            "unknown key",
        ),
        (
            "[signals.static_table.DE]\ncarbon_g_per_kwh = 300\n"
            "[signals.static_table.ZA]\ncarbon_g_per_kwh = -1\n",
            "signals.static_table.ZA.carbon_g_per_kwh",
            "Expected `float` >= 0.0",
        ),
        (  # a table in a table keyed by name: both keys
            "[scheduling.cohorts.lab]\n[scheduling.cohorts.other.quotas]\ngpu = 2\ncpu = -1\n",
            "scheduling.cohorts.other.quotas.cpu",
            "Expected `int` >= 0",
        ),
        (  # a key that is not bare is quoted, as TOML writes it
            '[scheduling.cohorts."lab.eu"]\nparnt = "x"\n',
            'scheduling.cohorts."lab.eu".parnt',
            "unknown key",
        ),
    ],
)
def test_an_error_in_a_named_table_names_its_key(
    tmp_path: Path, text: str, key: str, reason: str
) -> None:
    refused = refusal(tmp_path, text)
    assert refused.key == key
    assert str(refused) == f"{tmp_path / 'greenfed.toml'}: {key}: {reason}"


def test_an_error_in_a_named_table_from_the_environment_names_its_key() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(None, {"GREENFED_SCHEDULING__COHORTS": '{ lab = { parnt = "x" } }'})
    assert str(refused.value) == (
        "environment variable GREENFED_SCHEDULING__COHORTS: scheduling.cohorts.lab.parnt: "
        "unknown key"
    )


def test_an_error_about_entries_together_keeps_the_table(tmp_path: Path) -> None:
    refused = refusal(
        tmp_path,
        '[scheduling.cohorts.a]\nparent = "b"\n[scheduling.cohorts.b]\nparent = "a"\n',
    )
    assert "parents form a cycle" in str(refused)
