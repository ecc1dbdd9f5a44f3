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
