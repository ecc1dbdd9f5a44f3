"""One MQTT session with a reconnect loop, shared by the agent and the cloud.

`MqttSession.run(body)` connects, runs `body(client)` for as long as the connection
lives, and reconnects with capped, jittered exponential backoff when it drops. The
body subscribes again on every connect, so subscriptions are replayed. A refused
login stops the loop with `MqttAuthError`: retrying a wrong password for ever only
hides the problem.

A fresh `aiomqtt.Client` is built for each connection attempt. aiomqtt 2.x
documents reusing one client, but after an *unexpected* disconnect its reused
client can report "connected" before the new CONNACK arrives (aiomqtt issues
#288, #369), which would also hide a refused login; a new client per attempt
costs microseconds and has none of that.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiomqtt
import paho.mqtt.client as mqtt
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.enums import MQTTErrorCode

from shared.backoff import Backoff
from shared.errors import MqttAuthError
from shared.lean_logs import EventLogger, get_logger
from shared.settings import ConfigError, MqttSettings, parse_mqtt_url

# CONNACK codes that mean "your credentials are wrong", in MQTT 3.1.1 (4, 5) and
# as paho 2.x reports them through MQTT 5 reason codes (134, 135).
_AUTH_FAILURE_CODES = frozenset({4, 5, 134, 135})

__all__ = [
    "MqttAuthError",
    "MqttSession",
    "build_tls_context",
    "check_tls_files",
    "is_auth_failure",
]

SessionBody = Callable[[aiomqtt.Client], Awaitable[None]]
# (topic, payload) of one received message.
MessageSink = Callable[[str, bytes | bytearray], None]


def _deliver_to(client: aiomqtt.Client, sink: MessageSink) -> None:
    """Hand every message `client` receives to `sink` at once, from the socket's read.

    aiomqtt's `async for message in client.messages` costs a task and an
    `asyncio.wait` per message, and its `Message` (a validated `Topic` each) a few
    microseconds more: together they halve the rate one process can ingest. paho's
    `on_message` (which aiomqtt sets to fill its queue) is replaced here, and the
    socket is read by `_PacketReads`, which hands QoS 0 messages to `sink` itself; `sink`
    must be fast and must not raise. aiomqtt's queue stays empty: iterating
    `client.messages` still waits, and still raises when the connection drops.
    """

    def on_message(paho: object, userdata: object, message: mqtt.MQTTMessage) -> None:
        sink(message.topic, message.payload)

    # aiomqtt keeps its paho client as `_client` (aiomqtt 2.x); paho's callback setter
    # is its public API.
    client._client.on_message = on_message
    _PacketReads.install(client._client, sink)


def _guard_disconnect_after_cancelled_connect(client: aiomqtt.Client) -> None:
    """Drop paho's disconnect callback once the connect it answers was cancelled.

    aiomqtt 2.x's `_on_disconnect` reads `self._connected.exception()` without asking
    whether that future was cancelled first; a session stopped while connecting (a
    refused login ends every session at once) cancels it, and the socket's last read
    then raises `CancelledError` inside an event-loop callback, which asyncio logs as a
    traceback after the command's one line. Nothing waits on that disconnect then.
    """
    paho = client._client
    on_disconnect = paho.on_disconnect
    if on_disconnect is None or not isinstance(getattr(client, "_connected", None), asyncio.Future):
        return  # another aiomqtt: its own callback, as it is

    def guarded(*args: Any, **kwargs: Any) -> None:
        connected = getattr(client, "_connected", None)  # aiomqtt makes a new one per try
        if isinstance(connected, asyncio.Future) and connected.cancelled():
            return
        on_disconnect(*args, **kwargs)

    paho.on_disconnect = guarded


# MQTT 3.1.1 PUBLISH with QoS 0, whatever its DUP and RETAIN flags: `command & mask`.
_PUBLISH_QOS0_MASK = 0xF6
_PUBLISH_QOS0 = 0x30


class _PacketReads:
    """Reads the socket in chunks and splits them into MQTT packets itself; a QoS 0
    PUBLISH (telemetry: nearly all the traffic) goes from the chunk to the sink, and
    every other packet through paho's own handling, read from memory.

    paho reads each packet with three or four `recv` calls (its type, its length a byte
    at a time, its body) and then, per message, builds an `MQTTMessage`, logs it, and
    takes two locks and a topic match to find the callback; aiomqtt reads one packet per
    wake-up of the event loop. Here one `recv` serves many packets, each wake-up reads
    until the socket has no more (at most `MAX_CHUNKS` chunks: then the event loop runs
    others, and wakes this again, the rest still in the socket), and a QoS 0 message
    costs two slices. QoS 1 and 2 messages (acknowledged by paho), MQTT 5 (properties)
    and every control packet go to paho's `_packet_read`, whose reads this serves from
    the packet's bytes: paho's checks and answers are the same as on its own reads.

    It replaces two private methods of paho 2.x's client on the instance
    (`_sock_recv`, `loop_read`); `install` leaves a client without them as it is.
    """

    CHUNK_BYTES = 64 * 1024
    MAX_CHUNKS = 4

    def __init__(self, paho: mqtt.Client, sink: MessageSink) -> None:
        self._paho = paho
        self._sink = sink
        self._recv = paho._sock_recv  # paho's own: TLS and closed-socket handling
        self._socket: object = None  # the socket `_partial` came from
        # The start of a packet whose end is still in the socket, in the pieces read,
        # joined once `_partial_needs` bytes are there (0: its length is not read yet):
        # a packet of many chunks is copied once, not once per chunk.
        self._partial: list[bytes] = []
        self._partial_bytes = 0
        self._partial_needs = 0
        self._short_read_drains = True
        self._packet = b""  # a whole packet paho's `_packet_read` is reading
        self._packet_offset = 0

    @classmethod
    def install(cls, paho: mqtt.Client, sink: MessageSink) -> None:
        names = ("_sock_recv", "_packet_read", "_sock", "_protocol", "_msgtime_mutex")
        if not all(hasattr(paho, name) for name in names):
            return  # another paho: its own reads, slower but right
        reads = cls(paho, sink)
        paho._sock_recv = reads.recv  # type: ignore[method-assign]
        paho.loop_read = reads.loop_read  # type: ignore[method-assign]

    def recv(self, bufsize: int) -> bytes:
        """paho's reads of the packet handed to it (never the socket's)."""
        start = self._packet_offset
        if start >= len(self._packet):
            raise BlockingIOError  # never: paho gets whole packets only
        self._packet_offset = min(start + bufsize, len(self._packet))
        return self._packet[start : self._packet_offset]

    def loop_read(self, max_packets: int = 1) -> MQTTErrorCode:
        """Read and handle packets until the socket has no more for now (paho's reads
        one)."""
        paho = self._paho
        if self._socket is not paho._sock:  # a new connection: nothing of the old
            self._socket = paho._sock
            self._partial, self._partial_bytes, self._partial_needs = [], 0, 0
            # A TLS read returns one record (16 kB) at most, whatever is waiting.
            self._short_read_drains = not isinstance(paho._sock, ssl.SSLSocket)
        for _ in range(self.MAX_CHUNKS):
            if paho._sock is None:
                return MQTTErrorCode.MQTT_ERR_NO_CONN
            try:
                chunk = self._recv(self.CHUNK_BYTES)
            except BlockingIOError:
                return MQTTErrorCode.MQTT_ERR_SUCCESS
            except OSError as error:  # ConnectionError when paho's socket is gone
                paho._easy_log(mqtt.MQTT_LOG_ERR, "failed to receive on socket: %s", error)
                return paho._loop_rc_handle(MQTTErrorCode.MQTT_ERR_CONN_LOST)
            if not chunk:
                return paho._loop_rc_handle(MQTTErrorCode.MQTT_ERR_CONN_LOST)
            with paho._msgtime_mutex:  # keepalive: the broker is there
                paho._last_bytes_received = time.monotonic()
            rc = self._take(chunk)
            if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                return paho._loop_rc_handle(rc)
            if len(chunk) < self.CHUNK_BYTES and self._short_read_drains:
                # Most likely all there was: save the `recv` that would say so. If more
                # came meanwhile, the event loop wakes this again at once.
                return MQTTErrorCode.MQTT_ERR_SUCCESS
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _take(self, chunk: bytes) -> MQTTErrorCode:
        """Handle the whole packets `chunk` completes or holds; keep the rest."""
        data = chunk
        if self._partial:
            self._partial.append(chunk)
            self._partial_bytes += len(chunk)
            if self._partial_bytes < self._partial_needs:
                return MQTTErrorCode.MQTT_ERR_SUCCESS
            data = b"".join(self._partial)
        rc, used, needs = self._handle_packets(data)
        if used < len(data):
            rest = data[used:]
            self._partial, self._partial_bytes, self._partial_needs = [rest], len(rest), needs
        else:
            self._partial, self._partial_bytes, self._partial_needs = [], 0, 0
        return rc

    def _handle_packets(self, data: bytes) -> tuple[MQTTErrorCode, int, int]:
        """Handle every whole packet in `data`: (paho's error code, the bytes used, the
        size of the packet that starts after them if its length is read, else 0)."""
        sink = self._sink
        fast = self._paho._protocol != mqtt.MQTTv5  # MQTT 5: properties, paho's to parse
        end = len(data)
        position = 0
        while end - position >= 2:
            # The remaining length: 1-4 bytes, 7 bits each, least significant first.
            length, shift, index = 0, 0, position + 1
            while True:
                if index >= end:
                    return MQTTErrorCode.MQTT_ERR_SUCCESS, position, 0  # the rest is to come
                byte = data[index]
                index += 1
                length |= (byte & 0x7F) << shift
                if byte < 0x80:
                    break
                shift += 7
                if shift > 21:
                    return MQTTErrorCode.MQTT_ERR_PROTOCOL, position, 0
            packet_end = index + length
            if packet_end > end:  # the rest is to come
                return MQTTErrorCode.MQTT_ERR_SUCCESS, position, packet_end - position
            if fast and data[position] & _PUBLISH_QOS0_MASK == _PUBLISH_QOS0 and length >= 2:
                topic_end = index + 2 + (data[index] << 8 | data[index + 1])
                if topic_end <= packet_end:
                    # A topic that is not UTF-8 (a broker refuses it) fails the topic's
                    # parse downstream, counted there.
                    topic = data[index + 2 : topic_end].decode("utf-8", "replace")
                    sink(topic, data[topic_end:packet_end])
                    position = packet_end
                    continue
            rc = self._paho_handles(data[position:packet_end])
            position = packet_end
            if rc != MQTTErrorCode.MQTT_ERR_SUCCESS or self._paho._sock is None:
                return rc, position, 0
        return MQTTErrorCode.MQTT_ERR_SUCCESS, position, 0

    def _paho_handles(self, packet: bytes) -> MQTTErrorCode:
        """One whole packet read and handled by paho (a malformed one included: it says
        what is wrong, and the connection ends)."""
        self._packet, self._packet_offset = packet, 0
        try:
            rc = self._paho._packet_read()
        finally:
            self._packet = b""
        return MQTTErrorCode.MQTT_ERR_SUCCESS if rc == MQTTErrorCode.MQTT_ERR_AGAIN else rc


def uses_tls(settings: MqttSettings) -> bool:
    """Whether a client of `settings` connects with TLS (an mqtts:// url, or a CA file)."""
    return parse_mqtt_url(settings.url).tls or bool(settings.tls_ca_file)


def check_tls_files(settings: MqttSettings) -> None:
    """Build the TLS context once, as a command starts, so that a CA, certificate or key
    file that cannot be read or parsed stops it with a `ConfigError` naming the setting
    and the file, rather than failing every connection attempt later (a Compose bind
    mount of a missing file makes a directory; a Secret may lack the key)."""
    if uses_tls(settings):
        build_tls_context(settings)


def build_tls_context(settings: MqttSettings) -> ssl.SSLContext:
    """The client's TLS context; a file it names that cannot be used is a `ConfigError`.

    Built anew for every connection, so a renewed certificate is taken up on reconnect.
    """
    try:
        context = ssl.create_default_context(cafile=settings.tls_ca_file)
    except OSError as error:  # ssl.SSLError included: a file that holds no certificate
        raise _tls_file_error("mqtt.tls_ca_file", settings.tls_ca_file, error) from None
    if settings.tls_cert_file:
        # load_cert_chain's error does not say which of its two files failed: open
        # each first, so that a missing or unreadable one is named.
        _check_readable("mqtt.tls_cert_file", settings.tls_cert_file)
        if settings.tls_key_file:
            _check_readable("mqtt.tls_key_file", settings.tls_key_file)
        try:
            context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
        except OSError as error:
            files = settings.tls_cert_file
            if settings.tls_key_file:
                files = f"{files} with mqtt.tls_key_file {settings.tls_key_file}"
            raise ConfigError(
                f"mqtt.tls_cert_file: {files}: not a PEM certificate and its private key ({error})",
                key="mqtt.tls_cert_file",
            ) from None
    if settings.tls_insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _check_readable(setting: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except OSError as error:
        raise _tls_file_error(setting, path, error) from None


def _tls_file_error(setting: str, path: str | None, error: OSError) -> ConfigError:
    """`mqtt.tls_ca_file: /etc/greenfed/ca.crt: No such file or directory`."""
    if isinstance(error, ssl.SSLError):
        reason = f"not a PEM certificate ({error})"
    else:
        reason = error.strerror or str(error)
    return ConfigError(f"{setting}: {path}: {reason}", key=setting)


def is_auth_failure(error: aiomqtt.MqttError) -> bool:
    # Only a refused CONNACK says anything about credentials; other errors carry paho's
    # own return codes, whose numbers overlap (4 is also "not connected").
    if not isinstance(error, MqttConnectError):
        return False
    code = getattr(error.rc, "value", error.rc)
    return code in _AUTH_FAILURE_CODES


def instance_client_id(prefix: str) -> str:
    """A client id unique to this process and this use: a broker disconnects the older
    of two connections with one id, so two apps in one process must not share one."""
    return f"{prefix}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"[:128]


class MqttSession:
    """Owns connecting, reconnecting and credentials for one client identity."""

    def __init__(
        self,
        settings: MqttSettings,
        *,
        client_id: str,
        will: aiomqtt.Will | None = None,
        max_queued_incoming: int = 0,
        message_sink: MessageSink | None = None,
        logger: EventLogger | None = None,
    ) -> None:
        """`message_sink`, if given, receives every message's topic and payload
        synchronously on arrival instead of through `client.messages` (see
        `_deliver_to`)."""
        self._settings = settings
        self._endpoint = parse_mqtt_url(settings.url)
        check_tls_files(settings)  # a bad file stops the caller now, not each reconnect
        self._client_id = client_id
        self._will = will
        self._max_queued_incoming = max_queued_incoming
        self._message_sink = message_sink
        self._log: EventLogger = logger or get_logger("greenfed.mqtt")
        self._backoff = Backoff(settings.reconnect_initial_s, settings.reconnect_max_s)
        self.connected = asyncio.Event()
        self.connect_count = 0
        self.failed_attempts = 0
        self.refused_credentials = 0  # connections the broker refused for credentials
        # Called (with nothing) when an established connection is lost, before the
        # reconnect; e.g. to judge what arrived with the loss. Must be quick.
        self.link_lost_listeners: list[Callable[[], None]] = []
        # Reads the credentials again (the settings file), for a broker that refused
        # them: a node enrolled again has a new password in its file (`greenfed edge
        # enrol`), and its agent takes it up without a restart, its work going on.
        # Set: once connected, a refusal never ends the session (retried with backoff,
        # reading again each time). None: a refusal ends it (MqttAuthError).
        self.reload_settings: Callable[[], MqttSettings] | None = None

    @property
    def url(self) -> str:
        return f"{'mqtts' if self._endpoint.tls else 'mqtt'}://{self._endpoint.host}:{self._endpoint.port}"

    def new_client(self) -> aiomqtt.Client:
        """A client with this session's endpoint, credentials and TLS, not connected yet
        (`run` makes one per connection; `greenfed edge doctor` one to try)."""
        kwargs: dict[str, Any] = {}
        if uses_tls(self._settings):
            kwargs["tls_context"] = build_tls_context(self._settings)
            kwargs["tls_insecure"] = self._settings.tls_insecure
        client = aiomqtt.Client(
            self._endpoint.host,
            self._endpoint.port,
            identifier=self._client_id,
            username=self._settings.username or self._endpoint.username,
            password=self._settings.password or self._endpoint.password,
            will=self._will,
            clean_session=True,
            keepalive=self._settings.keepalive_s,
            timeout=self._settings.connect_timeout_s,
            max_queued_incoming_messages=self._max_queued_incoming,
            **kwargs,
        )
        if self._message_sink is not None:
            _deliver_to(client, self._message_sink)
        _guard_disconnect_after_cancelled_connect(client)
        return client

    def _took_new_credentials(self) -> bool:
        """Read the credentials again; whether they changed (and are taken from now on)."""
        if self.reload_settings is None:
            return False
        try:
            fresh = self.reload_settings()
        except Exception as error:  # a file half-written, a bad edit: keep the old ones
            self._log.warning("mqtt credentials not reloaded", error=str(error)[:300])
            return False
        if (fresh.username, fresh.password, fresh.url) == (
            self._settings.username,
            self._settings.password,
            self._settings.url,
        ):
            return False
        self._settings = fresh
        self._endpoint = parse_mqtt_url(fresh.url)
        self._log.info("mqtt credentials changed: reconnecting with the new ones", url=self.url)
        return True

    async def run(self, body: SessionBody) -> None:
        """Run `body` on every connection until it returns; reconnect when the link drops."""
        while True:
            client = self.new_client()
            try:
                async with client:
                    self._backoff.reset()
                    self.connect_count += 1
                    self.connected.set()
                    self._log.info("mqtt connected", url=self.url, connects=self.connect_count)
                    await body(client)
                    return
            except aiomqtt.MqttError as error:
                if is_auth_failure(error):
                    self.refused_credentials += 1
                    if self._took_new_credentials():
                        continue  # at once: the refusal was of the old ones
                    if self.reload_settings is None or self.connect_count == 0:
                        # Never connected: the settings are wrong, say so and stop.
                        raise MqttAuthError(
                            f"the MQTT broker at {self.url} refused the credentials of "
                            f"client {self._client_id!r}: {error}"
                        ) from error
                if self.connected.is_set():
                    for listener in self.link_lost_listeners:
                        listener()
                self.failed_attempts += 1
                delay_s = self._backoff.next_delay_s()
                self._log.warning(
                    "mqtt connection lost" if self.connected.is_set() else "mqtt connect failed",
                    url=self.url,
                    error=str(error),
                    retry_in_s=round(delay_s, 2),
                    attempt=self._backoff.attempt,
                )
            finally:
                self.connected.clear()
            await asyncio.sleep(delay_s)
