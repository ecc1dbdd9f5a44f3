"""One `greenfed up` or `greenfed cloud` per data directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from greenfed.data_dir_lock import LOCK_FILE_NAME, DataDirInUse, data_dir_lock


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    data_dir = tmp_path / "new" / "data"  # created, as the store would
    with data_dir_lock(data_dir, "up"):
        assert (data_dir / LOCK_FILE_NAME).read_text() == f"pid {os.getpid()}, greenfed up\n"
        # flock conflicts between open file descriptions, so one process shows it too.
        with pytest.raises(DataDirInUse) as refused, data_dir_lock(data_dir, "cloud"):
            pass
        assert str(data_dir) in str(refused.value)
        assert f"(pid {os.getpid()}, greenfed up)" in str(refused.value)
        assert "\n" not in str(refused.value)
    with data_dir_lock(data_dir, "cloud"):  # released with the first
        assert "greenfed cloud" in (data_dir / LOCK_FILE_NAME).read_text()
