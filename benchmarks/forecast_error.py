"""Forecast error of every history-based forecaster on a year of recorded carbon intensity.

For every hour t of the trace with at least one week of history before it and
24 hours after it, each forecaster sees the recorded hours up to t (as it would
live, with no knowledge of the future) and forecasts t+1 … t+24; we score the
forecasts for t+1, t+6 and t+24 against what was recorded. MAE is in
gCO2eq/kWh, MAPE in % of the recorded value. Every forecaster is scored on the
same origins, so the rows compare like with like.

    python benchmarks/forecast_error.py                  # shipped 2023 data, LCA
    python benchmarks/forecast_error.py --emission-factor direct --json
    python benchmarks/forecast_error.py --carbon-dir path/to/traces
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from cloud.signals.datasets import SHIPPED_ZONES, EmissionFactor, load_traces
from cloud.signals.forecast import FORECASTERS, WEEK_H, Forecaster
from cloud.signals.grid import FloatArray
from cloud.signals.hourly import fill_forward

HORIZONS_H = (1, 6, 24)


def forecast_errors(
    values: FloatArray, forecaster: Forecaster, min_history_h: int = WEEK_H
) -> dict[int, tuple[float, float]]:
    """{horizon: (MAE, MAPE %)} of `forecaster` over every usable origin of `values`."""
    longest = max(HORIZONS_H)
    origins = range(min_history_h - 1, values.size - longest)
    lookback = forecaster.lookback_hours
    predicted = np.empty((len(origins), len(HORIZONS_H)))
    for row, origin in enumerate(origins):
        history = values[max(0, origin + 1 - lookback) : origin + 1]
        forecast = np.maximum(forecaster.forecast(history, longest), 0.0)
        predicted[row] = forecast[[h - 1 for h in HORIZONS_H]]
    result: dict[int, tuple[float, float]] = {}
    origin_index = np.arange(origins.start, origins.stop)
    for column, horizon in enumerate(HORIZONS_H):
        actual = values[origin_index + horizon]
        error = np.abs(predicted[:, column] - actual)
        result[horizon] = (float(error.mean()), float(np.mean(error / actual) * 100))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--carbon-dir", type=Path, default=None, help="traces (default: shipped)")
    parser.add_argument("--emission-factor", choices=("lifecycle", "direct"), default="lifecycle")
    parser.add_argument("--zones", default=",".join(SHIPPED_ZONES))
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    emission_factor: EmissionFactor = args.emission_factor
    traces = load_traces(args.carbon_dir)
    zones = [zone for zone in args.zones.split(",") if zone]
    started = time.perf_counter()
    rows = []
    for name, forecaster in FORECASTERS.items():
        per_zone = {}
        for zone in zones:
            values = fill_forward(traces[zone].carbon(emission_factor))
            per_zone[zone] = forecast_errors(values, forecaster)
        rows.append((name, per_zone))
    elapsed_s = time.perf_counter() - started
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "forecaster": name,
                        "zone": zone,
                        "horizon_h": horizon,
                        "mae_g_per_kwh": round(mae, 2),
                        "mape_pct": round(mape, 2),
                    }
                    for name, per_zone in rows
                    for zone, by_horizon in per_zone.items()
                    for horizon, (mae, mape) in by_horizon.items()
                ],
                indent=1,
            )
        )
        return 0
    header = "| forecaster | zone | " + " | ".join(f"MAE {h} h | MAPE {h} h" for h in HORIZONS_H)
    print(f"Carbon intensity ({emission_factor}), gCO2eq/kWh; origins with ≥ 1 week of history\n")
    print(header + " |")
    print("|---|---|" + "---:|---:|" * len(HORIZONS_H))
    for name, per_zone in rows:
        for zone, by_horizon in [*per_zone.items(), ("mean", _mean(per_zone))]:
            cells = " | ".join(f"{mae:.1f} | {mape:.1f} %" for mae, mape in by_horizon.values())
            label = f"**{zone}**" if zone == "mean" else zone
            print(f"| {name} | {label} | {cells} |")
    print(f"\n({elapsed_s:.1f} s)", file=sys.stderr)
    return 0


def _mean(per_zone: dict[str, dict[int, tuple[float, float]]]) -> dict[int, tuple[float, float]]:
    return {
        horizon: (
            float(np.mean([by_horizon[horizon][0] for by_horizon in per_zone.values()])),
            float(np.mean([by_horizon[horizon][1] for by_horizon in per_zone.values()])),
        )
        for horizon in HORIZONS_H
    }


if __name__ == "__main__":
    raise SystemExit(main())
