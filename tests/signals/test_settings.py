"""The [signals] settings section, its errors, and the chain the factory builds from it."""

from __future__ import annotations

import typing
from pathlib import Path

import aiohttp
import msgspec
import pytest

from cloud.signals.carbonaware import CarbonAwareSdkProvider
from cloud.signals.electricitymaps import ElectricityMapsProvider
from cloud.signals.factory import build_providers, build_signal_service
from cloud.signals.forecast import FORECASTERS
from cloud.signals.static import StaticProvider
from cloud.signals.trace import TraceProvider
from cloud.signals.ukgrid import UkCarbonIntensityProvider
from cloud.signals.watttime import WattTimeProvider
from shared.settings import (
    ConfigError,
    ForecasterSetting,
    Settings,
    SignalSettings,
    load_settings,
)

from .support import FakeClock, epoch

NO_ENV: dict[str, str] = {}


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> Settings:
    path = tmp_path / "greenfed.toml"
    path.write_text(text, encoding="utf-8")
    return load_settings(path, environ or NO_ENV)


def test_the_defaults_replay_the_shipped_trace() -> None:
    signals = load_settings(None, NO_ENV).signals
    assert signals == SignalSettings()
    assert signals.providers == ("trace",)
    assert signals.forecast_horizon_hours == 48
    assert signals.forecaster == "profile-level"


def test_settings_name_the_same_forecasters_as_the_code() -> None:
    assert set(typing.get_args(ForecasterSetting)) == set(FORECASTERS)


def test_a_full_section_is_read(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        """
        [signals]
        providers = ["electricitymaps", "watttime", "uk-carbon-intensity", "static"]
        electricitymaps_token = "em-token"
        watttime_username = "me"
        watttime_password = "secret"
        watttime_regions = { "US-CAL-CISO" = "CAISO_SOUTH" }
        cache_ttl_s = 120
        staleness_limit_s = 7200
        static_table = { ZA = { carbon_g_per_kwh = 700, price_per_mwh = 70 } }
    """,
    )
    signals = settings.signals
    assert signals.providers == ("electricitymaps", "watttime", "uk-carbon-intensity", "static")
    assert signals.watttime_regions == {"US-CAL-CISO": "CAISO_SOUTH"}
    assert signals.static_table["ZA"].price_per_mwh == 70
    assert (signals.cache_ttl_s, signals.staleness_limit_s) == (120, 7200)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cache_ttl = 3", "signals.cache_ttl: unknown key"),
        ('providers = ["electricitymaps"]', "signals.electricitymaps_token: required"),
        ('providers = ["watttime"]\nwatttime_username = "x"', "signals.watttime_username"),
        ('providers = ["carbon-aware-sdk"]', "signals.carbonaware_base_url: required"),
        ('providers = ["trace", "uk-carbon-intensity"]', "signals.providers: trace replays"),
        ('providers = ["static", "static"]', "signals.providers"),
        ("providers = []", "signals.providers: name at least one"),
        ('providers = ["bing"]', "signals.providers"),
        ('forecaster = "oracle"', "signals.forecaster"),
        ("forecast_horizon_hours = 0", "signals.forecast_horizon_hours"),
        ('uk_base_url = "ftp://x"', "signals.uk_base_url: 'ftp://x' must start with http"),
        ("static_table = { ZA = { carbon_g_per_kwh = -5 } }", "carbon_g_per_kwh"),
        ("static_table = { ZA = { carbon = 5 } }", "unknown key"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load(tmp_path, "[signals]\n" + text + "\n")


def test_environment_variables_override_signals_keys() -> None:
    settings = load_settings(
        None,
        {
            "GREENFED_SIGNALS__PROVIDERS": '["uk-carbon-intensity", "static"]',
            "GREENFED_SIGNALS__CACHE_TTL_S": "60",
            "GREENFED_SIGNALS__TRACE_DIR": "/data/traces",
        },
    )
    assert settings.signals.providers == ("uk-carbon-intensity", "static")
    assert settings.signals.cache_ttl_s == 60
    assert settings.signals.trace_dir == "/data/traces"
    with pytest.raises(ConfigError, match="GREENFED_SIGNALS__CACHE_TTL: unknown key"):
        load_settings(None, {"GREENFED_SIGNALS__CACHE_TTL": "60"})


async def test_the_factory_builds_the_chain_in_order() -> None:
    settings = msgspec.convert(
        {
            "providers": [
                "electricitymaps",
                "watttime",
                "uk-carbon-intensity",
                "carbon-aware-sdk",
                "static",
            ],
            "electricitymaps_token": "t",
            "watttime_username": "u",
            "watttime_password": "p",
            "carbonaware_base_url": "http://127.0.0.1:9",
            "carbonaware_locations": {"NL": "westeurope"},
        },
        SignalSettings,
    )
    async with aiohttp.ClientSession() as session:
        providers = build_providers(settings, session=session, clock=FakeClock(0))
        service = build_signal_service(settings, session=session, clock=FakeClock(0))
    assert [type(p) for p in providers] == [
        ElectricityMapsProvider,
        WattTimeProvider,
        UkCarbonIntensityProvider,
        CarbonAwareSdkProvider,
        StaticProvider,
    ]
    assert service.providers == (
        "electricitymaps",
        "watttime",
        "uk-carbon-intensity",
        "carbon-aware-sdk",
        "static",
    )


async def test_the_default_chain_replays_2023_at_the_same_calendar_time() -> None:
    wall = FakeClock(epoch(2026, 6, 16, 16, 30))
    service = build_signal_service(SignalSettings(), clock=None)
    assert service.providers == ("trace",)
    traced = build_providers(SignalSettings(), session=None, clock=wall)
    assert isinstance(traced[0], TraceProvider)
    snapshot = await build_signal_service(
        SignalSettings(history_hours=2), clock=FakeClock(epoch(2023, 6, 16, 16, 30))
    ).snapshot(["ZA", "DE"])
    assert sorted(snapshot.zones) == ["DE", "ZA"]
    assert snapshot.zones["ZA"].carbon_at(epoch(2023, 6, 16, 16, 30)) == 683.59


def test_a_missing_trace_directory_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    settings = SignalSettings(trace_dir=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"signals\.trace_dir: .*does not exist"):
        build_providers(settings, session=None)


def test_http_providers_need_a_session() -> None:
    settings = SignalSettings(providers=("uk-carbon-intensity",))
    with pytest.raises(ValueError, match="ClientSession"):
        build_providers(settings, session=None)
