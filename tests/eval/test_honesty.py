"""An evaluation that cannot flatter itself: zones without a series, periods the
traces do not cover, and work that never starts are errors or reported, never hidden."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from datetime import date, datetime
from pathlib import Path

import numpy as np
import pytest

from cloud.eval.bound import baseline_start_by, optimum
from cloud.eval.report import table
from cloud.eval.runner import EvalOptions, build_scenario, run_eval
from cloud.green.power_capping import ALL_POWER_SHARES
from cloud.scheduler import Snapshot
from cloud.signals.datasets import shipped_data
from shared.accelerators import capped_throughput

from .scenarios import write_scenario

NEVER_FITS = """
[[training]]
id = "too-big"
tenant = "vision"
submit_offset_s = 0
duration_s = 600
gpus_per_worker = 16
"""


def carbon_dir_without_california(tmp_path: Path) -> Path:
    directory = tmp_path / "carbon"
    directory.mkdir()
    for name in ("CA-ON_2023_hourly.csv", "DE-LU_2023_hourly.csv"):
        with (shipped_data() / name).open("rb") as source:
            (directory / name).write_bytes(source.read())
    return directory


def test_a_fleet_zone_without_a_series_is_an_error_unless_allowed_and_then_counted(
    tmp_path: Path,
) -> None:
    fleet, workload = write_scenario(tmp_path)
    carbon = carbon_dir_without_california(tmp_path)
    options = EvalOptions(
        days=1, fleet=fleet, workload=workload, carbon_dir=carbon, policies=("fifo-binpack",)
    )
    with pytest.raises(ValueError, match="fleet zone US-CAL-CISO has no carbon series in"):
        build_scenario(options)
    allowed = EvalOptions(
        days=1,
        fleet=fleet,
        workload=workload,
        carbon_dir=carbon,
        policies=("fifo-binpack",),
        allow_missing_zones=True,
    )
    report = run_eval(allowed)
    (result,) = report.results
    assert result.fallback_records > 0
    header, _, row = table(report.results).splitlines()
    assert "fallback" in header.split()
    assert str(result.fallback_records) in row.split()
    shutil.rmtree(carbon)


def carbon_dir_with_empty_hours(tmp_path: Path, empty: Callable[[datetime], bool]) -> Path:
    """The fleet's three zones, with DE's carbon cells empty in the hours `empty` picks."""
    directory = tmp_path / "carbon"
    directory.mkdir()
    for name in ("CA-ON_2023_hourly.csv", "US-CAL-CISO_2023_hourly.csv", "DE-LU_2023_hourly.csv"):
        lines = (shipped_data() / name).read_text(encoding="utf-8").splitlines()
        if name.startswith("DE-LU"):
            for index, line in enumerate(lines[1:], start=1):
                cells = line.split(",")
                if empty(datetime.fromisoformat(cells[0])):
                    cells[4] = cells[5] = ""  # both carbon intensity columns
                    lines[index] = ",".join(cells)
        (directory / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


@pytest.mark.parametrize(
    ("start", "days", "empty", "message"),
    [
        # The first 200 hours have no value: none at or before the evaluated start.
        (
            date(2023, 1, 1),
            1.0,
            lambda at: at < datetime(2023, 1, 9, 8),
            "DE series \\(DE-LU_2023_hourly.csv\\) has no carbon intensity at or before "
            "2023-01-01 00:00",
        ),
        # Ten empty days within the period: longer than any forecaster looks back.
        (
            date(2023, 3, 1),
            14.0,
            lambda at: datetime(2023, 3, 4) <= at < datetime(2023, 3, 14),
            "DE series \\(DE-LU_2023_hourly.csv\\) has no carbon intensity in the .* hours "
            "up to 2023-03-1",
        ),
    ],
)
def test_a_zone_without_a_value_when_the_simulator_needs_one_is_an_error(
    tmp_path: Path, start: date, days: float, empty: Callable[[datetime], bool], message: str
) -> None:
    fleet, workload = write_scenario(tmp_path)
    carbon = carbon_dir_with_empty_hours(tmp_path, empty)
    options = EvalOptions(start=start, days=days, fleet=fleet, workload=workload, carbon_dir=carbon)
    with pytest.raises(ValueError, match=message):
        build_scenario(options)


def test_a_zone_with_no_value_at_all_is_missing_and_may_be_allowed(tmp_path: Path) -> None:
    fleet, workload = write_scenario(tmp_path)
    carbon = carbon_dir_with_empty_hours(tmp_path, lambda at: True)
    options = EvalOptions(
        days=1, fleet=fleet, workload=workload, carbon_dir=carbon, policies=("fifo-binpack",)
    )
    with pytest.raises(
        ValueError,
        match=r"fleet zone DE has no carbon series in .* \(DE-LU_2023_hourly.csv has no carbon",
    ):
        build_scenario(options)
    report = run_eval(dataclasses.replace(options, allow_missing_zones=True))
    (result,) = report.results
    assert result.fallback_records > 0


@pytest.mark.parametrize(
    ("start", "days", "message"),
    [
        (date(2024, 1, 5), 3.0, "is outside the CA-ON series"),
        (date(2022, 12, 30), 3.0, "is outside the CA-ON series"),
        (date(2023, 12, 25), 14.0, "runs past the end of the CA-ON series"),
    ],
)
def test_a_period_the_traces_do_not_cover_is_an_error(
    tmp_path: Path, start: date, days: float, message: str
) -> None:
    fleet, workload = write_scenario(tmp_path)
    with pytest.raises(ValueError, match=message):
        build_scenario(EvalOptions(start=start, days=days, fleet=fleet, workload=workload))


def test_work_that_never_starts_is_unfinished_and_outside_the_waits(tmp_path: Path) -> None:
    fleet, workload = write_scenario(tmp_path)
    workload.write_text(workload.read_text(encoding="utf-8") + NEVER_FITS, encoding="utf-8")
    report = run_eval(
        EvalOptions(days=1, fleet=fleet, workload=workload, policies=("fifo-binpack", "green"))
    )
    for result, outcome in zip(report.results, report.outcomes, strict=True):
        assert (result.unfinished_jobs, result.never_started_jobs) == (1, 1)
        started = [
            r.first_start_s - r.submitted_s
            for r in outcome.jobs.values()
            if r.first_start_s is not None
        ]
        assert len(started) == result.jobs - 1
        assert result.wait_mean_s == pytest.approx(sum(started) / len(started))
    header, _, *rows = table(report.results).splitlines()
    end = header.index("unfinished") + len("unfinished")  # cells are right-aligned
    assert [row[:end].split()[-1] for row in rows] == ["1", "1"]


TWO_ZONES = """
[[group]]
name = "a100-toronto"
profile = "a100-4x"
count = 1
site = "cloud"
zone = "CA-ON"
region = "northamerica-northeast2"

[[group]]
name = "a100-johannesburg"
profile = "a100-4x"
count = 1
site = "cloud"
zone = "ZA"
region = "africa-south1"
"""

ONE_FLEXIBLE_JOB = """
seed = 1

[[training]]
id = "flexible"
tenant = "vision"
submit_offset_s = 0
duration_s = 3600
deadline_offset_s = 21600
"""


def test_the_optimum_runs_a_flexible_hour_in_the_cleanest_hours_it_may(tmp_path: Path) -> None:
    """One 1-GPU hour with a 6-hour deadline on two zones. Capacity never binds, so the
    optimum covers the job's work with the cheapest GPU-hours there are: each (zone,
    power mode, whole hour of its window) offers one GPU-hour doing the mode's speed of
    work for its power times that hour's recorded intensity, and the job, one GPU wide,
    takes at most one GPU-hour in each hour, whichever zones and modes it mixes."""
    fleet, workload = tmp_path / "fleet.toml", tmp_path / "workload.toml"
    fleet.write_text(TWO_ZONES, encoding="utf-8")
    workload.write_text(ONE_FLEXIBLE_JOB, encoding="utf-8")
    report = run_eval(
        EvalOptions(days=1, fleet=fleet, workload=workload, policies=("fifo-binpack",), bound=True)
    )
    bound = report.bound
    assert bound is not None
    snapshot = Snapshot.build(now=report.options.start_s, nodes=report.scenario.nodes)
    energy = report.options.energy
    gpus = snapshot.nodes.kind("gpu")
    hours = report.options.start_s + 3600.0 * np.arange(6, dtype=np.float64)
    offers = []  # (gCO2 per unit of work, work per GPU-hour, kW)
    for row in (0, 1):
        zone = snapshot.nodes.zones[snapshot.nodes.zone_code[row]]
        series = report.scenario.recorded.series(zone)
        assert series is not None
        hourly = series.mean_carbon_g_per_kwh(hours, hours + 3600)
        max_w = float(gpus.max_power_w[row])
        for share in (1.0, *ALL_POWER_SHARES):
            kw = float(
                energy.member_power_w(
                    snapshot,
                    "gpu",
                    np.array([row]),
                    1,
                    energy.training_utilisation,
                    power_limit_w=None if share == 1.0 else share * max_w,
                )[0]
                / 1000.0
            )
            speed = float(gpus.relative_speed[row]) * capped_throughput(share)
            offers += [(kw * float(g) / speed, speed, kw, hour) for hour, g in enumerate(hourly)]

    def cheapest_first(one_wide: bool) -> tuple[float, float]:
        """(gCO2, kWh) of covering the work with the cheapest work first. One GPU wide,
        each hour is a convex menu (a mix of its offers, their GPU-hours summing to at
        most one hour): the lower hull of its offers from (0 work, 0 g), whose segments
        are taken cheapest first over all hours. Otherwise every offer is a menu."""
        segments = []  # (gCO2 per unit of work, work, kW per unit of work)
        menus = [[o for o in offers if o[3] == h] for h in range(hours.size)]
        for menu in menus if one_wide else [[o] for o in offers]:
            work, gco2, kwh = 0.0, 0.0, 0.0
            while True:
                ahead = [o for o in menu if o[1] > work + 1e-12]
                if not ahead:
                    break
                best = min(ahead, key=lambda o: ((o[0] * o[1] - gco2) / (o[1] - work), -o[1]))
                length = best[1] - work
                segments.append(
                    ((best[0] * best[1] - gco2) / length, length, (best[2] - kwh) / length)
                )
                work, gco2, kwh = best[1], best[0] * best[1], best[2]
        need, gco2, kwh = 1.0, 0.0, 0.0
        for per_unit, length, kw_per_unit in sorted(segments):
            taken = min(length, need)
            need -= taken
            gco2 += taken * per_unit
            kwh += taken * kw_per_unit
            if need <= 1e-12:
                break
        return gco2, kwh

    gco2, kwh = cheapest_first(one_wide=True)
    assert bound.gco2 == pytest.approx(gco2, rel=1e-6)
    assert bound.kwh == pytest.approx(kwh, rel=1e-6)
    # Without its width the job would run in several zones and modes of one hour at once.
    assert cheapest_first(one_wide=False)[0] < bound.gco2 * (1 - 1e-3)
    assert report.results[0].training_gco2 >= bound.gco2


def test_the_optimum_without_waiting_runs_the_job_from_its_submission(tmp_path: Path) -> None:
    """``start_by`` (a reference, not a bound): the flexible hour may no longer wait for
    the cleanest hour of its window, so the optimum costs at least the free one's, and
    at most running it at once at full power on the cleaner zone (a feasible point)."""
    fleet, workload = tmp_path / "fleet.toml", tmp_path / "workload.toml"
    fleet.write_text(TWO_ZONES, encoding="utf-8")
    workload.write_text(ONE_FLEXIBLE_JOB, encoding="utf-8")
    report = run_eval(
        EvalOptions(days=1, fleet=fleet, workload=workload, policies=("fifo-binpack",))
    )
    scenario, energy, start_s = report.scenario, report.options.energy, report.options.start_s
    args = (scenario.workload, scenario.nodes, report.outcomes, scenario.recorded, energy)
    free = optimum(*args)
    now = optimum(*args, start_by={"flexible": start_s})
    snapshot = Snapshot.build(now=start_s, nodes=scenario.nodes)
    run_now = []
    for row in (0, 1):
        zone = snapshot.nodes.zones[snapshot.nodes.zone_code[row]]
        series = scenario.recorded.series(zone)
        assert series is not None
        intensity = float(
            series.mean_carbon_g_per_kwh(np.array([start_s]), np.array([start_s + 3600]))[0]
        )
        kw = (
            float(
                energy.member_power_w(
                    snapshot, "gpu", np.array([row]), 1, energy.training_utilisation
                )[0]
            )
            / 1000.0
        )
        run_now.append(kw * intensity)
    assert free.gco2 < now.gco2 <= min(run_now) * (1 + 1e-9)
    # The baseline's starts name only work that cannot wait: this job has a deadline.
    assert baseline_start_by(report.outcomes[0]) == {}


def test_no_evaluated_policy_emits_less_training_co2_than_the_optimum(tmp_path: Path) -> None:
    fleet, workload = write_scenario(tmp_path)
    report = run_eval(
        EvalOptions(
            days=1,
            fleet=fleet,
            workload=workload,
            policies=("fifo-binpack", "spread", "green", "green-temporal"),
            bound=True,
        )
    )
    bound = report.bound
    assert bound is not None
    assert bound.jobs == len(report.scenario.workload.training)
    for result in report.results:
        assert result.training_gco2 >= bound.gco2 * (1 - 1e-9), result.policy
    rows = table(report.results, bound, report.inference_bound).splitlines()
    assert "of optimum" in rows[0]
    assert rows[2].split()[0] == "fifo-binpack"


def test_green_on_grids_it_was_not_tuned_on_meets_every_slo() -> None:
    """On the other-zones fleet a deployment with traffic from Virginia and Singapore
    once got a Singapore replica that met its SLO at the shares and broke it every
    Virginia afternoon; placement now allows for each region's daily swing."""
    fleet = Path(__file__).resolve().parents[2] / "sim_devices/fleets/other-zones.toml"
    report = run_eval(EvalOptions(days=2, fleet=fleet, policies=("green",)))
    (result,) = report.results
    assert result.slo_hours > 0
    assert result.slo_violations == 0
