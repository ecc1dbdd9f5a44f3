"""deploy/compose: compose.yaml valid against the Compose Specification's JSON Schema
(tests/deploy/schemas/compose-spec.json, taken offline from an npm package: see the
README there), every file it mounts present in the repository (or made at install, in a
directory .gitignore keeps out), the settings it gives the control plane real and
loadable with its settings file, healthchecks that ask real endpoints with the
services' own names, and its Mosquitto and Prometheus files held to the project's own
(deploy/mosquitto, deploy/prometheus). No container engine runs here: see
docs/deploy.md#containers for what was run by hand."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from greenfed.cli import build_parser
from shared.settings import load_settings
from tests.deploy.deploy_files import (
    COMPOSE,
    DEFAULTS,
    DEPLOY,
    REPO,
    api_routes,
    assert_real_settings,
    env_file,
    interpolate,
    yaml_documents,
)
from tests.deploy.test_containerfiles import CLOUD, instructions, stages
from tests.support.system_tools import require_tool

SCHEMA = Path(__file__).resolve().parent / "schemas" / "compose-spec.json"
# Made at install (docs/deploy.md#containers), never committed.
MADE_AT_INSTALL = ("certs", "secrets")


def raw() -> dict[str, Any]:
    (document,) = yaml_documents(COMPOSE / "compose.yaml")
    return document


def compose() -> dict[str, Any]:
    """compose.yaml as `docker compose` reads it with the example .env."""
    document: dict[str, Any] = interpolate(raw(), env_file(COMPOSE / "env.example"))
    return document


def service(name: str) -> dict[str, Any]:
    found: dict[str, Any] = compose()["services"][name]
    return found


def environment(name: str) -> dict[str, str]:
    return {key: str(value) for key, value in service(name).get("environment", {}).items()}


def bind_mounts(name: str) -> list[tuple[str, str]]:
    """(source relative to deploy/compose, target) of the service's bind mounts."""
    mounts = []
    for volume in service(name).get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts.append((source, target))
    return mounts


def test_the_file_is_valid_compose() -> None:
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(compose()), key=lambda error: list(error.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    # ... and the schema does refuse what is not.
    broken = compose()
    broken["services"]["cloud"]["healthcheck"]["intervall"] = "15s"
    assert list(validator.iter_errors(broken))


def test_every_required_variable_is_in_the_example() -> None:
    text = (COMPOSE / "compose.yaml").read_text()
    required = set(re.findall(r"\$\{([A-Z_]+):\?", text))
    assert required
    assert required <= set(env_file(COMPOSE / "env.example"))
    with pytest.raises(KeyError, match="BROKER_HOST"):
        interpolate(raw(), {})


@pytest.mark.parametrize("name", sorted(raw()["services"]))
def test_every_mounted_file_is_there_or_made_at_install(name: str) -> None:
    ignored = (COMPOSE / ".gitignore").read_text().split()
    for source, target in bind_mounts(name):
        path = (COMPOSE / source).resolve()
        relative = path.relative_to(COMPOSE.resolve()) if path.is_relative_to(COMPOSE) else None
        if relative is not None and relative.parts[0] in MADE_AT_INSTALL:
            assert f"{relative.parts[0]}/" in ignored, source
        else:
            assert path.exists(), f"{name}: {source} -> {target}"
            assert path.is_relative_to(REPO)


def test_secrets_are_files_never_values() -> None:
    document = compose()
    declared = document["secrets"]
    for name, definition in declared.items():
        assert set(definition) == {"file"}
        assert definition["file"].startswith("./secrets/"), name
    for name, each in document["services"].items():
        for secret in each.get("secrets", []):
            assert secret in declared, f"{name}: {secret}"
        for key in each.get("environment", {}):
            # A password is passed as a file (POSTGRES_PASSWORD_FILE), never as a value.
            assert "PASSWORD" not in key or key.endswith("_FILE"), f"{name}: {key}"


def test_the_control_plane_gets_real_settings_it_can_load(tmp_path: Path) -> None:
    cloud = service("cloud")
    variables = environment("cloud")
    assert_real_settings(variables)
    # The settings file is the secret `cloud-config`, cloud.example.toml filled in.
    command = cloud["command"]
    parsed = build_parser().parse_args(command)
    assert parsed.handler.__name__ == "cmd_cloud"
    assert str(parsed.config) == "/run/secrets/cloud-config"
    assert "cloud-config" in cloud["secrets"]
    assert compose()["secrets"]["cloud-config"]["file"] == "./secrets/cloud.toml"
    # What the image sets, then compose.yaml, over the file (docs/configuration.md).
    image_environment = {
        key: value
        for i in stages(instructions(CLOUD))[-1]
        if i.keyword == "ENV"
        for key, value in re.findall(r"([A-Z_][A-Z0-9_]*)=(\S+)", i.arguments)
        if key.startswith("GREENFED_")
    }
    settings = load_settings(COMPOSE / "cloud.example.toml", {**image_environment, **variables})
    assert settings.store.database_url.startswith("postgresql://greenfed:")
    assert "@postgres:5432/greenfed" in settings.store.database_url
    assert settings.cloud.broker_accounts == "dynamic-security"
    # The broker by the name agents use, which the mosquitto service answers to in the
    # network, over TLS with the mounted CA.
    broker_host = env_file(COMPOSE / "env.example")["BROKER_HOST"]
    assert settings.mqtt.url == f"mqtts://{broker_host}:8883"
    assert broker_host in service("mosquitto")["networks"]["default"]["aliases"]
    assert ("./certs/ca.crt", settings.mqtt.tls_ca_file) in bind_mounts("cloud")
    assert settings.cloud.public_url == env_file(COMPOSE / "env.example")["PUBLIC_URL"]
    # The API on its default port, published to this host's loopback only.
    assert settings.cloud.api_port == DEFAULTS.cloud.api_port
    assert cloud["ports"] == [f"127.0.0.1:{DEFAULTS.cloud.api_port}:{DEFAULTS.cloud.api_port}"]
    data_volume = [v for v in cloud["volumes"] if v.startswith("cloud-data:")]
    assert data_volume == [f"cloud-data:{settings.store.data_dir}"]
    assert cloud["read_only"] is True
    assert cloud["cap_drop"] == ["ALL"]


def test_healthchecks_ask_real_endpoints() -> None:
    # The control plane: the image's script, on the readiness route.
    final = stages(instructions(CLOUD))[-1]
    copied = {
        i.arguments.split()[1]
        for i in final
        if i.keyword == "COPY" and "healthcheck" in i.arguments
    }
    program, script, path = service("cloud")["healthcheck"]["test"][1:]
    assert service("cloud")["healthcheck"]["test"][0] == "CMD"
    assert program == "python"
    assert script in copied
    assert path == "/readyz"
    assert path in api_routes()
    # PostgreSQL: pg_isready for the user and database the image creates.
    postgres = service("postgres")
    check = postgres["healthcheck"]["test"]
    assert check[:2] == ["CMD", "pg_isready"]
    options = dict(part.removeprefix("--").split("=", 1) for part in check[2:])
    assert options["username"] == postgres["environment"]["POSTGRES_USER"]
    assert options["dbname"] == postgres["environment"]["POSTGRES_DB"]
    assert options["host"] == "127.0.0.1"
    # Prometheus: its readiness endpoint, on the port it publishes.
    prometheus = service("prometheus")
    check = prometheus["healthcheck"]["test"]
    assert check[:4] == ["CMD", "wget", "-q", "--spider"]
    url = check[4]
    assert re.fullmatch(r"http://127\.0\.0\.1:9090/-/ready", url)
    assert prometheus["ports"] == ["127.0.0.1:9090:9090"]


def test_start_order_waits_only_where_it_can() -> None:
    services = compose()["services"]
    for name, each in services.items():
        for dependency, condition in each.get("depends_on", {}).items():
            assert dependency in services, f"{name}: {dependency}"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name}: {dependency}"
    assert services["cloud"]["depends_on"] == {
        "postgres": {"condition": "service_healthy"},
        "mosquitto": {"condition": "service_started"},
    }
    # Monitoring starts, and alerts, when the control plane does not.
    assert "depends_on" not in services["prometheus"]


def test_the_build_is_the_checkout_and_its_containerfile() -> None:
    build = service("cloud")["build"]
    assert (COMPOSE / build["context"]).resolve() == REPO
    assert (REPO / build["dockerfile"]).resolve() == CLOUD


def _directives(path: Path) -> list[tuple[str, str]]:
    lines = path.read_text().splitlines()
    return [
        (key, value.strip())
        for key, _, value in (line.strip().partition(" ") for line in lines)
        if key and not key.startswith("#")
    ]


def test_mosquitto_is_the_projects_configuration_with_the_images_paths() -> None:
    ours = _directives(COMPOSE / "mosquitto.conf")
    project = _directives(DEPLOY / "mosquitto" / "mosquitto-dynsec.conf")
    image_paths = {"persistence_location", "plugin", "plugin_opt_config_file"}
    assert [d for d in ours if d[0] not in image_paths] == [
        d for d in project if d[0] not in image_paths
    ]
    assert [d[0] for d in ours] == [d[0] for d in project]
    values = dict(ours)
    assert values["plugin"] == "/usr/lib/mosquitto_dynamic_security.so"
    # State in the data volume; TLS files from ./certs; TLS published, 1883 not.
    mosquitto = service("mosquitto")
    assert "mosquitto-data:/mosquitto/data" in mosquitto["volumes"]
    assert values["persistence_location"].rstrip("/") == "/mosquitto/data"
    assert values["plugin_opt_config_file"].startswith("/mosquitto/data/")
    mounts = dict(bind_mounts("mosquitto"))
    assert mounts["./mosquitto.conf"] == "/mosquitto/config/mosquitto.conf"
    for key in ("cafile", "certfile", "keyfile"):
        assert Path(values[key]).parent.as_posix() == mounts["./certs"]
    assert mosquitto["ports"] == ["8883:8883"]
    assert mounts["../mosquitto/dynsec-bootstrap.sh"].endswith("dynsec-bootstrap.sh")


def test_prometheus_is_the_projects_scrape_on_the_compose_network(tmp_path: Path) -> None:
    (ours,) = yaml_documents(COMPOSE / "prometheus.yml")
    (project,) = yaml_documents(DEPLOY / "prometheus" / "prometheus.yml")
    assert ours["global"] == project["global"]
    (job,) = ours["scrape_configs"]
    (project_job,) = project["scrape_configs"]
    for key in ("job_name", "metrics_path", "scheme", "scrape_timeout"):
        assert job[key] == project_job[key], key
    assert job["metrics_path"] in api_routes()
    assert job["authorization"]["type"] == project_job["authorization"]["type"] == "Bearer"
    assert job["static_configs"] == [{"targets": [f"cloud:{DEFAULTS.cloud.api_port}"]}]
    # The token and the rules where compose.yaml puts them.
    prometheus = service("prometheus")
    token = job["authorization"]["credentials_file"]
    assert token == "/run/secrets/" + "metrics-token"
    assert "metrics-token" in prometheus["secrets"]
    mounts = {target: source for source, target in bind_mounts("prometheus")}
    (rules,) = ours["rule_files"]
    assert (COMPOSE / mounts[rules]).resolve() == DEPLOY / "prometheus" / "alerts.yml"
    assert mounts["/etc/prometheus/prometheus.yml"] == "./prometheus.yml"
    # promtool accepts it, with the container's paths made local.
    promtool = require_tool("promtool", "prometheus")
    (tmp_path / "metrics-token").write_text("gfm_test\n")
    text = (COMPOSE / "prometheus.yml").read_text()
    text = text.replace(rules, str(DEPLOY / "prometheus" / "alerts.yml"))
    text = text.replace(token, str(tmp_path / "metrics-token"))
    local = tmp_path / "prometheus.yml"
    local.write_text(text)
    checked = subprocess.run(
        [promtool, "check", "config", str(local)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
