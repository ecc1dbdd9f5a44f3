"""GCP region RTT: the measured matrix, symmetric, and documented estimates where it has none."""

from __future__ import annotations

import itertools

import pytest

from cloud.signals.datasets import latency_rows
from cloud.signals.latency_matrix import (
    REGION_LOCATIONS,
    LatencyMatrix,
    UnknownRegion,
    fibre_rtt_ms,
    great_circle_km,
    region_rtt_table,
    shipped_latency_matrix,
)

FLEET_REGIONS = ["us-west2", "northamerica-northeast2", "europe-west3", "africa-south1"]


def test_the_matrix_covers_34_regions_and_is_symmetric() -> None:
    matrix = shipped_latency_matrix()
    assert len(matrix.measured_regions) == 34
    for a, b in itertools.combinations(sorted(matrix.measured_regions), 2):
        assert matrix.is_measured(a, b)
        assert matrix.rtt_ms(a, b) == matrix.rtt_ms(b, a)
    assert matrix.rtt_ms("us-west2", "us-west2") == 0.0


def test_the_two_directions_are_averaged() -> None:
    raw = {(a, b): ms for a, b, ms in latency_rows()}
    a, b = next((a, b) for (a, b), ms in raw.items() if ms != raw[(b, a)])
    assert shipped_latency_matrix().rtt_ms(a, b) == (raw[(a, b)] + raw[(b, a)]) / 2
    small = LatencyMatrix(
        {("x", "y"): 10.0, ("y", "x"): 14.0, ("x", "x"): 3.0, ("x", "z"): 20.0},
        locations={"x": (0.0, 0.0), "y": (0.0, 1.0), "z": (0.0, 2.0)},
    )
    assert small.rtt_ms("x", "y") == small.rtt_ms("y", "x") == 12.0
    assert small.rtt_ms("x", "x") == 0.0  # a self-pair in the data does not count
    assert not small.is_measured("y", "z")
    assert small.rtt_ms("y", "z") == small.estimate_ms("z", "y") > 0


def test_known_pairs_keep_their_measured_values() -> None:
    matrix = shipped_latency_matrix()
    assert matrix.rtt_ms("europe-west3", "us-west2") == 151.0
    assert matrix.rtt_ms("europe-west3", "europe-west3") == 0.0


def test_the_distance_model_fits_the_matrix_reasonably() -> None:
    fit = shipped_latency_matrix().fit()
    assert fit.pairs == 561
    assert 1.2 < fit.routing_factor < 2.0  # real routes are longer than great circles
    assert fit.mean_abs_error_ms < 35
    assert fit.median_abs_error_pct < 20
    loro_ms, loro_pct = shipped_latency_matrix().leave_one_region_out_error()
    assert loro_ms < 35
    assert loro_pct < 20


def test_missing_regions_get_distance_estimates() -> None:
    matrix = shipped_latency_matrix()
    assert not matrix.is_measured("africa-south1", "europe-west3")
    fit = matrix.fit()
    distance = great_circle_km(REGION_LOCATIONS["africa-south1"], REGION_LOCATIONS["europe-west3"])
    assert 8500 < distance < 9000  # Johannesburg–Frankfurt
    estimate = matrix.rtt_ms("africa-south1", "europe-west3")
    assert estimate == pytest.approx(fit.overhead_ms + fit.routing_factor * fibre_rtt_ms(distance))
    assert estimate == matrix.rtt_ms("europe-west3", "africa-south1")
    assert fibre_rtt_ms(distance) < estimate < 200
    # Farther away costs more.
    assert matrix.rtt_ms("africa-south1", "us-west2") > matrix.rtt_ms(
        "africa-south1", "europe-west3"
    )
    with pytest.raises(UnknownRegion, match="mars-north1"):
        matrix.rtt_ms("africa-south1", "mars-north1")


def test_the_rtt_table_is_built_for_the_fleet() -> None:
    table = region_rtt_table([*FLEET_REGIONS, "mars-north1"])
    matrix = shipped_latency_matrix()
    assert len(table) == 16  # 4 × 4, the unknown region left to the estimator's default
    for a, b in itertools.product(FLEET_REGIONS, repeat=2):
        assert table[(a, b)] == matrix.rtt_ms(a, b)
    assert table[("africa-south1", "africa-south1")] == 0.0
    every = region_rtt_table()
    assert ("africa-south1", "asia-south1") in every
