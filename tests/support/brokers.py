"""Brokers for tests: the real Mosquitto of the machine, the embedded one, and our own
Mosquitto processes (for restarts and authentication)."""

from __future__ import annotations

import asyncio
import getpass
import os
import random
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import pytest

from shared.settings import parse_mqtt_url

MOSQUITTO_URL = os.environ.get("GREENFED_TEST_MOSQUITTO_URL", "mqtt://127.0.0.1:1883")
# CI sets this: a service that is not reachable there is a failure, never a skip.
REQUIRE_SERVICES = os.environ.get("GREENFED_TEST_REQUIRE_SERVICES") == "1"


@dataclass(frozen=True)
class BrokerUnderTest:
    kind: str  # "embedded" | "mosquitto"
    url: str


def tcp_reachable(url: str, timeout_s: float = 0.5) -> bool:
    endpoint = parse_mqtt_url(url)
    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s):
            return True
    except OSError:
        return False


def require_or_skip(reason: str) -> None:
    if REQUIRE_SERVICES:
        pytest.fail(f"{reason} (GREENFED_TEST_REQUIRE_SERVICES=1 forbids skipping)")
    pytest.skip(reason)


def mosquitto_binary() -> str | None:
    return shutil.which("mosquitto") or next(
        (
            path
            for path in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")
            if Path(path).exists()
        ),
        None,
    )


# Ports handed out below the kernel's ephemeral range, from this one up.
_LOWEST_TEST_PORT = 20000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, for a server the test starts next.

    Taken below the kernel's ephemeral range: a port the kernel hands out for ``bind``
    to port 0 is one it also hands out as the source port of outgoing connections, and
    between this probe and the server's own bind any of the suite's many connections
    (database, broker, change listeners) could take it ("Address already in use").
    Random, so that parallel test processes rarely try the same one; probed, so that
    one in use is skipped."""
    high = _ephemeral_low()
    chooser = random.SystemRandom()
    for _ in range(200):
        port = chooser.randrange(_LOWEST_TEST_PORT, high) if high > _LOWEST_TEST_PORT else 0
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    with socket.socket() as probe:  # nothing free below the range: any port
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path


def make_tls_files(workdir: Path) -> TlsFiles:
    """A throwaway CA and a server certificate for 127.0.0.1, made with openssl."""
    if shutil.which("openssl") is None:
        require_or_skip("openssl is not installed")
    ca_key, ca_cert = workdir / "ca.key", workdir / "ca.crt"
    key, csr, cert = workdir / "server.key", workdir / "server.csr", workdir / "server.crt"
    ext = workdir / "san.ext"
    ext.write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")
    commands = [
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=greenfed test CA",
            "-keyout",
            ca_key,
            "-out",
            ca_cert,
        ],
        [
            "openssl",
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            key,
            "-out",
            csr,
        ],
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca_cert,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            ext,
            "-out",
            cert,
        ],
    ]
    for command in commands:
        subprocess.run([str(part) for part in command], check=True, capture_output=True)
    return TlsFiles(ca_cert=ca_cert, server_cert=cert, server_key=key)


def make_password_file(workdir: Path, username: str, password: str, *more: tuple[str, str]) -> Path:
    """A Mosquitto password file with `username` and any `more` (user, password) pairs."""
    binary = shutil.which("mosquitto_passwd")
    if binary is None:
        require_or_skip("mosquitto_passwd is not installed")
    assert binary is not None
    path = workdir / "passwords"
    subprocess.run(
        [binary, "-c", "-b", str(path), username, password], check=True, capture_output=True
    )
    for user, secret in more:
        subprocess.run([binary, "-b", str(path), user, secret], check=True, capture_output=True)
    return path


DYNSEC_PLUGIN_PATHS = (
    "/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so",
    "/usr/lib/aarch64-linux-gnu/mosquitto_dynamic_security.so",
    "/usr/lib64/mosquitto_dynamic_security.so",
    "/usr/local/lib/mosquitto_dynamic_security.so",
)
DYNSEC_BOOTSTRAP = Path(__file__).resolve().parents[2] / "deploy/mosquitto/dynsec-bootstrap.sh"


@dataclass(frozen=True)
class DynamicSecurity:
    """Run Mosquitto with its dynamic security plugin: `admin` is the account that
    `mosquitto_ctrl dynsec init` creates; `bootstrap_control_plane` then makes the
    control plane's account as deploy/mosquitto/dynsec-bootstrap.sh documents."""

    admin_username: str = "admin"
    admin_password: str = "admin-password"


def dynsec_plugin() -> str | None:
    return next((path for path in DYNSEC_PLUGIN_PATHS if Path(path).exists()), None)


class MosquittoProcess:
    """A private Mosquitto on a free port that tests may stop, restart and configure."""

    def __init__(
        self,
        workdir: Path,
        *,
        password_file: Path | None = None,
        tls: TlsFiles | None = None,
        acl_file: Path | None = None,
        dynamic_security: DynamicSecurity | None = None,
        persistence: bool = False,
    ) -> None:
        """`persistence`: retained messages (and sessions) survive a restart, kept in
        `workdir`."""
        binary = mosquitto_binary()
        if binary is None:
            require_or_skip("the mosquitto binary is not installed")
        assert binary is not None
        self.binary = binary
        self.port = free_port()
        self.config = workdir / "mosquitto.conf"
        # Run as ourselves: as root, mosquitto would switch to its own user and then be
        # unable to read files in the test's private temporary directory.
        lines = [
            f"user {getpass.getuser()}",
            f"listener {self.port} 127.0.0.1",
            *(
                ["persistence true", f"persistence_location {workdir}/"]
                if persistence
                else ["persistence false"]
            ),
            f"log_dest file {workdir / 'mosquitto.log'}",
        ]
        if tls is not None:
            lines += [
                f"cafile {tls.ca_cert}",
                f"certfile {tls.server_cert}",
                f"keyfile {tls.server_key}",
            ]
        self.tls = tls
        self.dynamic_security = dynamic_security
        if dynamic_security is not None:
            lines += self._init_dynamic_security(workdir, dynamic_security)
        elif password_file is None:
            lines.append("allow_anonymous true")
        else:
            lines += ["allow_anonymous false", f"password_file {password_file}"]
        if acl_file is not None:
            lines.append(f"acl_file {acl_file}")
        self.config.write_text("\n".join(lines) + "\n")
        self._process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def _init_dynamic_security(workdir: Path, dynamic_security: DynamicSecurity) -> list[str]:
        plugin, ctrl = dynsec_plugin(), shutil.which("mosquitto_ctrl")
        if plugin is None or ctrl is None:
            require_or_skip("mosquitto's dynamic security plugin or mosquitto_ctrl is missing")
        assert plugin is not None
        assert ctrl is not None
        accounts = workdir / "dynamic-security.json"
        subprocess.run(
            [
                ctrl,
                "dynsec",
                "init",
                str(accounts),
                dynamic_security.admin_username,
                dynamic_security.admin_password,
            ],
            check=True,
            capture_output=True,
        )
        return [
            "per_listener_settings false",
            "allow_anonymous false",
            f"plugin {plugin}",
            f"plugin_opt_config_file {accounts}",
        ]

    async def bootstrap_control_plane(self, username: str, password: str, topic_root: str) -> None:
        """The documented one-time bootstrap (deploy/mosquitto/dynsec-bootstrap.sh)."""
        assert self.dynamic_security is not None, "started without dynamic_security"
        admin = self.dynamic_security
        process = await asyncio.create_subprocess_exec(
            "sh",
            str(DYNSEC_BOOTSTRAP),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-u",
            admin.admin_username,
            "-P",
            admin.admin_password,
            env={
                **os.environ,
                "GREENFED_CLOUD_USER": username,
                "GREENFED_CLOUD_PASSWORD": password,
                "GREENFED_TOPIC_ROOT": topic_root,
            },
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await process.communicate()
        # mosquitto_ctrl exits 0 even when the broker refused; its output says so.
        assert process.returncode == 0, output.decode()
        assert b"Error" not in output, output.decode()

    @property
    def url(self) -> str:
        scheme = "mqtts" if self.tls else "mqtt"
        return f"{scheme}://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._process = await asyncio.to_thread(
            subprocess.Popen,
            [self.binary, "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not tcp_reachable(self.url, timeout_s=0.2):
            if self._process.poll() is not None:
                raise RuntimeError(f"mosquitto exited with {self._process.returncode}")
            if loop.time() > deadline:
                raise RuntimeError("mosquitto did not start listening")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        """A clean shutdown (SIGTERM): Mosquitto publishes its clients' wills first."""
        if self._process is None:
            return
        process, self._process = self._process, None
        process.terminate()
        await asyncio.to_thread(process.wait, 10)

    async def kill(self) -> None:
        """SIGKILL: the broker vanishes mid-flight, publishing nothing."""
        if self._process is None:
            return
        process, self._process = self._process, None
        process.kill()
        await asyncio.to_thread(process.wait, 10)


async def clear_retained(url: str, topic_root: str) -> int:
    """Delete every retained message under `topic_root`; return how many there were.

    Retained messages arrive right after the subscription; a sentinel published on
    the same connection afterwards marks the end of them, so no waiting is guessed.
    """
    endpoint = parse_mqtt_url(url)
    sentinel = f"{topic_root}/_clear_retained_sentinel"
    retained: list[str] = []
    async with aiomqtt.Client(endpoint.host, endpoint.port) as client:
        await client.subscribe(f"{topic_root}/#", qos=1)
        await client.publish(sentinel, b"end", qos=1)
        async with asyncio.timeout(10):
            async for message in client.messages:
                topic = message.topic.value
                if topic == sentinel:
                    break
                if message.retain and message.payload:
                    retained.append(topic)
        for topic in retained:
            await client.publish(topic, b"", qos=1, retain=True)
    return len(retained)
