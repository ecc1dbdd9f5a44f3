"""Settings: TOML file, `GREENFED_<SECTION>__<KEY>` overrides, and errors that name the key."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from shared.errors import FieldError
from shared.settings import (
    ConfigError,
    MqttEndpoint,
    MqttSettings,
    Settings,
    load_settings,
    parse_mqtt_url,
)
from shared.topics import is_valid_node_id

NO_ENV: dict[str, str] = {}


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "greenfed.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_without_a_file_or_environment_the_defaults_apply() -> None:
    settings = load_settings(None, NO_ENV)

    assert settings == Settings()
    assert parse_mqtt_url(settings.mqtt.url) == MqttEndpoint(host="127.0.0.1", port=1883, tls=False)
    assert settings.mqtt.topic_root == "greenfed"
    assert settings.agent.site == "edge"


def test_without_an_explicit_mapping_the_process_environment_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GREENFED_AGENT__ZONE", "ZA")
    assert load_settings().agent.zone == "ZA"


def test_a_toml_file_is_read_into_every_section(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        """
        [mqtt]
        url = "mqtts://broker.example.com"
        topic_root = "plant-7"
        keepalive_s = 60

        [agent]
        node_id = "gateway-1"
        site = "cloud"
        zone = "DE"
        labels = { city = "frankfurt", rack = "b2" }
        probes = ["cpu"]

        [cloud]
        api_port = 9000
        staleness_intervals = 2.5

        [log]
        level = "debug"
        format = "json"
        """,
    )

    settings = load_settings(path, NO_ENV)

    assert settings.mqtt.url == "mqtts://broker.example.com"
    assert settings.mqtt.topic_root == "plant-7"
    assert settings.mqtt.keepalive_s == 60
    assert settings.agent.node_id == "gateway-1"
    assert settings.agent.site == "cloud"
    assert settings.agent.labels == {"city": "frankfurt", "rack": "b2"}
    assert settings.agent.probes == ("cpu",)
    assert settings.cloud.api_port == 9000
    assert settings.cloud.staleness_intervals == 2.5
    assert (settings.log.level, settings.log.format) == ("debug", "json")
    # Keys the file leaves out keep their defaults.
    assert settings.mqtt.reconnect_max_s == Settings().mqtt.reconnect_max_s


def test_environment_overrides_win_over_the_file_and_keep_its_other_keys(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        '[mqtt]\nurl = "mqtt://file-broker"\nkeepalive_s = 60\n[agent]\nzone = "DE"\n',
    )

    settings = load_settings(
        path, {"GREENFED_MQTT__URL": "mqtt://env-broker:1884", "GREENFED_AGENT__REGION": "r1"}
    )

    assert settings.mqtt.url == "mqtt://env-broker:1884"
    assert settings.mqtt.keepalive_s == 60
    assert settings.agent.zone == "DE"
    assert settings.agent.region == "r1"


@pytest.mark.parametrize(
    ("variable", "raw", "read", "expected"),
    [
        ("GREENFED_CLOUD__STALENESS_INTERVALS", "4.5", lambda s: s.cloud.staleness_intervals, 4.5),
        ("GREENFED_MQTT__RECONNECT_MAX_S", "60", lambda s: s.mqtt.reconnect_max_s, 60.0),
        ("GREENFED_CLOUD__API_PORT", "8800", lambda s: s.cloud.api_port, 8800),
        ("GREENFED_MQTT__TLS_INSECURE", "true", lambda s: s.mqtt.tls_insecure, True),
        ("GREENFED_MQTT__TLS_INSECURE", "false", lambda s: s.mqtt.tls_insecure, False),
        ("GREENFED_LOG__LEVEL", "warning", lambda s: s.log.level, "warning"),
        ("GREENFED_AGENT__NODE_ID", "1234", lambda s: s.agent.node_id, "1234"),
        ("GREENFED_AGENT__ZONE", "1e3", lambda s: s.agent.zone, "1e3"),
        ("GREENFED_MQTT__PASSWORD", "true", lambda s: s.mqtt.password, "true"),
        (
            "GREENFED_AGENT__LABELS",
            '{ city = "toronto", camera = "yes" }',
            lambda s: s.agent.labels,
            {"city": "toronto", "camera": "yes"},
        ),
        ("GREENFED_AGENT__PROBES", '["cpu", "npu"]', lambda s: s.agent.probes, ("cpu", "npu")),
    ],
)
def test_environment_values_are_converted_to_the_type_of_their_key(
    variable: str, raw: str, read: Callable[[Settings], object], expected: object
) -> None:
    value = read(load_settings(None, {variable: raw}))
    assert value == expected
    assert type(value) is type(expected)


def test_an_unrelated_greenfed_variable_with_single_underscores_is_ignored() -> None:
    settings = load_settings(None, {"GREENFED_JOB_ID": "job-17", "GREENFED_TEST_FLAG": "1"})
    assert settings == Settings()


def test_an_unknown_key_in_the_file_is_an_error_naming_the_key_and_the_file(
    tmp_path: Path,
) -> None:
    path = write_config(tmp_path, '[mqtt]\nurll = "mqtt://broker"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path, NO_ENV)
    assert "mqtt.urll" in str(caught.value)
    assert str(path) in str(caught.value)


def test_an_unknown_section_in_the_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = write_config(tmp_path, "[mqttt]\nurl = 'mqtt://broker'\n")
    with pytest.raises(ConfigError, match="mqttt"):
        load_settings(path, NO_ENV)


def test_an_unknown_key_in_the_environment_is_an_error_naming_the_key_and_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {"GREENFED_MQTT__URLL": "mqtt://broker"})
    assert "mqtt.urll" in str(caught.value)
    assert "GREENFED_MQTT__URLL" in str(caught.value)


def test_an_unknown_section_in_the_environment_is_an_error_naming_the_variable() -> None:
    with pytest.raises(ConfigError, match="GREENFED_MQQT__URL"):
        load_settings(None, {"GREENFED_MQQT__URL": "mqtt://broker"})


def test_a_wrong_type_in_the_file_names_the_key(tmp_path: Path) -> None:
    path = write_config(tmp_path, '[mqtt]\nkeepalive_s = "thirty"\n')
    with pytest.raises(ConfigError, match=re.escape("mqtt.keepalive_s")):
        load_settings(path, NO_ENV)


def test_a_wrong_type_in_the_environment_names_the_key_and_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {"GREENFED_CLOUD__API_PORT": "http"})
    assert "cloud.api_port" in str(caught.value)
    assert "GREENFED_CLOUD__API_PORT" in str(caught.value)


def test_an_out_of_range_value_from_the_environment_names_the_variable_not_the_file(
    tmp_path: Path,
) -> None:
    path = write_config(tmp_path, "[mqtt]\nkeepalive_s = 60\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, {"GREENFED_MQTT__KEEPALIVE_S": "2"})
    message = str(caught.value)
    assert "mqtt.keepalive_s" in message
    assert "GREENFED_MQTT__KEEPALIVE_S" in message
    assert str(path) not in message


def test_an_invalid_file_value_is_blamed_on_the_file_even_when_other_keys_come_from_env(
    tmp_path: Path,
) -> None:
    path = write_config(tmp_path, "[mqtt]\nkeepalive_s = 2\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, {"GREENFED_MQTT__URL": "mqtt://broker"})
    assert str(caught.value).startswith(f"{path}: mqtt.keepalive_s")


@pytest.mark.parametrize(
    "url",
    [
        "http://broker:1883",
        "tcp://broker",
        "broker:1883",
        "mqtt://",
        "mqtt://:1883",
        "mqtt://broker/greenfed",
        "mqtt://broker?tls=1",
        "mqtt://broker:http",
        "mqtt://broker:70000",
    ],
)
def test_a_bad_mqtt_url_is_rejected_naming_the_key(tmp_path: Path, url: str) -> None:
    path = write_config(tmp_path, f'[mqtt]\nurl = "{url}"\n')
    with pytest.raises(ConfigError, match=re.escape("mqtt.url")):
        load_settings(path, NO_ENV)
    with pytest.raises(ConfigError, match="GREENFED_MQTT__URL"):
        load_settings(None, {"GREENFED_MQTT__URL": url})


@pytest.mark.parametrize(
    "url",
    [
        "mqtt://greenfed-cloud:plainSecretPw@broker.example:99999",  # a bad port
        "mqtt://greenfed-cloud:plainSecretPw@broker.example:1883/x",  # a path
        "http://greenfed-cloud:plainSecretPw@broker.example:1883",  # a scheme
        "mqtt://greenfed-cloud:Zm9v/plainSecretPw@broker.example:1883",  # '/' unencoded
    ],
)
def test_a_bad_mqtt_urls_password_is_never_shown(tmp_path: Path, url: str) -> None:
    path = write_config(tmp_path, f'[mqtt]\nurl = "{url}"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path, NO_ENV)
    assert "mqtt.url" in str(caught.value)
    assert "plainSecretPw" not in str(caught.value)
    assert "greenfed-cloud:***@" in str(caught.value)


def test_a_password_with_an_unencoded_slash_is_named_as_the_cause() -> None:
    with pytest.raises(ValueError, match="must be percent-encoded"):
        parse_mqtt_url("mqtt://u:Zm9v/YmFy@broker:1883")


@pytest.mark.parametrize("root", ["../../tmp/cgroups", "greenfed/../x", "./greenfed"])
def test_a_cgroup_root_outside_the_hierarchies_is_refused_naming_the_key(root: str) -> None:
    with pytest.raises(ConfigError, match=re.escape("agent.cgroup_root")):
        load_settings(None, {"GREENFED_AGENT__CGROUP_ROOT": root})


def test_an_invalid_topic_root_is_rejected_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=re.escape("mqtt.topic_root")):
        load_settings(None, {"GREENFED_MQTT__TOPIC_ROOT": "a/b"})


def test_a_reconnect_cap_below_the_initial_delay_is_rejected_naming_the_key(
    tmp_path: Path,
) -> None:
    path = write_config(tmp_path, "[mqtt]\nreconnect_initial_s = 5.0\nreconnect_max_s = 1.0\n")
    with pytest.raises(ConfigError, match=re.escape("mqtt.reconnect_max_s")):
        load_settings(path, NO_ENV)


@pytest.mark.parametrize("node_id", ["edge/1", "edge+1", "#", "-edge"])
def test_a_node_id_that_cannot_be_a_topic_level_is_rejected_naming_the_key(node_id: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {"GREENFED_AGENT__NODE_ID": node_id})
    assert "agent.node_id" in str(caught.value)
    assert "GREENFED_AGENT__NODE_ID" in str(caught.value)


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        ('[mqtt]\nurll = "x"\n', "mqtt.urll", "mqtt.urll: unknown key"),
        ('[mqtt]\nurl = "http://x"\n', "mqtt.url", "mqtt.url: MQTT url 'http://x' must start"),
        ('[agent]\nprobes = ["cpu", "tpu"]\n', "agent.probes[1]", "Invalid enum value 'tpu'"),
        (
            "[signals.static_table.X]\ncarbon_g_per_kwh = -1\n",
            "signals.static_table.X.carbon_g_per_kwh",
            "Expected `float` >= 0.0",
        ),
        (
            '[signals]\nproviders = ["trace", "trace"]\n',
            "signals.providers",
            "names a provider twice",
        ),
    ],
)
def test_a_config_error_carries_the_key_at_fault(
    tmp_path: Path, text: str, key: str, message: str
) -> None:
    path = write_config(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, NO_ENV)
    assert caught.value.key == key
    assert str(caught.value).startswith(f"{path}: {key}: ")
    assert message in str(caught.value)


def test_a_settings_check_raises_a_typed_field_error() -> None:
    with pytest.raises(FieldError) as refused:
        MqttSettings(reconnect_initial_s=5.0, reconnect_max_s=1.0)
    assert (refused.value.path, refused.value.reason) == (
        ("reconnect_max_s",),
        "must be >= reconnect_initial_s",
    )


def test_a_label_value_of_the_wrong_type_names_the_labels_key() -> None:
    with pytest.raises(ConfigError, match=re.escape("agent.labels")):
        load_settings(None, {"GREENFED_AGENT__LABELS": "{ rack = 7 }"})


def test_a_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=f"{re.escape(str(missing))} does not exist"):
        load_settings(missing, NO_ENV)


def test_a_file_that_is_not_toml_is_a_clear_error(tmp_path: Path) -> None:
    path = write_config(tmp_path, "[mqtt\nurl = \n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, NO_ENV)
    assert str(path) in str(caught.value)
    assert "not valid TOML" in str(caught.value)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("mqtt://broker", MqttEndpoint(host="broker", port=1883, tls=False)),
        ("mqtts://broker", MqttEndpoint(host="broker", port=8883, tls=True)),
        ("mqtt://broker/", MqttEndpoint(host="broker", port=1883, tls=False)),
        ("mqtt://10.0.0.5:11883", MqttEndpoint(host="10.0.0.5", port=11883, tls=False)),
        ("mqtts://broker:443", MqttEndpoint(host="broker", port=443, tls=True)),
        ("mqtt://[::1]:1884", MqttEndpoint(host="::1", port=1884, tls=False)),
        (
            "mqtt://agent:s3cret@broker",
            MqttEndpoint(host="broker", port=1883, tls=False, username="agent", password="s3cret"),
        ),
        (
            "mqtts://edge%40site:p%40ss%3Aw%2Frd@broker:8884",
            MqttEndpoint(
                host="broker", port=8884, tls=True, username="edge@site", password="p@ss:w/rd"
            ),
        ),
        (
            "mqtt://agent@broker",
            MqttEndpoint(host="broker", port=1883, tls=False, username="agent"),
        ),
    ],
)
def test_parse_mqtt_url_reads_scheme_host_port_and_credentials(
    url: str, expected: MqttEndpoint
) -> None:
    assert parse_mqtt_url(url) == expected


def test_a_configured_node_id_is_used_as_is() -> None:
    settings = load_settings(None, {"GREENFED_AGENT__NODE_ID": "gateway-7"})
    assert settings.agent.resolved_node_id() == "gateway-7"


@pytest.mark.parametrize(
    ("hostname", "expected"),
    [
        ("edge-box.local", "edge-box.local"),
        ("my box (2)", "my-box--2-"),
        ("_hidden", "hidden"),
        ("___", "node"),
    ],
)
def test_without_a_node_id_the_host_name_is_made_into_a_valid_one(
    monkeypatch: pytest.MonkeyPatch, hostname: str, expected: str
) -> None:
    # The host name is the operating system's answer: the one seam faked here.
    monkeypatch.setattr(socket, "gethostname", lambda: hostname)
    resolved = load_settings(None, NO_ENV).agent.resolved_node_id()
    assert resolved == expected
    assert is_valid_node_id(resolved)


def _float_keys() -> list[str]:
    """Every `section.key` whose value is a number with a fraction (float, or float or
    None), from the settings' own types: a key added later is covered by itself."""
    keys = []
    settings = msgspec.inspect.type_info(Settings)
    assert isinstance(settings, msgspec.inspect.StructType)
    for section in settings.fields:
        assert isinstance(section.type, msgspec.inspect.StructType)
        for field in section.type.fields:
            kinds = (
                field.type.types
                if isinstance(field.type, msgspec.inspect.UnionType)
                else [field.type]
            )
            if any(isinstance(kind, msgspec.inspect.FloatType) for kind in kinds):
                keys.append(f"{section.name}.{field.name}")
    return keys


FLOAT_KEYS = _float_keys()


def test_the_float_keys_are_found() -> None:
    assert {"store.busy_timeout_s", "agent.telemetry_interval_s", "mqtt.digest_interval_s"} <= set(
        FLOAT_KEYS
    )


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_a_float_key_refuses_a_value_that_is_not_a_finite_number(
    tmp_path: Path, key: str, value: str
) -> None:
    # `busy_timeout_s = inf` once crashed `greenfed cloud` with a traceback, and
    # `telemetry_interval_s = inf` made births no control plane accepts.
    section, _, name = key.partition(".")
    path = write_config(tmp_path, f"[{section}]\n{name} = {value}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, NO_ENV)
    assert caught.value.key == key
    assert str(caught.value).startswith(f"{path}: {key}: ")


@pytest.mark.parametrize("key", ["carbon_g_per_kwh", "price_per_mwh"])
@pytest.mark.parametrize("value", ["inf", "nan"])
def test_a_static_table_row_refuses_a_value_that_is_not_a_finite_number(
    tmp_path: Path, key: str, value: str
) -> None:
    row = {"carbon_g_per_kwh": "120", "price_per_mwh": "45", key: value}
    cells = ", ".join(f"{name} = {cell}" for name, cell in row.items())
    path = write_config(tmp_path, f"[signals.static_table]\nDE = {{ {cells} }}\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, NO_ENV)
    assert caught.value.key == f"signals.static_table.DE.{key}"


def test_an_infinite_value_from_the_environment_names_the_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(None, {"GREENFED_STORE__BUSY_TIMEOUT_S": "inf"})
    message = str(caught.value)
    assert "store.busy_timeout_s: must be a finite number" in message
    assert "GREENFED_STORE__BUSY_TIMEOUT_S" in message
