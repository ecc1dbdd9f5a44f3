"""A cycle of cohort parents names the key at fault and where it was set: the
environment variable, the file, or a key whose name needs quoting."""

from pathlib import Path

import pytest

from shared.settings import ConfigError, load_settings

CYCLE_IN_ENV = {"GREENFED_SCHEDULING__COHORTS": '{ lab = { parent = "lab" } }'}


def test_a_cycle_set_by_the_environment_names_the_variable() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(None, CYCLE_IN_ENV)
    assert str(refused.value) == (
        "environment variable GREENFED_SCHEDULING__COHORTS: scheduling.cohorts.lab.parent: "
        "parents form a cycle: lab -> lab"
    )
    assert refused.value.key == "scheduling.cohorts.lab.parent"


def test_a_cycle_set_by_the_environment_is_not_blamed_on_the_file(tmp_path: Path) -> None:
    path = tmp_path / "greenfed.toml"
    path.write_text("[scheduling]\ninterval_s = 5.0\n")
    with pytest.raises(ConfigError) as refused:
        load_settings(path, CYCLE_IN_ENV)
    assert str(refused.value).startswith(
        "environment variable GREENFED_SCHEDULING__COHORTS: scheduling.cohorts.lab.parent: "
    )
    assert str(path) not in str(refused.value)


def test_a_cycle_set_in_the_file_names_the_file_and_the_key(tmp_path: Path) -> None:
    path = tmp_path / "greenfed.toml"
    path.write_text(
        '[scheduling.cohorts.org]\nparent = "research"\n'
        '[scheduling.cohorts.research]\nparent = "org"\n'
    )
    with pytest.raises(ConfigError) as refused:
        load_settings(path, {})
    assert str(refused.value) == (
        f"{path}: scheduling.cohorts.org.parent: parents form a cycle: org -> research -> org"
    )
    assert refused.value.key == "scheduling.cohorts.org.parent"


def test_a_cohort_name_with_a_dot_is_quoted_in_the_key(tmp_path: Path) -> None:
    path = tmp_path / "greenfed.toml"
    path.write_text('[scheduling.cohorts."lab.a"]\nparent = "lab.a"\n')
    with pytest.raises(ConfigError) as refused:
        load_settings(path, {})
    assert refused.value.key == 'scheduling.cohorts."lab.a".parent'
    assert str(refused.value).startswith(f'{path}: scheduling.cohorts."lab.a".parent: ')
