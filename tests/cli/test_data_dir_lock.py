"""`greenfed up` owns its data directory; `greenfed cloud` replicas may share one."""

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
        with (
            pytest.raises(DataDirInUse) as refused,
            data_dir_lock(data_dir, "cloud", exclusive=False),
        ):
            pass
        assert str(data_dir) in str(refused.value)
        assert f"(pid {os.getpid()}, greenfed up)" in str(refused.value)
        assert "\n" not in str(refused.value)
    with data_dir_lock(data_dir, "cloud"):  # released with the first
        assert "greenfed cloud" in (data_dir / LOCK_FILE_NAME).read_text()


def test_cloud_replicas_share_a_data_directory_that_up_cannot_join(tmp_path: Path) -> None:
    with data_dir_lock(tmp_path, "cloud", exclusive=False):
        with data_dir_lock(tmp_path, "cloud", exclusive=False):  # a second replica
            pass
        with pytest.raises(DataDirInUse, match="greenfed cloud"), data_dir_lock(tmp_path, "up"):
            pass
    with data_dir_lock(tmp_path, "up"):  # every replica gone
        pass
