"""The lines of `greenfed up`'s banner that tell the other commands where the API is."""

from __future__ import annotations

from pathlib import Path

from greenfed.api_client import DEFAULT_API
from greenfed.up import _cli_lines, _token_note


def test_at_the_default_address_no_export_line_is_needed() -> None:
    assert _cli_lines(DEFAULT_API) == ["  table      greenfed nodes"]


def test_elsewhere_the_banner_prints_the_line_to_paste() -> None:
    lines = _cli_lines("http://127.0.0.1:18700")
    assert lines[0].startswith("  cli        export GREENFED_API=http://127.0.0.1:18700   ")
    assert lines[1] == "  table      greenfed nodes"


def test_an_admin_token_file_that_is_not_text_is_named_not_a_traceback(tmp_path: Path) -> None:
    """The banner says why the CLI cannot use the file, as it does for one it cannot read."""
    token_file = tmp_path / "admin-token"
    token_file.write_bytes(b"\xff\xfe\x00 not text")
    assert (
        _token_note(token_file)
        == f" (cannot serve: {token_file} is not a token file: it is not text)"
    )
    token_file.write_text("gf_token\n", encoding="utf-8")
    assert _token_note(token_file) == "   (the CLI reads it by itself)"
