"""Files a setting names that cannot be used stop the command with one configuration
error line naming the setting (exit status 2), never a traceback or a bare errno:
mqtt.tls_ca_file, tls_cert_file and tls_key_file (`greenfed cloud`, `greenfed edge
run`, `greenfed edge doctor`), and a store.data_dir that cannot be made."""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from edge.doctor import check_broker
from greenfed.cli import main
from shared import mqtt
from shared.mqtt import MqttSession
from shared.settings import ConfigError, MqttSettings, Settings

EXIT_USAGE = 2
REPO_ROOT = Path(__file__).resolve().parents[2]


def write_key_and_certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate and its key, PEM: a CA, or a client's pair."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_path, certificate_path = directory / f"{name}.key", directory / f"{name}.crt"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    certificate_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return key_path, certificate_path


def tls_settings(
    *,
    tls_ca_file: str | None = None,
    tls_cert_file: str | None = None,
    tls_key_file: str | None = None,
) -> MqttSettings:
    return MqttSettings(
        url="mqtts://127.0.0.1:8883",
        tls_ca_file=tls_ca_file,
        tls_cert_file=tls_cert_file,
        tls_key_file=tls_key_file,
    )


@pytest.fixture
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No GREENFED_* setting from the environment the tests run in; data under tmp_path."""
    for name in list(os.environ):
        if name.startswith("GREENFED_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    return tmp_path


def test_cloud_with_a_missing_ca_file_says_so_in_one_line(
    isolated_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = isolated_env / "certs" / "ca.crt"
    monkeypatch.setenv("GREENFED_MQTT__TLS_CA_FILE", str(missing))
    code = main(["cloud", "--api-port", "1", "--mqtt-url", "mqtts://127.0.0.1:8883"])
    out, err = capsys.readouterr()
    assert (code, out) == (EXIT_USAGE, "")
    assert err == (
        f"greenfed: configuration error: mqtt.tls_ca_file: {missing}: No such file or directory\n"
    )


def test_up_with_a_ca_file_that_is_a_directory_says_so_in_one_line(
    isolated_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # What a Compose bind mount of a missing ./certs/ca.crt leaves in the container.
    bind_mounted = isolated_env / "ca.crt"
    bind_mounted.mkdir()
    monkeypatch.setenv("GREENFED_MQTT__TLS_CA_FILE", str(bind_mounted))
    code = main(["up", "--sim", "0", "--api-port", "1", "--mqtt-url", "mqtts://127.0.0.1:8883"])
    _, err = capsys.readouterr()
    assert code == EXIT_USAGE
    assert (
        err == f"greenfed: configuration error: mqtt.tls_ca_file: {bind_mounted}: Is a directory\n"
    )


def test_edge_run_with_a_missing_ca_file_says_so_in_one_line(isolated_env: Path) -> None:
    missing = isolated_env / "broker-ca.crt"  # a Kubernetes Secret without that key
    env = {
        **os.environ,
        "GREENFED_MQTT__TLS_CA_FILE": str(missing),
        "GREENFED_AGENT__DATA_DIR": str(isolated_env / "agent"),
        "GREENFED_AGENT__NODE_ID": "tls-files-n1",
        "GREENFED_AGENT__PROBES": '["cpu"]',
        "GREENFED_MQTT__TOPIC_ROOT": "review8-tls-files",
    }
    command = [sys.executable, "-m", "greenfed", "edge", "run", "--no-supervisor"]
    done = subprocess.run(
        [*command, "--mqtt-url", "mqtts://127.0.0.1:8883", "--log-level", "error"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"greenfed: configuration error: mqtt.tls_ca_file: {missing}: No such file or directory"
    )


def test_each_tls_file_is_named_when_it_fails(tmp_path: Path) -> None:
    ca_key, ca = write_key_and_certificate(tmp_path, "ca")
    client_key, client = write_key_and_certificate(tmp_path, "client")
    mqtt.check_tls_files(
        tls_settings(tls_ca_file=str(ca), tls_cert_file=str(client), tls_key_file=str(client_key))
    )  # all usable: no error
    missing = str(tmp_path / "gone.pem")
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("not a certificate\n")
    cases = {
        "mqtt.tls_cert_file": tls_settings(tls_ca_file=str(ca), tls_cert_file=missing),
        "mqtt.tls_key_file": tls_settings(
            tls_ca_file=str(ca), tls_cert_file=str(client), tls_key_file=missing
        ),
    }
    for key, settings in cases.items():
        with pytest.raises(ConfigError) as refused:
            mqtt.check_tls_files(settings)
        assert (refused.value.key, str(refused.value)) == (
            key,
            f"{key}: {missing}: No such file or directory",
        )
    said = f"mqtt.tls_ca_file: {not_pem}: not a PEM certificate"
    with pytest.raises(ConfigError, match=f"^{re.escape(said)}"):
        mqtt.check_tls_files(tls_settings(tls_ca_file=str(not_pem)))
    mismatched = tls_settings(tls_cert_file=str(client), tls_key_file=str(ca_key))
    with pytest.raises(ConfigError) as refused:
        mqtt.check_tls_files(mismatched)
    assert refused.value.key == "mqtt.tls_cert_file"
    assert f"{client} with mqtt.tls_key_file {ca_key}" in str(refused.value)
    # A plain mqtt:// url without a CA file uses no TLS: its files are not read.
    mqtt.check_tls_files(MqttSettings(url="mqtt://127.0.0.1:1883", tls_cert_file=missing))


def test_a_session_with_a_missing_tls_file_is_refused_as_it_is_made(tmp_path: Path) -> None:
    # The agent and each cloud MQTT client make one before connecting: refused there,
    # not as an OSError from every reconnect.
    missing = str(tmp_path / "ca.crt")
    with pytest.raises(ConfigError, match=r"^mqtt\.tls_ca_file: "):
        MqttSession(tls_settings(tls_ca_file=missing), client_id="tls-files")


async def test_doctor_names_the_missing_ca_file(tmp_path: Path) -> None:
    missing = tmp_path / "ca.crt"
    settings = msgspec.structs.replace(Settings(), mqtt=tls_settings(tls_ca_file=str(missing)))
    check = await check_broker(settings, agent_runs=lambda: False)
    assert check.verdict == "FAIL"
    assert check.detail == f"mqtt.tls_ca_file: {missing}: No such file or directory"


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_a_data_dir_that_cannot_be_made_names_the_setting(
    isolated_env: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    where: str,
) -> None:
    a_file = isolated_env / "afile"
    a_file.write_text("")
    data_dir = a_file if where == "a file" else a_file / "data"
    monkeypatch.setenv("GREENFED_STORE__DATA_DIR", str(data_dir))
    code = main(["cloud", "--api-port", "1"])
    out, err = capsys.readouterr()
    assert (code, out) == (EXIT_USAGE, "")
    said = (
        f"{data_dir} is not a directory"
        if where == "a file"
        else f"cannot create {data_dir}: Not a directory"
    )
    assert err == f"greenfed: configuration error: store.data_dir: {said}\n"
