"""Forecasters on synthetic series whose right answer is known."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud.signals.forecast import (
    FORECASTERS,
    Persistence,
    ProfileLevel,
    SeasonalBlend,
    SeasonalNaive,
    forecast_carbon,
    forecaster_named,
)

DAY = np.array([100 + 50 * np.sin(2 * np.pi * h / 24) for h in range(24)])


def days(count: int) -> np.ndarray:
    return np.tile(DAY, count)


def test_persistence_repeats_the_current_hour() -> None:
    np.testing.assert_array_equal(Persistence().forecast(np.array([3.0, 7.0]), 4), [7.0] * 4)


def test_seasonal_naive_repeats_yesterday_at_the_same_hour() -> None:
    history = np.arange(48.0)  # hours 0..47; now is hour 47
    forecast = SeasonalNaive().forecast(history, 30)
    # Hour 48 is like hour 24, …, hour 71 like hour 47; then hour 72 again like hour 48 → 24.
    np.testing.assert_array_equal(forecast[:24], np.arange(24.0, 48.0))
    np.testing.assert_array_equal(forecast[24:], np.arange(24.0, 30.0))


def test_weekly_seasonal_naive_repeats_last_week() -> None:
    history = np.arange(24 * 8.0)
    forecast = SeasonalNaive(168, name="weekly").forecast(history, 5)
    np.testing.assert_array_equal(forecast, history[-168:-163])


def test_short_history_degrades_to_what_it_supports() -> None:
    assert SeasonalNaive().forecast(np.array([1.0, 2.0, 5.0]), 2).tolist() == [5.0, 5.0]
    weekly = SeasonalNaive(168, name="weekly").forecast(np.arange(30.0), 2)
    np.testing.assert_array_equal(weekly, [6.0, 7.0])  # falls back to daily
    assert ProfileLevel().forecast(np.arange(24.0), 2).tolist() == [23.0, 23.0]


# Persistence ignores the daily cycle by design; every other forecaster must get it right.
@pytest.mark.parametrize("name", sorted(set(FORECASTERS) - {"persistence"}))
def test_a_perfectly_periodic_day_is_forecast_exactly(name: str) -> None:
    forecast = FORECASTERS[name].forecast(days(8), 48)
    np.testing.assert_allclose(forecast, days(2), atol=1e-9)


def test_profile_level_follows_a_level_shift_near_term_and_the_profile_far_out() -> None:
    history = days(8)
    history[-3:] += 60  # the last three hours run 60 g/kWh above the usual day
    forecast = ProfileLevel(level_decay_per_hour=0.9).forecast(history, 48)
    expected_profile = days(2)
    shift = forecast - expected_profile
    assert shift[0] == pytest.approx(60 * 0.9)
    assert shift[5] == pytest.approx(60 * 0.9**6)
    # A day and a half out the shift has decayed back to the daily pattern.
    assert shift[35] == pytest.approx(60 * 0.9**36)
    assert abs(shift[35]) < 2
    # Seasonal naive would have missed the shift entirely for the next hour.
    assert SeasonalNaive().forecast(history, 1)[0] == pytest.approx(expected_profile[0])


def test_profile_level_weights_recent_days_more() -> None:
    old = np.full(24 * 7, 100.0)
    recent = np.full(24, 200.0)
    history = np.concatenate((old, recent, [200.0]))
    forecast = ProfileLevel(level_decay_per_hour=0.0).forecast(history, 1)
    weights = 0.7 ** np.arange(7)
    assert forecast[0] == pytest.approx(
        (200 * weights[0] + 100 * weights[1:].sum()) / weights.sum()
    )


def test_the_blend_weights_yesterday_and_last_week() -> None:
    history = np.arange(24 * 8.0)  # now is hour 191: next is hour 192
    assert SeasonalBlend(daily_weight=0.7).forecast(history, 1)[0] == pytest.approx(
        0.7 * (192 - 24) + 0.3 * (192 - 168)
    )


def test_carbon_forecasts_are_never_negative() -> None:
    usual_day = np.array([500.0] + [50.0] * 23)
    history = np.concatenate((np.tile(usual_day, 7), [0.0]))  # 0 where 500 is usual
    raw = ProfileLevel().forecast(history, 3)
    assert raw.min() < 0
    assert forecast_carbon(ProfileLevel(), history, 3).min() == 0.0


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        SeasonalNaive().forecast(np.array([1.0, np.nan]), 1)
    with pytest.raises(ValueError, match="at least one hour"):
        Persistence().forecast(np.array([]), 1)
    with pytest.raises(ValueError, match="unknown forecaster 'oracle'"):
        forecaster_named("oracle")


@settings(max_examples=60, deadline=None)
@given(
    history=st.lists(st.floats(0, 2000), min_size=1, max_size=400),
    horizon=st.integers(0, 96),
    name=st.sampled_from(sorted(FORECASTERS)),
)
def test_every_forecaster_returns_one_finite_value_per_hour(
    history: list[float], horizon: int, name: str
) -> None:
    forecast = FORECASTERS[name].forecast(np.array(history), horizon)
    assert forecast.shape == (horizon,)
    assert np.all(np.isfinite(forecast))
    # Forecasts stay within the range of what was seen, give or take the level shift.
    span = max(history) - min(history)
    assert np.all(forecast >= min(history) - span - 1e-6)
    assert np.all(forecast <= max(history) + span + 1e-6)
