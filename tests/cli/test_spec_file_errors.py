"""A spec file that does not parse is named with what is wrong and where, and never
quoted: its lines may hold secrets' values (greenfed/spec_files.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from greenfed.declarative_commands import _yaml_documents
from greenfed.spec_files import SpecFileError, load_spec_file

SECRET = "hf_SuperSecret123"
BROKEN = f"""name: train
command: [python, train.py]
secret_env:
  HF_TOKEN: "{SECRET}
  OTHER: x
"""


@pytest.mark.parametrize("read", [load_spec_file, _yaml_documents])
def test_a_broken_yaml_spec_file_is_named_without_its_secret(read: object, tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(BROKEN)
    with pytest.raises(SpecFileError) as refused:
        read(path)  # type: ignore[operator]
    message = str(refused.value)
    assert SECRET not in message
    assert "not valid YAML" in message
    assert "line " in message
