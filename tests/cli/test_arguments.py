"""Option values are checked by argparse: a bad one is a usage error naming the option."""

from __future__ import annotations

import pytest

from greenfed.cli import main


@pytest.mark.parametrize(
    "argv",
    [
        ["jobs", "--limit", "0"],
        ["models", "--limit", "-1"],
        ["logs", "some-id", "--tail", "-1"],
        ["up", "--api-port", "70000"],
        ["nodes", "upgrade", "--canary", "101%", "--version", "1.0"],
        ["nodes", "upgrade", "--max-failures", "-5", "--version", "1.0"],
        ["nodes", "upgrade", "--health-timeout", "0", "--version", "1.0"],
    ],
)
def test_a_bad_option_value_is_a_usage_error_naming_it(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    option = next(word for word in argv if word.startswith("--"))
    assert f"argument {option}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["tenants", "create", "acme", "--quota", "gpu=²"],
        ["tenants", "set", "acme", "--borrow", "gpu=¹"],
        ["tenants", "set", "acme", "--lend", "cpu=³"],
        ["tenants", "create", "acme", "--quota", "gpu=٣"],  # an Arabic-Indic three
    ],
)
def test_a_count_in_other_than_ascii_digits_is_a_usage_error_naming_it(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refused before any request: the API address is one nothing listens on.
    monkeypatch.setenv("GREENFED_TOKEN", "gf_0000000000000000_x")
    assert main([*argv, "--api", "http://127.0.0.1:9"]) == 2
    option, value = argv[-2:]
    assert f"{option} {value!r}: expected KIND=COUNT" in capsys.readouterr().err
