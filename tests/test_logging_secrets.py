"""Secrets never reach a log line (issue 12): URL passwords and secret-named values are
masked in every event, ours (structlog) and the libraries' (stdlib logging), in both
output formats; what is not a secret stays readable."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
import structlog

from shared.logs import LogFormat, configure_logging
from shared.redact import is_secret_key, redact_url

PASSWORD = "hunter2-s3cr3t"
TOKEN = "gf_abcdefghijklmnopqrstuvwxyz0123"


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_no_secret_appears_in_any_logged_line(restore_logging: None, log_format: LogFormat) -> None:
    out = io.StringIO()
    configure_logging("info", log_format, stream=out)
    log = structlog.get_logger("greenfed.test")
    log.info("mqtt connecting", url=f"mqtt://greenfed:{PASSWORD}@broker.example:1883")
    log.warning(
        "settings",
        mqtt={"url": f"mqtts://node-1:{PASSWORD}@10.0.0.2", "password": PASSWORD},
        nested=[{"api_key": PASSWORD}, ("token", {"Authorization": f"Bearer {TOKEN}"})],
        admin_token=TOKEN,
        client_secret=PASSWORD,
    )
    log.info(f"connect failed to postgresql://app:{PASSWORD}@db:5432/greenfed")
    log.info("header copied", header=f"Authorization: Bearer {TOKEN}")
    logging.getLogger("aiohttp.server").warning(
        "library says %s", f"amqp://guest:{PASSWORD}@queue/"
    )
    try:
        raise ConnectionError(f"could not reach mqtt://u:{PASSWORD}@h:1883")
    except ConnectionError:
        log.exception("failed")
    text = out.getvalue()
    assert text.count("\n") >= 6, text
    assert PASSWORD not in text
    assert TOKEN not in text
    # The rest of each line is still there for a reader.
    assert "broker.example:1883" in text
    assert "greenfed:***@" in text
    assert "library says" in text


def test_what_is_not_a_secret_is_left_alone(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    structlog.get_logger("t").info(
        "join token created",
        token_id="tok-1",
        join_token_ttl_s=3600,
        signing_key_file="/etc/greenfed/key",
        tokens=3,
        url="mqtt://broker:1883",
    )
    line = out.getvalue()
    for kept in ('"tok-1"', "3600", "/etc/greenfed/key", '"tokens": 3', "mqtt://broker:1883"):
        assert kept in line, line


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("mqtt://user:pw@host:1883", "mqtt://user:***@host:1883"),
        ("mqtts://:pw@host", "mqtts://:***@host"),
        ("mqtt://user@host", "mqtt://user@host"),
        ("mqtt://host:1883", "mqtt://host:1883"),
        ("http://a:b@h/p?q=mqtt://c:d@e", "http://a:***@h/p?q=mqtt://c:***@e"),
        # Base64 passwords hold '/': it ends at the '@' before the host, as SQLAlchemy
        # (and every client that takes such a URL) reads it.
        (
            "postgresql+asyncpg://greenfed:Zm9v/YmFy+cXV4=@db:5432/greenfed",
            "postgresql+asyncpg://greenfed:***@db:5432/greenfed",
        ),
        ("mqtt://node:Zm9v/YmFy@broker:1883", "mqtt://node:***@broker:1883"),
        ("mqtt://node:/leading@broker", "mqtt://node:***@broker"),
        # An unencoded '@' in the password: the host is after the last one (urllib's reading).
        ("mqtt://node:p@ss/w@broker:1883", "mqtt://node:***@broker:1883"),
        ("see mqtt://u:a/b@h:1883 and x@y", "see mqtt://u:***@h:1883 and x@y"),
    ],
)
def test_redact_url_masks_only_the_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_password_with_a_slash_is_masked_in_every_logged_line(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    password = "Zm9v/YmFy+cXV4="
    log = structlog.get_logger("greenfed.test")
    log.info("store", url=f"postgresql+asyncpg://greenfed:{password}@db:5432/greenfed")
    log.info(f"cannot connect to mqtt://node:{password}@broker:1883")
    text = out.getvalue()
    assert password not in text
    assert "Zm9v" not in text  # nor the part before the '/'
    assert "db:5432/greenfed" in text
    assert "broker:1883" in text


@pytest.mark.parametrize(
    "key", ["password", "mqtt_password", "Authorization", "apiKey", "api_key", "accessToken"]
)
def test_secret_key_names(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["tokens", "token_id", "join_token_ttl_s", "signing_key_file"])
def test_names_that_only_look_like_secrets(key: str) -> None:
    assert not is_secret_key(key)
