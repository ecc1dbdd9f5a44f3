"""`greenfed eval` refuses an evaluated period the carbon and price series do not cover
at once, before it generates the period's workload: `--days 100000` used to generate a
workload of 270 years (minutes, and memory) only to be refused after."""

from __future__ import annotations

import pytest

from greenfed.cli import main


@pytest.mark.timeout(20)
@pytest.mark.parametrize("generator", ["default", "trace"])
def test_a_period_past_the_series_is_refused_before_any_workload_is_made(
    capsys: pytest.CaptureFixture[str], generator: str
) -> None:
    argv = ["eval", "--days", "100000", "--no-optimum", "--policies", "fifo-binpack"]
    code = main([*argv, "--generator", generator])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "runs past the end of the" in err
    assert "shorten --days or start earlier" in err
    assert err.count("\n") == 1
