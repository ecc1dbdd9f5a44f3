"""``greenfed eval --optimum`` when the optimum cannot be had (HiGHS gives up, SciPy is
missing, a job a policy ran has no pool): one line on stderr saying why and how to go
on without it, a failing exit status, and no traceback."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import scipy.optimize

from greenfed.arguments import EXIT_FAILURE
from greenfed.cli import main

from .scenarios import write_scenario


def test_an_optimum_highs_gives_up_on_is_a_message_and_a_failing_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def gives_up(*args: object, **kwargs: object) -> SimpleNamespace:
        return SimpleNamespace(status=4, message="Numerical difficulties encountered", x=None)

    monkeypatch.setattr(scipy.optimize, "linprog", gives_up)
    fleet, workload = write_scenario(tmp_path)
    argv = ["--days", "1", "--fleet", str(fleet), "--workload", str(workload)]
    code = main(["eval", *argv, "--policies", "fifo-binpack", "--optimum"])
    out, err = capsys.readouterr()
    assert code == EXIT_FAILURE
    assert out == ""  # no table that would pass for a complete result
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("greenfed: the offline optimum is unavailable: ")
    assert "HiGHS found no optimum: Numerical difficulties encountered" in lines[0]
    assert "--no-optimum" in lines[0]
    assert "Traceback" not in err
