"""``greenfed eval`` on the command line: the table, JSON with the required keys,
the plot and errors."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from cloud.eval.report import REQUIRED_KEYS
from cloud.signals.datasets import shipped_data
from greenfed.cli import main

from .scenarios import write_scenario


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["eval", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def small_args(tmp_path: Path) -> list[str]:
    fleet, workload = write_scenario(tmp_path)
    return ["--days", "1", "--fleet", str(fleet), "--workload", str(workload)]


def test_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *small_args(tmp_path), "--policies", "fifo-binpack,green")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("1 days from 2023-06-01 UTC; 6 nodes")
    header = lines[1]
    for column in ("kWh", "tCO2eq", "cost", "wait mean", "wait p95", "deadline misses"):
        assert column in header
    assert "SLO violations" in header
    assert "GPU util" in header
    assert lines[3].startswith("fifo-binpack")
    assert lines[4].startswith("green")


def test_json_has_the_required_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *small_args(tmp_path), "--policies", "fifo-binpack,spread", "--json")
    assert code == 0
    results = json.loads(out)
    assert [r["policy"] for r in results] == ["fifo-binpack", "spread"]
    for result in results:
        assert set(REQUIRED_KEYS) <= set(result)
        assert isinstance(result["deadline_misses"], int)
        assert 0 <= result["utilisation"] <= 1


def test_the_generated_workload_can_be_dumped_and_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet, _ = write_scenario(tmp_path)
    dumped = tmp_path / "dumped.json"
    args = ["--days", "0.5", "--fleet", str(fleet), "--policies", "fifo-binpack", "--json"]
    code, first, _ = run(capsys, *args, "--dump-workload", str(dumped), "--seed", "9")
    assert code == 0
    assert dumped.exists()
    code, again, _ = run(capsys, *args, "--workload", str(dumped))
    strip = [{**r, "runtime_s": 0} for r in json.loads(first)]
    assert strip == [{**r, "runtime_s": 0} for r in json.loads(again)]


def test_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "--policies", "green,nope"])
    assert "unknown policy nope" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('[[training]]\nid = "x"\ntenant = "t"\nsubmit_offset_s = 0\n', "utf-8")
    code, _, err = run(capsys, "--days", "1", "--workload", str(bad))
    assert code == 2
    assert "missing required field `duration_s`" in err
    code, _, err = run(capsys, "--days", "1", "--fleet", str(tmp_path / "none.toml"))
    assert code == 2
    assert "does not exist" in err


def test_plot_without_matplotlib_fails_before_simulating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.import_module

    def no_matplotlib(name: str, package: str | None = None) -> object:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", no_matplotlib)
    code, out, err = run(capsys, *small_args(tmp_path), "--plot", str(tmp_path / "x.png"))
    assert code == 2
    assert "greenfed[plot]" in err
    assert out == ""


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "eval.png"
    code, out, _ = run(
        capsys, *small_args(tmp_path), "--policies", "fifo-binpack,green", "--plot", str(target)
    )
    assert code == 0
    assert target.read_bytes().startswith(b"\x89PNG")
    assert f"plot written to {target}" in out


def test_the_help_states_the_default_min_saving(capsys: pytest.CaptureFixture[str]) -> None:
    from cloud.green.shifting import DEFAULT_MIN_SAVING

    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"(default {DEFAULT_MIN_SAVING:g})" in help_text
    assert "--no-migration" in help_text


def test_the_optimum_and_missing_zones_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policies = ["--policies", "fifo-binpack,green"]
    # Every table reports each policy's share of the optimum's saving, unless asked not to.
    code, out, _ = run(capsys, *small_args(tmp_path), *policies)
    assert code == 0
    assert "of optimum" in out.splitlines()[1]
    assert out.splitlines()[-1].startswith("offline optimum (a relaxation")
    code, out, _ = run(capsys, *small_args(tmp_path), *policies, "--no-optimum")
    assert code == 0
    assert "of optimum" not in out
    code, out, _ = run(capsys, *small_args(tmp_path), "--policies", "green", "--optimum", "--json")
    (result,) = json.loads(out)
    assert result["optimum_training_gco2"] <= result["training_gco2"]
    carbon = tmp_path / "carbon"
    carbon.mkdir()
    (carbon / "CA-ON_2023_hourly.csv").write_bytes(
        (shipped_data() / "CA-ON_2023_hourly.csv").read_bytes()
    )
    args = [*small_args(tmp_path), "--policies", "fifo-binpack", "--carbon-dir", str(carbon)]
    code, _, err = run(capsys, *args)
    assert code == 2
    assert "fleet zone DE has no carbon series" in err
    code, out, _ = run(capsys, *args, "--allow-missing-zones")
    assert code == 0
    assert "fallback" in out.splitlines()[1]


def test_a_cost_no_price_can_tell_is_shown_unknown_and_is_null_in_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Carbon series only, for zones no static table prices: nothing says what power cost.
    fleet, workload = write_scenario(tmp_path)
    carbon = tmp_path / "carbon"
    carbon.mkdir()
    for prefix, zone in (("CA-ON", "CA-ON"), ("US-CAL-CISO", "US-CAL-CISO"), ("DE-LU", "DE")):
        text = (shipped_data() / f"{prefix}_2023_hourly.csv").read_text(encoding="utf-8")
        (carbon / f"XX{prefix}_2023_hourly.csv").write_text(
            text.replace(f",{zone},", f",XX-{zone},"), encoding="utf-8"
        )
    renamed = fleet.read_text(encoding="utf-8").replace('zone = "', 'zone = "XX-')
    fleet.write_text(renamed, encoding="utf-8")
    args = ["--days", "1", "--fleet", str(fleet), "--workload", str(workload)]
    args += ["--policies", "fifo-binpack", "--no-optimum", "--carbon-dir", str(carbon)]
    code, out, _ = run(capsys, *args)
    assert code == 0
    header, _, row = out.splitlines()[1:4]
    cost = row[: header.index("cost") + len("cost")].split()[-1]  # cells are right-aligned
    assert cost == "n/a"
    assert "nan" not in row
    code, out, _ = run(capsys, *args, "--json")
    assert code == 0

    def no_constants(token: str) -> object:
        raise AssertionError(f"{token} is not JSON (RFC 8259)")

    (result,) = json.loads(out, parse_constant=no_constants)
    assert result["cost"] is None
    assert result["fallback_records"] > 0  # accounted without a price, and counted
    assert result["gco2"] > 0
