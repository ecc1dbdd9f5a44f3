"""What every `greenfed` command shares on the command line: exit statuses and the
argparse types that check an option's value (so a bad value is a usage error naming
the option, not a traceback)."""

from __future__ import annotations

import argparse
from typing import Final

from shared.settings import parse_mqtt_url

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_AUTH: Final = 3  # no token, or a token the API refused
EXIT_INTERRUPTED: Final = 130  # Ctrl-C, as a shell reports SIGINT


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def mqtt_url(text: str) -> str:
    try:
        parse_mqtt_url(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text
