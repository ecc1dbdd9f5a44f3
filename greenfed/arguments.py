"""What every `greenfed` command shares on the command line: exit statuses, the
argparse types that check an option's value (so a bad value is a usage error naming
the option, not a traceback), the settings options and how a command's errors become
exit statuses."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from greenfed.data_dir_lock import DataDirInUse
from shared.errors import FieldError, MqttAuthError, dotted_path
from shared.settings import (
    ConfigError,
    Settings,
    env_overrides,
    load_settings,
    parse_mqtt_url,
    setting_origin,
)

if TYPE_CHECKING:
    import argparse

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_AUTH: Final = 3  # no token, or a token the API refused
EXIT_INTERRUPTED: Final = 130  # Ctrl-C, as a shell reports SIGINT
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
LOG_FORMATS: Final = ("auto", "json", "console")


def _invalid_value(message: str) -> Exception:
    """argparse's error for an option's value, argparse imported only then: the agent
    reads a valid command line without it (greenfed/edge_run.py)."""
    from argparse import ArgumentTypeError

    return ArgumentTypeError(message)


def _whole_number(text: str) -> int:
    """argparse names a type function in its message for a ValueError ("invalid
    positive_int value"): a sentence instead."""
    try:
        return int(text)
    except ValueError:
        raise _invalid_value(f"{text!r} is not a whole number") from None


def port(text: str) -> int:
    value = _whole_number(text)
    if not 0 <= value <= 65535:
        raise _invalid_value(f"{value} is not a TCP port")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _invalid_value(f"{text!r} is not a number") from None
    # float() reads "inf" and "nan" too; NaN passes any comparison's `not`.
    if not math.isfinite(value):
        raise _invalid_value(f"{value} is not a finite number")
    if value <= 0:
        raise _invalid_value(f"{value} must be > 0")
    return value


def positive_int(text: str) -> int:
    value = _whole_number(text)
    if value < 1:
        raise _invalid_value(f"{value} must be >= 1")
    return value


def non_negative_int(text: str) -> int:
    value = _whole_number(text)
    if value < 0:
        raise _invalid_value(f"{value} must be >= 0")
    return value


def percentage(text: str) -> float:
    """`10%` or `10` -> 10.0, from 0 to 100."""
    try:
        value = float(text.removesuffix("%"))
    except ValueError:
        raise _invalid_value(f"{text!r} is not a percentage such as 10%") from None
    if not 0 <= value <= 100:
        raise _invalid_value(f"{text!r} is not a percentage from 0 to 100")
    return value


def mqtt_url(text: str) -> str:
    try:
        parse_mqtt_url(text)
    except ValueError as error:
        raise _invalid_value(str(error)) from None
    return text


_SIZE_UNITS: Final = {
    "": 1,
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
    "TIB": 1024**4,
}


def size_bytes_argument(text: str) -> int:
    """`80GiB`, `24GB`, `512MiB` or plain bytes."""
    number = text.strip().rstrip("BbIiKkMmGgTt")
    unit = text.strip()[len(number) :].upper()
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except (KeyError, ValueError):
        raise _invalid_value(
            f"{text!r} is not a size: a number and B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
        ) from None
    # float() reads "inf" and "nan" too, and a number too large for a float is inf.
    if not math.isfinite(value):
        raise _invalid_value(f"{text!r} is not a finite size")
    if value < 1:
        raise _invalid_value(f"{text!r} must be at least 1 byte")
    return int(value)


def accelerator_counts_argument(text: str) -> dict[str, int]:
    """`gpu=8,npu=1,cpu=2`: at most this many accelerators of each kind."""
    counts: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, _, count = item.partition("=")
        if kind not in ("gpu", "npu", "cpu") or not count.isdigit():
            raise _invalid_value(f"{item!r}: KIND=N with KIND gpu, npu or cpu and N a whole number")
        counts[kind] = int(count)
    return counts


def add_confirm_bulk_option(parser: argparse.ArgumentParser) -> None:
    """`--confirm-bulk` on the commands an admin may run in bulk (revoke, drain, cancel)."""
    parser.add_argument(
        "--confirm-bulk",
        action="store_true",
        help="go ahead past cloud.destructive_actions_per_minute (admin: a bulk clean-up)",
    )


def add_settings_options(parser: argparse.ArgumentParser, *, mqtt: bool = True) -> None:
    parser.add_argument(
        "--config", type=Path, help="TOML settings file (see docs/configuration.md)"
    )
    if mqtt:
        parser.add_argument("--mqtt-url", type=mqtt_url, help="mqtt://host:port or mqtts://...")
    parser.add_argument("--log-level", choices=LOG_LEVELS)
    parser.add_argument("--log-format", choices=LOG_FORMATS)


# The settings the options of add_settings_options (and a command's own: --api-host,
# --api-port, --telemetry-interval) set: (option, its attribute in args, section, key).
_SETTING_OPTIONS: Final = (
    ("--mqtt-url", "mqtt_url", "mqtt", "url"),
    ("--api-host", "api_host", "cloud", "api_host"),
    ("--api-port", "api_port", "cloud", "api_port"),
    ("--telemetry-interval", "telemetry_interval", "agent", "telemetry_interval_s"),
    ("--log-level", "log_level", "log", "level"),
    ("--log-format", "log_format", "log", "format"),
)


def settings_from_options(
    args: argparse.Namespace,
    *,
    default_log_level: str | None = None,
    fleet_reports_here: bool = False,
) -> Settings:
    """Settings from --config and GREENFED_* variables, then the command-line flags on top,
    checked as the file's values are (a ConfigError names the option). With
    `fleet_reports_here` (`greenfed up`: its agents report to the control plane of these
    same settings), agent settings that control plane would refuse are refused too."""
    overrides: dict[str, dict[str, Any]] = {}
    origins: dict[str, str] = {}
    for option, attribute, section, key in _SETTING_OPTIONS:
        value = getattr(args, attribute, None)
        if value is not None:
            overrides.setdefault(section, {})[key] = value
            origins[f"{section}.{key}"] = option
    if default_log_level and "level" not in overrides.get("log", {}):
        overrides.setdefault("log", {})["level"] = default_log_level
    settings = load_settings(args.config, options=overrides, option_names=origins)
    if fleet_reports_here:
        try:
            settings.check_fleet_reports_here()
        except FieldError as error:
            key = dotted_path(error.path)
            origin = setting_origin(
                key,
                source="defaults" if args.config is None else str(args.config),
                env=env_overrides(os.environ),
                options=origins,
            )
            raise ConfigError(f"{origin}: {key}: {error.reason}", key=key) from None
    return settings


def run_command(args: argparse.Namespace) -> int:
    """Run the command `args` were parsed for (`args.handler`); its expected failures
    become a line on stderr and an exit status."""
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        # Ctrl-C where the command did not handle it (a backup, an evaluation, a
        # benchmark): what the client commands answer, with no traceback. What the
        # command was writing is its to discard as it unwinds (a backup's partial file).
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        raise  # main() handles it, wherever it happens
    except ConfigError as error:
        print(f"greenfed: configuration error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except MqttAuthError as error:
        print(f"greenfed: {error}", file=sys.stderr)
        return EXIT_AUTH
    except DataDirInUse as error:
        print(f"greenfed: {error}", file=sys.stderr)
        return EXIT_FAILURE
    except OSError as error:  # e.g. the API port is already in use
        print(f"greenfed: {error}", file=sys.stderr)
        return EXIT_FAILURE
    except ImportError as error:
        print(
            f"greenfed: {error.name or error} is not installed; install the extra this command "
            "needs, e.g. pip install 'greenfed[all]'",
            file=sys.stderr,
        )
        return EXIT_FAILURE
