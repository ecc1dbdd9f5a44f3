"""Builds the provider chain and the SignalService from `[signals]` settings.

The one place that knows which settings key feeds which constructor. HTTP
providers share the caller's `aiohttp.ClientSession` (the app owns its lifecycle).
A chain that replays a trace runs on that trace's clock — the wall clock's date
and time in `trace_replay_year` — unless the caller passes its own (the simulator).
The service built without a clock tells its snapshots on the wall clock, which the
scheduling loop plans by (replay_time.py): one "now" for the loop, the forecasts,
accounting and `/v1/signals`.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp

from cloud.signals.carbonaware import CarbonAwareSdkProvider
from cloud.signals.datasets import DatasetError
from cloud.signals.electricitymaps import ElectricityMapsProvider
from cloud.signals.model import SignalProvider
from cloud.signals.service import SignalService
from cloud.signals.static import StaticEntry, StaticProvider
from cloud.signals.trace import TraceProvider
from cloud.signals.ukgrid import UkCarbonIntensityProvider
from cloud.signals.units import Clock, replay_clock, system_clock
from cloud.signals.watttime import WattTimeProvider
from shared.settings import ConfigError, SignalSettings


def static_provider(settings: SignalSettings, clock: Clock) -> StaticProvider:
    table = {
        zone: StaticEntry(
            carbon_g_per_kwh=row.carbon_g_per_kwh,
            price_per_mwh=row.price_per_mwh,
            currency=row.currency,
        )
        for zone, row in settings.static_table.items()
    }
    return StaticProvider(table, use_builtin=settings.static_builtin, clock=clock)


def default_clock(settings: SignalSettings, wall_clock: Clock = system_clock) -> Clock:
    return (
        replay_clock(settings.trace_replay_year, wall_clock)
        if "trace" in settings.providers
        else wall_clock
    )


def build_providers(
    settings: SignalSettings,
    *,
    session: aiohttp.ClientSession | None,
    clock: Clock | None = None,
) -> list[SignalProvider]:
    """The configured chain, in order. Raises ConfigError naming the key that cannot be used."""
    clock = clock or default_clock(settings)
    timeout_s = settings.http_timeout_s
    providers: list[SignalProvider] = []
    for name in settings.providers:
        if name == "static":
            providers.append(static_provider(settings, clock))
            continue
        if name == "trace":
            try:
                providers.append(
                    TraceProvider(
                        Path(settings.trace_dir) if settings.trace_dir else None,
                        emission_factor=settings.trace_emission_factor,
                        clock=clock,
                    )
                )
            except DatasetError as error:
                raise ConfigError(f"signals.trace_dir: {error}") from None
            continue
        if session is None:
            raise ValueError(f"provider {name} needs an aiohttp.ClientSession")
        if name == "electricitymaps":
            assert settings.electricitymaps_token is not None  # checked by SignalSettings
            providers.append(
                ElectricityMapsProvider(
                    session,
                    token=settings.electricitymaps_token,
                    base_url=settings.electricitymaps_base_url,
                    timeout_s=timeout_s,
                    emission_factor=settings.electricitymaps_emission_factor,
                    clock=clock,
                )
            )
        elif name == "watttime":
            assert settings.watttime_username is not None
            assert settings.watttime_password is not None
            providers.append(
                WattTimeProvider(
                    session,
                    username=settings.watttime_username,
                    password=settings.watttime_password,
                    base_url=settings.watttime_base_url,
                    timeout_s=timeout_s,
                    regions=settings.watttime_regions,
                    clock=clock,
                )
            )
        elif name == "uk-carbon-intensity":
            providers.append(
                UkCarbonIntensityProvider(
                    session, base_url=settings.uk_base_url, timeout_s=timeout_s, clock=clock
                )
            )
        elif name == "carbon-aware-sdk":
            assert settings.carbonaware_base_url is not None
            providers.append(
                CarbonAwareSdkProvider(
                    session,
                    base_url=settings.carbonaware_base_url,
                    timeout_s=timeout_s,
                    locations=settings.carbonaware_locations,
                    signal_type=settings.carbonaware_signal_type,
                    clock=clock,
                )
            )
    return providers


def build_signal_service(
    settings: SignalSettings,
    *,
    session: aiohttp.ClientSession | None = None,
    clock: Clock | None = None,
    wall_clock: Clock = system_clock,
) -> SignalService:
    """The chain from settings, with the static table as the last fallback.

    `clock`: the signals' own (the simulator's), by which its caller also plans.
    Without one, the chain runs on `default_clock` and its snapshots are told on
    `wall_clock`, which the scheduling loop plans by (replay_time.py)."""
    planning_clock = wall_clock if clock is None else None
    clock = clock or default_clock(settings, wall_clock)
    return SignalService(
        build_providers(settings, session=session, clock=clock),
        static=static_provider(settings, clock),
        clock=clock,
        planning_clock=planning_clock,
        cache_ttl_s=settings.cache_ttl_s,
        staleness_limit_s=settings.staleness_limit_s,
        history_hours=settings.history_hours,
        horizon_hours=settings.forecast_horizon_hours,
        forecaster=settings.forecaster,
        rate_limit_backoff_s=settings.rate_limit_backoff_s,
        auth_backoff_s=settings.auth_backoff_s,
    )
