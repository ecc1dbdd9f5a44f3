"""What the tests of deploy/containers, deploy/compose and deploy/kubernetes share: the
files' places, a YAML loader, the API's real routes and the real settings that a
`GREENFED_*` variable or a settings file names."""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shared.settings import Settings, env_overrides

# No type stubs for PyYAML here; greenfed/spec_files.py loads it the same way.
yaml: Any = importlib.import_module("yaml")

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CONTAINERS = DEPLOY / "containers"
COMPOSE = DEPLOY / "compose"
KUBERNETES = DEPLOY / "kubernetes"

DEFAULTS = Settings()


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty document of a YAML file."""
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


@functools.cache
def api_routes() -> frozenset[str]:
    """The paths the control plane's app serves (GET or otherwise), as aiohttp has them."""
    from cloud.app import create_app

    app = create_app(DEFAULTS)
    return frozenset(
        route.resource.canonical for route in app.router.routes() if route.resource is not None
    )


def greenfed_variables(environment: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environment` that greenfed reads as settings."""
    return {name: value for name, value in environment.items() if name.startswith("GREENFED_")}


def assert_real_settings(environment: Mapping[str, str]) -> None:
    """Every GREENFED_<SECTION>__<KEY> names a real setting (ConfigError otherwise); a
    GREENFED_ variable without the double underscore would be silently ignored."""
    variables = greenfed_variables(environment)
    for name in variables:
        assert "__" in name, f"{name} is no setting: GREENFED_<SECTION>__<KEY>"
    env_overrides(variables)


_VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: Any, variables: Mapping[str, str]) -> Any:
    """Compose's `${NAME}`, `${NAME:-default}`, `${NAME:?error}` and `$$`, throughout a
    parsed document (the subset compose.yaml uses); a required variable that is not set
    raises KeyError, as `docker compose` stops."""
    if isinstance(value, dict):
        return {key: interpolate(item, variables) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, variables) for item in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, operator, argument = match.group(1), match.group(2), match.group(3)
        found = variables.get(name)
        if operator in (":-", "-"):
            return found if found else (argument or "")
        if operator in (":?", "?") and not found:
            raise KeyError(f"{name}: {argument}")
        return found or ""

    return _VARIABLE.sub(substitute, value)


def env_file(path: Path) -> dict[str, str]:
    """NAME=value lines of a .env file (comments and blank lines skipped)."""
    variables = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, value = line.partition("=")
            variables[name.strip()] = value.strip()
    return variables
