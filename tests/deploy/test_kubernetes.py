"""The Kubernetes manifests in deploy/kubernetes: every object valid against the
Kubernetes 1.30 API schemas (kubernetes-validate, strict: no unknown field; its schemas
ship in the package, so this runs offline), and in agreement with the code: probes on
routes the app serves, the default API port, environment variables and a ConfigMap that
greenfed's settings loader accepts, the keys the Secret must hold, a pod that runs as
the image's non-root user with nothing it does not need. No API server is reachable
where greenfed is tested, so nothing is applied to a cluster here."""

from __future__ import annotations

import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from shared.settings import ConfigError, load_settings
from tests.deploy.deploy_files import (
    DEFAULTS,
    KUBERNETES,
    api_routes,
    assert_real_settings,
    yaml_documents,
)
from tests.deploy.test_containerfiles import IMAGE_UID
from tests.support.system_tools import require_tool

# The oldest Kubernetes the manifests are for (docs/deploy.md#kubernetes); the package
# ships the schemas of 1.25 to its own release.
KUBERNETES_VERSION = "1.30.0"
# Applied on their own, each where it applies (kustomization.yaml says why).
APART = {"secret.template.yaml", "servicemonitor.yaml", "ingress.yaml"}
MANIFESTS = sorted(p for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml")
NAMESPACE = "greenfed"


def objects() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, document) for path in MANIFESTS for document in yaml_documents(path)]


def the(kind: str) -> dict[str, Any]:
    (found,) = [document for _, document in objects() if document["kind"] == kind]
    return found


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = the("Deployment")["spec"]["template"]["spec"]
    return spec


def container(name: str) -> dict[str, Any]:
    spec = pod_spec()
    every: list[dict[str, Any]] = spec["containers"] + spec.get("initContainers", [])
    (found,) = [each for each in every if each["name"] == name]
    return found


def test_the_version_validated_against_is_shipped() -> None:
    assert KUBERNETES_VERSION in kubernetes_validate.utils.all_versions()


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
def test_the_manifest_is_valid_kubernetes(path: Path) -> None:
    for document in yaml_documents(path):
        if document["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: test_the_service_monitor_scrapes_every_replica
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_kustomization_names_every_manifest_but_those_applied_apart() -> None:
    (kustomization,) = yaml_documents(KUBERNETES / "kustomization.yaml")
    assert kustomization["namespace"] == NAMESPACE
    listed = set(kustomization["resources"])
    assert listed == {path.name for path in MANIFESTS} - APART
    # Every object names the namespace itself too, so `kubectl apply -f FILE` works.
    for path, document in objects():
        if document["kind"] != "Namespace":
            assert document["metadata"]["namespace"] == NAMESPACE, path.name
    (image,) = kustomization["images"]
    assert {c["image"] for c in pod_spec()["containers"] + pod_spec()["initContainers"]} == {
        image["name"]
    }


def test_two_replicas_lead_through_postgresql() -> None:
    deployment = the("Deployment")
    assert deployment["spec"]["replicas"] == 2
    # Never the previous release and this one side by side (docs/upgrades.md).
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    # Replicas elect their scheduling leader on PostgreSQL, and the comment says so.
    text = (KUBERNETES / "deployment.yaml").read_text()
    assert "PostgreSQL advisory lock" in text
    assert "cloud/store/leadership.py" in text
    budget = the("PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for selector in (
        budget["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"],
        the("Service")["spec"]["selector"],
    ):
        assert selector.items() <= labels.items()


def test_probes_ask_routes_the_app_serves_on_its_port() -> None:
    cloud = container("cloud")
    (port,) = cloud["ports"]
    assert port["containerPort"] == DEFAULTS.cloud.api_port
    service_port = the("Service")["spec"]["ports"][0]
    assert service_port["targetPort"] == port["name"]
    assert service_port["port"] == port["containerPort"]
    expected = {
        "startupProbe": "/healthz",
        "livenessProbe": "/healthz",
        "readinessProbe": "/readyz",
    }
    for probe, path in expected.items():
        get = cloud[probe]["httpGet"]
        assert get["path"] == path
        assert path in api_routes()
        assert get["port"] == port["name"]
    # The first start (tables, grid data) took 25 s on a busy 2-core machine.
    startup = cloud["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120


def _settings_files(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """The ConfigMap's TOML at the path the container reads, and the container's
    environment with the Secret template's values."""
    secret = the("Secret")["stringData"]
    cloud = container("cloud")
    environment = {
        variable["name"]: secret[variable["valueFrom"]["secretKeyRef"]["key"]]
        for variable in cloud["env"]
    }
    config = tmp_path / "cloud.toml"
    config.write_text(the("ConfigMap")["data"]["cloud.toml"])
    return config, environment


def test_the_configuration_is_one_greenfed_loads(tmp_path: Path) -> None:
    config, environment = _settings_files(tmp_path)
    assert_real_settings(environment)
    settings = load_settings(config, environ=environment)
    assert settings.store.database_url.startswith("postgresql://")
    assert settings.cloud.api_host == "0.0.0.0"
    assert settings.cloud.api_port == DEFAULTS.cloud.api_port
    assert settings.mqtt.url.startswith("mqtts://")
    # Every path it names is mounted where it says.
    cloud = container("cloud")
    mounts = {m["mountPath"]: m["name"] for m in cloud["volumeMounts"]}
    args = cloud["args"]
    assert args[:2] == ["cloud", "--config"]
    assert Path(args[2]).parent.as_posix() in mounts
    assert Path(args[2]).name == "cloud.toml"
    for path in (
        settings.cloud.signing_key_file,
        settings.cloud.secrets_key_file,
        settings.mqtt.tls_ca_file or "",
    ):
        assert Path(path).parent.as_posix() in mounts, path
    assert mounts[settings.store.data_dir] == "data"


def test_the_secret_template_holds_every_key_the_pod_reads() -> None:
    secret = the("Secret")
    keys = set(secret["stringData"])
    used = {v["valueFrom"]["secretKeyRef"]["key"] for v in container("cloud")["env"]}
    for volume in pod_spec()["volumes"]:
        if "secret" in volume:
            assert volume["secret"]["secretName"] == secret["metadata"]["name"]
            used |= {item["key"] for item in volume["secret"]["items"]}
    assert used == keys
    # A template: nothing in it is a real secret.
    assert all("CHANGE-ME" in value for value in secret["stringData"].values())


def test_the_pod_runs_unprivileged_with_a_read_only_root() -> None:
    spec = pod_spec()
    context = spec["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == context["runAsGroup"] == IMAGE_UID
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    for each in spec["containers"] + spec["initContainers"]:
        own = each["securityContext"]
        assert own["runAsNonRoot"] is True
        assert own["readOnlyRootFilesystem"] is True
        assert own["allowPrivilegeEscalation"] is False
        assert own["capabilities"] == {"drop": ["ALL"]}
        resources = each["resources"]
        assert set(resources) == {"requests", "limits"}
        assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}


def test_the_keys_reach_greenfed_owner_only(tmp_path: Path) -> None:
    """The init container's command, run here on a Secret volume as the kubelet makes
    it with fsGroup (group-readable), leaves files that greenfed's key loader accepts."""
    from cloud.loop.signing import load_or_create_signing_key
    from cloud.secrets.at_rest import load_or_create_secrets_key

    openssl = require_tool("openssl", "openssl")
    source, target = tmp_path / "keys-secret", tmp_path / "keys"
    source.mkdir()
    target.mkdir()
    # The two commands secret.template.yaml gives for making the keys.
    subprocess.run(
        [openssl, "genpkey", "-algorithm", "ed25519", "-out", "desired-signing.key"],
        cwd=source, check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(
        ["bash", "-c", "head -c 64 /dev/urandom | base64 -w0 > secrets.key"],
        cwd=source, check=True, capture_output=True,
    )  # fmt: skip
    template = (KUBERNETES / "secret.template.yaml").read_text()
    assert "openssl genpkey -algorithm ed25519 -out desired-signing.key" in template
    assert "head -c 64 /dev/urandom | base64 -w0 > secrets.key" in template
    (volume,) = [v for v in pod_spec()["volumes"] if v["name"] == "keys-secret"]
    mode = volume["secret"]["defaultMode"]  # YAML's 0440: octal
    assert mode == 0o440
    for key in source.iterdir():
        key.chmod(mode)
    # Why the copy: read from the Secret's volume itself, the key is refused.
    exposed = {"GREENFED_CLOUD__SIGNING_KEY_FILE": str(source / "desired-signing.key")}
    with pytest.raises(ConfigError, match="readable by others"):
        load_or_create_signing_key(load_settings(None, environ=exposed))
    command = [
        re.sub(r"^/run/greenfed/keys-secret", str(source), part).replace(
            "/run/greenfed/keys/", f"{target}/"
        )
        for part in container("keys")["command"]
    ]
    subprocess.run(command, check=True, capture_output=True)
    for key in target.iterdir():
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    environment = {
        "GREENFED_CLOUD__SIGNING_KEY_FILE": str(target / "desired-signing.key"),
        "GREENFED_CLOUD__SECRETS_KEY_FILE": str(target / "secrets.key"),
        "GREENFED_STORE__DATA_DIR": str(tmp_path / "data"),
    }
    settings = load_settings(None, environ=environment)
    load_or_create_signing_key(settings)
    load_or_create_secrets_key(settings)


def test_the_service_monitor_scrapes_every_replica() -> None:
    """Checked field by field, not against the ServiceMonitor CRD's schema: no package on
    PyPI ships that schema (npm's @kubernetes-models/prometheus-operator has it compiled
    into JavaScript validators only; docs/deploy.md#kubernetes says it was run by hand)."""
    monitor = the("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    spec = monitor["spec"]
    assert set(spec) == {"selector", "endpoints", "jobLabel"}
    service = the("Service")
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = spec["endpoints"]
    known = {"port", "path", "scheme", "interval", "scrapeTimeout", "authorization"}
    assert set(endpoint) <= known
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["path"] in api_routes()
    assert endpoint["scheme"] == "http"
    # The CRD's duration pattern, and a timeout within the interval.
    duration = re.compile(r"^(0|(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")
    seconds = {}
    for field in ("interval", "scrapeTimeout"):
        assert duration.match(endpoint[field]), endpoint[field]
        seconds[field] = int(endpoint[field].rstrip("s"))
    assert seconds["scrapeTimeout"] <= seconds["interval"]
    # The scrape token, as a Secret key reference (SecretKeySelector: name, key).
    authorization = endpoint["authorization"]
    assert authorization["type"] == "Bearer"
    assert set(authorization["credentials"]) == {"name", "key"}


def test_the_ingress_publishes_the_api_but_not_metrics() -> None:
    ingress = the("Ingress")
    (rule,) = ingress["spec"]["rules"]
    published = {path["path"] for path in rule["http"]["paths"]}
    routes = api_routes()
    for prefix in published:
        assert any(route == prefix or route.startswith(prefix + "/") for route in routes)
    assert not any(route.startswith(p) for p in published for route in ("/metrics", "/readyz"))
    # Every route but the scrape and the probes is reachable through it.
    private = {"/metrics", "/healthz", "/readyz"}
    for route in routes - private:
        assert any(route == p or route.startswith(p + "/") for p in published), route
    assert {tls["secretName"] for tls in ingress["spec"]["tls"]} == {"greenfed-api-tls"}
