"""`store.database_url` as people write it: libpq's `sslmode`, parameters asyncpg does
not take, a port that is not a number. Each is used or refused by name, never a
traceback from the driver."""

from __future__ import annotations

import inspect
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import msgspec
import pytest

from cloud.store import NewTenant, StoreConfigError, create_store_engine, open_store
from cloud.store.engine import SSL_MODES, resolve_database
from greenfed.cli import main
from shared.settings import StoreSettings
from tests.store.databases import postgres_database

pytestmark = pytest.mark.timeout(60)


def connect_kwargs(database_url: str) -> dict[str, object]:
    """What SQLAlchemy will hand asyncpg's connect() for this URL."""
    settings = StoreSettings(database_url=database_url)
    target = resolve_database(settings)
    engine = create_store_engine(settings)
    args, kwargs = engine.dialect.create_connect_args(target.url)
    assert args == []
    return dict(kwargs)


@pytest.mark.parametrize("mode", SSL_MODES)
@pytest.mark.parametrize("name", ["sslmode", "ssl"])
def test_an_ssl_mode_in_the_url_reaches_asyncpg_as_ssl(name: str, mode: str) -> None:
    kwargs = connect_kwargs(f"postgresql://greenfed@db:5432/greenfed?{name}={mode}")
    assert kwargs["ssl"] == mode
    assert "sslmode" not in kwargs
    inspect.signature(asyncpg.connect).bind(**kwargs)  # no TypeError when it connects


def test_parameters_asyncpg_takes_by_name_are_passed_on() -> None:
    kwargs = connect_kwargs(
        "postgresql://greenfed@db/greenfed?target_session_attrs=read-write&passfile=/x/pgpass"
    )
    assert (kwargs["target_session_attrs"], kwargs["passfile"]) == ("read-write", "/x/pgpass")
    inspect.signature(asyncpg.connect).bind(**kwargs)


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("foo=1", "unsupported query parameter 'foo'"),
        ("application_name=x", "unsupported query parameter 'application_name'"),
        ("sslrootcert=/etc/ca.pem", "PGSSLROOTCERT"),
        ("connect_timeout=5", "store.connect_timeout_s"),
        ("sslmode=bogus", "sslmode='bogus' is not one of disable, allow, prefer, require"),
        ("sslmode=require&ssl=disable", "sslmode or ssl, not both"),
        ("sslmode=require&sslmode=disable", "query parameter 'sslmode' given twice"),
    ],
)
def test_a_parameter_asyncpg_does_not_take_is_refused_naming_it(query: str, said: str) -> None:
    with pytest.raises(StoreConfigError) as refused:
        resolve_database(StoreSettings(database_url=f"postgresql://greenfed@db/greenfed?{query}"))
    assert str(refused.value).startswith("store.database_url: ")
    assert said in str(refused.value)


def test_a_port_that_is_not_a_number_is_refused_naming_the_setting() -> None:
    with pytest.raises(StoreConfigError) as refused:
        resolve_database(StoreSettings(database_url="postgresql://u:secret@h:notaport/db"))
    assert str(refused.value).startswith(
        "store.database_url: 'postgresql://u:***@h:notaport/db' is not a database URL"
    )
    assert "secret" not in str(refused.value)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("postgresql://127.0.0.1:5432/test?sslmode=verify-fully", "sslmode='verify-fully'"),
        ("postgresql://127.0.0.1:5432/test?foo=1", "unsupported query parameter 'foo'"),
        ("postgresql://u@h:notaport/db", "is not a database URL"),
    ],
)
def test_the_cli_says_which_setting_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str, said: str
) -> None:
    config = tmp_path / "cloud.toml"
    config.write_text(f'[store]\ndatabase_url = "{url}"\n', encoding="utf-8")
    assert main(["store", "backup", "--config", str(config), str(tmp_path / "x.backup")]) == 1
    _, err = capsys.readouterr()
    assert err.startswith("greenfed: store.database_url: ")
    assert said in err
    assert err.count("\n") == 1


async def test_a_url_with_sslmode_opens_the_store(tmp_path: Path) -> None:
    async with postgres_database(tmp_path) as database:
        settings = msgspec.structs.replace(
            database.settings, database_url=database.settings.database_url + "?sslmode=prefer"
        )
        async with await open_store(settings) as store:
            await store.create_tenant(NewTenant(name="over-ssl-or-not"))
            assert [t.name for t in await store.list_tenants()] == ["over-ssl-or-not"]
