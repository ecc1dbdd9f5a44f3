"""`greenfed edge enrol`: trade a join token for this node's MQTT credentials and the
control plane's public key, written into the agent's settings file.

The node's sealing key (edge/sealing_key.py: the X25519 key pair job secrets are sealed
to) is loaded, or made, where the agent will read it, and its public half sent with the
enrolment: the control plane pins it and seals secrets only to a node that announces it.

The file is written whole, atomically, created with mode 0600 (it holds the broker
password); keys already in it that enrolment does not set are kept (comments are not).
The agent's own site, zone, region and labels (those already in the file) are sent
with the enrolment and kept, unless the join token sets them.

Its first line records the enrolment (API URL, cluster id, node id), so that running
the same command again changes nothing: a join token is spent once, and an install
script may be re-run. The control plane's enrolment certificate is kept beside the
sealing key (edge/enrolment_proof.py): with it, a control plane that lost its store
re-admits the node in bulk. A node enrolled before certificates existed has none and is
enrolled again by the same command (its work keeps running).
"""

from __future__ import annotations

import os
import re
import ssl
import sys
import tomllib
from collections.abc import Mapping
from datetime import date, datetime, time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

import msgspec

from cloud.fleet.enrolment_views import Enrolment, EnrolmentAuthority, sealing_key_fingerprint
from edge.enrolment_proof import FILE_NAME as CERTIFICATE_FILE
from edge.enrolment_proof import certificate_path, save_certificate
from edge.sealing_key import load_or_create_sealing_key, sealing_key_path
from greenfed.api_client import ApiClient, CliError, Target
from greenfed.arguments import EXIT_AUTH, EXIT_OK, EXIT_USAGE
from shared.enrolment_certificate import enrolment_proof
from shared.enrolment_marker import EnrolmentMarker, read_marker
from shared.errors import MSGSPEC_DECODE_ERRORS
from shared.sealing import SealingKeyError, load_public_key, public_key_text
from shared.settings import ConfigError, load_settings
from shared.token_files import write_secret

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

_BARE_KEY: Final = re.compile(r"^[A-Za-z0-9_-]+$")


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "greenfed" / "agent.toml"


# -- a small TOML writer for settings documents (tables of scalars, lists, tables) ----


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else _string(name)


def _string(text: str) -> str:
    escaped: list[str] = []
    for char in text:
        if char in ('"', "\\"):
            escaped.append("\\" + char)
        elif char < " " or char == "\x7f":
            escaped.append(f"\\u{ord(char):04x}")
        else:
            escaped.append(char)
    return '"' + "".join(escaped) + '"'


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _table(lines: list[str], path: tuple[str, ...], table: Mapping[str, Any]) -> None:
    nested = {k: v for k, v in table.items() if isinstance(v, dict) or _is_table_array(v)}
    for key, value in table.items():
        if key not in nested:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in nested.items():
        inner = (*path, _key(key))
        if isinstance(value, dict):
            lines.extend(["", f"[{'.'.join(inner)}]"])
            _table(lines, inner, value)
        else:
            for item in value:
                lines.extend(["", f"[[{'.'.join(inner)}]]"])
                _table(lines, inner, item)


def toml_document(document: Mapping[str, Any]) -> str:
    lines: list[str] = []
    _table(lines, (), document)
    return "\n".join(line for index, line in enumerate(lines) if index or line)


# -- enrolment ------------------------------------------------------------------------


def merged_settings(
    existing: Mapping[str, Any], enrolment: Enrolment, ca: Path | None = None
) -> dict[str, Any]:
    """The settings document with what enrolment decides written over what was there.
    An mqtts broker is verified against `ca` too unless the file names its own CA."""
    document = {section: dict(values) for section, values in existing.items()}
    mqtt = document.setdefault("mqtt", {})
    mqtt.update(
        url=enrolment.mqtt.url,
        username=enrolment.mqtt.username,
        topic_root=enrolment.mqtt.topic_root,
    )
    if enrolment.mqtt.password is not None:
        mqtt["password"] = enrolment.mqtt.password
    if ca is not None and enrolment.mqtt.url.startswith("mqtts://"):
        mqtt.setdefault("tls_ca_file", str(ca.resolve()))
    agent = document.setdefault("agent", {})
    agent.update(
        node_id=enrolment.node_id,
        site=enrolment.site,
        zone=enrolment.zone,
        region=enrolment.region,
        labels=dict(enrolment.labels),
        control_plane_public_key=enrolment.control_plane_public_key,
    )
    return document


def own_placement(existing: Mapping[str, Any]) -> dict[str, Any]:
    """The site, zone, region and labels the agent's settings file already gives it,
    sent with the enrolment: the control plane keeps them unless the token sets them."""
    agent = existing.get("agent", {})
    if not isinstance(agent, Mapping):
        return {}
    placement: dict[str, Any] = {
        key: agent[key] for key in ("site", "zone", "region") if isinstance(agent.get(key), str)
    }
    labels = agent.get("labels")
    if isinstance(labels, Mapping) and all(isinstance(v, str) for v in labels.values()):
        placement["labels"] = dict(labels)
    return placement


def _read_existing(config: Path) -> tuple[str, dict[str, Any]]:
    try:
        text = config.read_text(encoding="utf-8")
    except FileNotFoundError:
        return "", {}
    except OSError as error:
        raise CliError(f"cannot read {config}: {error.strerror}") from None
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise CliError(
            f"{config} is not valid TOML ({error}); fix or remove it", EXIT_USAGE
        ) from None


def _sealing_key(config: Path, existing: Mapping[str, Any]) -> tuple[X25519PrivateKey, Path]:
    """(the node's sealing key, its key file), where the agent will look for it: the
    data directory of the settings it will run with (this file, if there is one, and the
    environment), made there now if there is none."""
    try:
        settings = load_settings(config if existing else None)
        path = sealing_key_path(settings.agent)
        return load_or_create_sealing_key(path), path
    except ConfigError as error:
        raise CliError(f"the node's sealing key: {error}") from None


async def _identity_proof(
    client: ApiClient, sealing_key: X25519PrivateKey, node_id: str, token: str
) -> str | None:
    """Proof that this node holds its sealing key, against the control plane's exchange
    key: what enrolling an enrolled id again takes. None where the control plane gives
    no key (a release before it): a first enrolment needs none."""
    try:
        _, payload = await client.call("GET", "/v1/nodes/enrol")
        authority = msgspec.json.decode(payload, type=EnrolmentAuthority)
        exchange_key = load_public_key(authority.exchange_key)
    except (CliError, *MSGSPEC_DECODE_ERRORS, SealingKeyError):
        return None
    return enrolment_proof(sealing_key, exchange_key, node_id=node_id, join_token=token)


def _holds_certificate(config: Path, existing: Mapping[str, Any]) -> bool:
    """Whether the node keeps an enrolment certificate (an enrolment older than them
    does not: enrolling again gets one, and keeps the node's work running)."""
    try:
        settings = load_settings(config if existing else None)
    except ConfigError:
        return False
    return certificate_path(settings.agent).exists()


def _tls_context(ca: Path | None) -> ssl.SSLContext | None:
    if ca is None:
        return None
    try:
        return ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as error:
        raise CliError(
            f"--ca {ca}: not a readable PEM CA certificate ({error})", EXIT_USAGE
        ) from None


async def enrol(
    *,
    api: str,
    token: str,
    config: Path,
    node_id: str | None,
    ca: Path | None,
    out: TextIO | None = None,
) -> int:
    out = out or sys.stdout
    api = api.rstrip("/")
    text, existing = _read_existing(config)
    wanted_node = node_id or existing.get("agent", {}).get("node_id") or None
    marker = read_marker(text)
    if (
        marker is not None
        and marker.api == api
        and wanted_node in (None, marker.node_id)
        and _holds_certificate(config, existing)
    ):
        out.write(
            f"{config} already holds the enrolment of node {marker.node_id} with {api} "
            f"(cluster {marker.cluster_id}); nothing changed\n"
        )
        return EXIT_OK
    if wanted_node is None:
        # The agent's own default: the host name, as its settings resolve it.
        wanted_node = load_settings(None, environ={}).agent.resolved_node_id()
    sealing_key, key_file = _sealing_key(config, existing)
    public_key = public_key_text(sealing_key)
    target = Target(api, None, "", "--api")
    async with ApiClient(target, ssl_context=_tls_context(ca)) as client:
        proof = await _identity_proof(client, sealing_key, wanted_node, token)
        body = msgspec.json.encode(
            {
                "token": token,
                "node_id": wanted_node,
                "sealing_public_key": public_key,
                **({} if proof is None else {"identity_proof": proof}),
                **own_placement(existing),
            }
        )
        try:
            _, payload = await client.call("POST", "/v1/nodes/enrol", body=body)
        except CliError as error:
            if error.status != 401:
                raise
            # The client has no bearer token to blame: the credential here is the join
            # token in the body, and a 401 is the API refusing it (which is all it says,
            # cloud/api/enrolment.py: an anonymous caller learns nothing more).
            raise CliError(
                "the join token was refused: it is unknown, expired, used up or revoked; "
                "ask an admin for a new one (greenfed nodes join-token create)",
                EXIT_AUTH,
                status=401,
            ) from None
    try:
        enrolment = msgspec.json.decode(payload, type=Enrolment)
    except MSGSPEC_DECODE_ERRORS as error:  # ValidationError and nested too deeply included
        raise CliError(f"{api} answered the enrolment with something else: {error}") from None
    document = merged_settings(existing, enrolment, ca)
    marker = EnrolmentMarker(api, enrolment.cluster_id, enrolment.node_id)
    new_text = marker.line() + "\n" + toml_document(document)
    # The agent must accept what we write: check it before it replaces anything.
    check = config.with_name(f".{config.name}.check")
    try:
        write_secret(check, new_text)
        load_settings(check, environ={})
    except ConfigError as error:
        raise CliError(f"the enrolled settings would not load: {error}") from None
    except OSError as error:
        raise CliError(f"cannot write next to {config}: {error.strerror}") from None
    finally:
        check.unlink(missing_ok=True)
    try:
        write_secret(config, new_text)  # created 0600, replaced atomically
        if enrolment.enrolment_certificate is not None:
            # Beside the sealing key it names: what re-admits the node after a store loss.
            save_certificate(key_file.with_name(CERTIFICATE_FILE), enrolment.enrolment_certificate)
    except OSError as error:
        raise CliError(f"cannot write {config}: {error.strerror}") from None
    password = "a password of its own" if enrolment.mqtt.password else "no password (manual)"
    out.write(
        f"enrolled node {enrolment.node_id} with {api} (cluster {enrolment.cluster_id}); "
        f"MQTT user {enrolment.mqtt.username}, {password}; settings in {config} (mode 0600)\n"
        f"sealing key {sealing_key_fingerprint(public_key)} in {key_file} (mode 0600)\n"
        f"run the agent: greenfed edge run --config {config}\n"
    )
    return EXIT_OK
