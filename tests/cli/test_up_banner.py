"""The lines of `greenfed up`'s banner that tell the other commands where the API is."""

from __future__ import annotations

from greenfed.api_client import DEFAULT_API
from greenfed.up import _cli_lines


def test_at_the_default_address_no_export_line_is_needed() -> None:
    assert _cli_lines(DEFAULT_API) == ["  table      greenfed nodes"]


def test_elsewhere_the_banner_prints_the_line_to_paste() -> None:
    lines = _cli_lines("http://127.0.0.1:18700")
    assert lines[0].startswith("  cli        export GREENFED_API=http://127.0.0.1:18700   ")
    assert lines[1] == "  table      greenfed nodes"
