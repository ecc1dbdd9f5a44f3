"""Values too large for a date or a number (`--since 99999999d`, `--max-memory infGiB`)
are usage errors like any other bad value: exit status 2 and one line naming the option,
before anything is sent; never a traceback."""

from __future__ import annotations

import pytest

from greenfed.cli import main

EXIT_USAGE = 2
CLIENT = ["--api", "http://127.0.0.1:1", "--token", "gf_x"]  # nothing is sent anywhere


def run(argv: list[str]) -> int:
    try:
        return main([*argv, *CLIENT])
    except SystemExit as usage:  # argparse refusing a value
        return int(usage.code or 0)


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["audit", "--since", "99999999d"], "--since"),
        (["events", "--since", "999999d"], "--since"),
        (["usage", "--since", "999999d"], "--since"),
        (["usage", "--until", "99999999999999999999w"], "--until"),
    ],
    ids=["audit --since", "events --since", "usage --since", "usage --until"],
)
def test_a_time_further_back_than_any_date_is_a_usage_error(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err == f"greenfed: {option}: {argv[-1]!r} is further back than any date\n"


@pytest.mark.parametrize("size", ["infGiB", "nanGiB", "1e400TiB"])
def test_a_size_that_is_no_finite_number_is_a_usage_error(
    size: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["nodes", "join-token", "create", "--max-memory", size]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.endswith(f"error: argument --max-memory: {size!r} is not a finite size\n")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["jobs", "--limit", "ten"], "argument --limit: 'ten' is not a whole number"),
        (["scale", "x", "2.5"], "argument replicas: '2.5' is not a whole number"),
        (
            ["load", "--deployment", "x", "--qps", "1", "--duration", "soon"],
            "'soon' is not a number",
        ),
    ],
    ids=["jobs --limit", "scale", "load --duration"],
)
def test_an_option_that_is_no_number_says_so_in_words(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert said in err
    assert "_int value" not in err
    assert "_float value" not in err
