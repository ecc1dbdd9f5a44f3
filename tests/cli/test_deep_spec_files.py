"""A spec file nested thousands of levels deep is refused as that, in its own format's
name (it once read "not valid YAML: RecursionError" whatever the format)."""

from __future__ import annotations

from pathlib import Path

import pytest

from greenfed.cli import main
from greenfed.declarative_commands import _yaml_documents
from greenfed.spec_files import SpecFileError, load_spec_file

DEPTH = 10_000  # past every parser's recursion limit

DEEP = {
    "json": '{"kind": "training", "x": ' + "[" * DEPTH + "]" * DEPTH + "}",
    "toml": 'kind = "training"\nx = ' + "[" * DEPTH + "]" * DEPTH + "\n",
    "yaml": "kind: training\nx: " + "[" * DEPTH + "]" * DEPTH + "\n",
}
FORMAT = {"json": "JSON", "toml": "TOML", "yaml": "YAML"}


@pytest.mark.parametrize("suffix", ["json", "toml", "yaml"])
def test_a_deeply_nested_spec_file_is_refused_as_such_in_its_format(
    tmp_path: Path, suffix: str
) -> None:
    path = tmp_path / f"deep.{suffix}"
    path.write_text(DEEP[suffix], encoding="utf-8")
    with pytest.raises(SpecFileError) as refused:
        load_spec_file(path)
    assert str(refused.value) == f"{path}: {FORMAT[suffix]} nested too deeply to read"


def test_a_deeply_nested_yaml_file_to_apply_is_refused_as_such(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text(DEEP["yaml"], encoding="utf-8")
    with pytest.raises(SpecFileError, match="nested too deeply to read"):
        _yaml_documents(path)


def test_submit_says_so_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(DEEP["toml"], encoding="utf-8")
    assert main(["submit", str(path)]) == 2
    _, err = capsys.readouterr()
    assert err == f"greenfed: invalid spec: {path}: TOML nested too deeply to read\n"
