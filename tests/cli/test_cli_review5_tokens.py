"""A token that cannot be one (two lines, a control character) or a token file that is not
text is one `greenfed: ` line naming where it came from, exit status 3 (a token problem,
docs/cli.md), before anything is sent; never a traceback, and never the token itself.

Nothing listens on the API's port: a request would fail with exit status 1 instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from greenfed.cli import main

EXIT_AUTH = 3
NOWHERE = "http://127.0.0.1:1"
SECRET = "gf_0123456789abcdef_SECRET"


@pytest.fixture(autouse=True)
def no_token_around(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No token from the environment, and a data directory of the test's own (where the
    admin token file would be); its path."""
    for variable in ("GREENFED_TOKEN", "GREENFED_API"):
        monkeypatch.delenv(variable, raising=False)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    monkeypatch.setenv("GREENFED_STORE__DATA_DIR", str(data_dir))
    return data_dir


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line of a command refused for its token."""
    assert main([*argv, "--api", NOWHERE]) == EXIT_AUTH
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("greenfed: ")
    assert err.count("\n") == 1, err
    assert "SECRET" not in err
    return err


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (f"{SECRET}\n{SECRET}2\n".encode(), "holds more than one line"),
        (b"\xff\xfe" + SECRET.encode(), "is not text"),
        (f"{SECRET}\x1b[2J".encode(), "a character other than printable ASCII"),
    ],
    ids=["two lines", "not UTF-8", "an escape sequence"],
)
def test_a_token_file_that_holds_no_token_is_one_line(
    content: bytes, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token_file = tmp_path / "ci.token"
    token_file.write_bytes(content)
    err = refused(["jobs", "--token-file", str(token_file)], capsys)
    assert f"--token-file {token_file}" in err
    assert said in err


def test_a_token_with_a_line_break_in_the_environment_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GREENFED_TOKEN", f"{SECRET}\n{SECRET}")
    err = refused(["jobs"], capsys)
    assert "the token from GREENFED_TOKEN holds more than one line" in err


def test_a_token_with_a_control_character_on_the_command_line_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refused(["nodes", "--token", f"{SECRET}\x07"], capsys)
    assert "the token from --token holds a space or a character other than printable ASCII" in err


def test_a_damaged_admin_token_file_is_one_line_naming_it(
    no_token_around: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    admin_token = no_token_around / "admin-token"
    admin_token.write_text(f"{SECRET}\n\n{SECRET}\n")
    err = refused(["jobs"], capsys)
    assert f"the token from {admin_token} holds more than one line" in err
