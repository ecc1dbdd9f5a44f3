"""A `--config` file that cannot be read is a configuration error (exit status 2, one
line naming the file), never a traceback: not UTF-8, a directory, nested too deeply."""

from __future__ import annotations

from pathlib import Path

import pytest

from greenfed.cli import main

EXIT_USAGE = 2


def backup_with(config: Path, tmp_path: Path) -> int:
    return main(["store", "backup", "--config", str(config), str(tmp_path / "x.backup")])


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"\xff\xfe[store]\n", "is not UTF-8 text (line 1)"),  # UTF-16, as some editors save
        (b'[store]\ndata_dir = "caf\xe9"\n', "is not UTF-8 text (line 2)"),  # Latin-1
        (b"x = " + b"[" * 10_000 + b"]" * 10_000 + b"\n", "TOML nested too deeply to read"),
    ],
)
def test_a_config_file_that_cannot_be_read_is_a_configuration_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, said: str
) -> None:
    config = tmp_path / "cloud.toml"
    config.write_bytes(content)
    assert backup_with(config, tmp_path) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"greenfed: configuration error: config file {config}")
    assert said in err
    assert err.count("\n") == 1


def test_a_directory_as_the_config_file_is_a_configuration_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert backup_with(tmp_path, tmp_path) == EXIT_USAGE
    _, err = capsys.readouterr()
    assert (
        err
        == f"greenfed: configuration error: config file {tmp_path} cannot be read: Is a directory\n"
    )
