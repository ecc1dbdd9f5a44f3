"""Every patterned text value a user sends, in a body, a query or a wire message, is
refused in words that say what it must look like, never as the regex that refused it
(shared/errors.py `worded_pattern`): through the real REST API, for one bad value of
each such field; for the wire's own fields through their decoders; and a guard that
walks every type the API decodes so that a pattern added without words fails here."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import msgspec
import pytest

from cloud.api.routes import REGISTERED_ROUTES
from cloud.app import create_app
from shared import messages
from shared.errors import UNWORDED_PATTERN_REASON, FieldError
from shared.settings import Settings
from tests.api.support import Api, bearer, problem

pytestmark = pytest.mark.timeout(60)
# Refused before anything is stored: one database says it.
ONE_DATABASE = pytest.mark.parametrize("database", ["sqlite"], indirect=True)

# What a regex leaks into a message: msgspec's own words, escapes, groups, anchors.
_REGEX_TRACES = re.compile(r"regex|\\\\|\(\?|\[\^|\{0,|\$\(")


def _assert_plain(reason: str) -> None:
    assert _REGEX_TRACES.search(reason) is None, reason
    assert reason != UNWORDED_PATTERN_REASON, reason


def _cluster(**fields: Any) -> dict[str, Any]:
    return {"name": "lab", "zone": "DE", "region": "europe-west3", **fields}


_ULID = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


class _Case(msgspec.Struct, frozen=True, kw_only=True):
    """One bad value: where it is sent, the field at fault, words its reason holds."""

    method: str
    path: str  # with its query string, where the bad value is a parameter
    body: dict[str, Any] | None = None
    status: int = 422
    admin: bool = False  # sent with the admin's token, not a tenant's
    field: str
    words: tuple[str, ...]


_CASES: dict[str, _Case] = {
    "job list cursor": _Case(
        method="GET",
        path="/v1/jobs?cursor=not-an-id",
        status=400,
        field="cursor",
        words=("ULID",),
    ),
    "deployment list cursor": _Case(
        method="GET",
        path="/v1/deployments?cursor=" + _ULID.lower(),
        status=400,
        field="cursor",
        words=("ULID",),
    ),
    "model list cursor": _Case(
        method="GET",
        path="/v1/models?cursor=not-an-id",
        status=400,
        field="cursor",
        words=("ULID",),
    ),
    "model name": _Case(
        method="POST",
        path="/v1/models?name=-mlp",
        status=400,
        field="name",
        words=("letters, digits", "starting with a letter or digit"),
    ),
    "audit cursor": _Case(
        admin=True,
        method="GET",
        path="/v1/audit?cursor=next",
        status=400,
        field="cursor",
        words=("digits",),
    ),
    "token name": _Case(
        method="POST",
        path="/v1/tokens",
        body={"name": "my laptop"},
        field="$.name",
        words=("letters, digits", "64 characters"),
    ),
    "rollout version": _Case(
        admin=True,
        method="POST",
        path="/v1/agent-rollouts",
        body={"version": "v1.2"},
        field="$.version",
        words=("version", "starting with a digit"),
    ),
    "rollout node": _Case(
        admin=True,
        method="POST",
        path="/v1/agent-rollouts",
        body={"version": "1.2.0", "nodes": ["edge/1"]},
        field="$.nodes[0]",
        words=("letters, digits",),
    ),
    "tenant name": _Case(
        admin=True,
        method="POST",
        path="/v1/tenants",
        body={"name": "Acme"},
        field="$.name",
        words=("lower-case letters",),
    ),
    "tenant quota": _Case(
        admin=True,
        method="POST",
        path="/v1/tenants",
        body={"name": "acme", "quotas": {"tpu": 1}},
        field="$.quotas",
        words=("gpu, npu, cpu", "mig-1g.10gb", "a key"),
    ),
    "join token zone": _Case(
        admin=True,
        method="POST",
        path="/v1/nodes/join-tokens",
        body={"zone": "-ON"},
        field="$.zone",
        words=("zone or region",),
    ),
    "join token label key": _Case(
        admin=True,
        method="POST",
        path="/v1/nodes/join-tokens",
        body={"labels": {"team name": "ml"}},
        field="$.labels",
        words=("label key", "a key"),
    ),
    "join token label value": _Case(
        admin=True,
        method="POST",
        path="/v1/nodes/join-tokens",
        body={"labels": {"team": "=cmd()"}},
        field="$.labels[...]",  # msgspec names no key
        words=("printable", "not starting with"),
    ),
    "cluster name": _Case(
        admin=True,
        method="POST",
        path="/v1/clusters",
        body=_cluster(name="lab.one"),
        field="$.name",
        words=("lower-case letters", "no '.'"),
    ),
    "cluster zone": _Case(
        admin=True,
        method="POST",
        path="/v1/clusters",
        body=_cluster(zone="DE "),
        field="$.zone",
        words=("zone or region",),
    ),
    "cluster partition": _Case(
        admin=True,
        method="POST",
        path="/v1/clusters",
        body=_cluster(partitions={"gpu a100": None}),
        field="$.partitions",
        words=("Slurm name", "a key"),
    ),
    "cluster partition region": _Case(
        admin=True,
        method="POST",
        path="/v1/clusters",
        body=_cluster(partitions={"gpu": {"zone": "DE", "region": "/eu"}}),
        field="$.partitions[...].region",
        words=("zone or region",),
    ),
    "cluster gres model": _Case(
        admin=True,
        method="POST",
        path="/v1/clusters",
        body=_cluster(gres_models={"a,100": "A100"}),
        field="$.gres_models",
        words=("Slurm name", "a key"),
    ),
    "cluster rest_url": _Case(
        admin=True,
        method="POST",
        path="/v1/clusters",
        body=_cluster(slurm={"rest_url": "ftp://slurm.lab"}),
        field="$.slurm.rest_url",
        words=("unix:/", "http"),
    ),
    "cluster rest_user": _Case(
        admin=True,
        method="POST",
        path="/v1/clusters",
        body=_cluster(slurm={"rest_url": "http://slurm.lab:6820", "rest_user": "a:b"}),
        field="$.slurm.rest_user",
        words=("whitespace", "':'"),
    ),
    "cluster ssh": _Case(
        admin=True,
        method="POST",
        path="/v1/clusters",
        body=_cluster(slurm={"ssh": "-oProxyCommand=x"}),
        field="$.slurm.ssh",
        words=("[user@]host",),
    ),
    "cluster slurm_conf": _Case(
        admin=True,
        method="POST",
        path="/v1/clusters",
        body=_cluster(slurm={"slurm_conf": "etc/slurm.conf"}),
        field="$.slurm.slurm_conf",
        words=("absolute path",),
    ),
    "cluster bin_dir": _Case(
        admin=True,
        method="POST",
        path="/v1/clusters",
        body=_cluster(slurm={"bin_dir": "bin"}),
        field="$.slurm.bin_dir",
        words=("absolute path",),
    ),
    "cluster work_dir": _Case(
        admin=True,
        method="POST",
        path="/v1/clusters",
        body=_cluster(slurm={"work_dir": "/shared/%u"}),
        field="$.slurm.work_dir",
        words=("absolute path", "'%'"),
    ),
    "cluster qos": _Case(
        admin=True,
        method="POST",
        path="/v1/clusters",
        body=_cluster(slurm={"qos": {"p0": "high|low"}}),
        field="$.slurm.qos[...]",
        words=("Slurm name",),
    ),
}


@ONE_DATABASE
@pytest.mark.parametrize("case", list(_CASES.values()), ids=list(_CASES))
async def test_a_refused_patterned_value_is_explained_in_words(api: Api, case: _Case) -> None:
    headers = bearer(api.admin_token if case.admin else await api.tenant("acme"))
    response = await api.client.request(case.method, case.path, json=case.body, headers=headers)
    body = await problem(response, case.status)
    (invalid,) = body["invalid_params"]
    assert invalid["name"] == case.field, invalid
    for word in case.words:
        assert word in invalid["reason"], invalid
    _assert_plain(invalid["reason"])
    _assert_plain(body["detail"])


# The wire's own patterned fields, as the control plane decodes a node's message.
_WIRE_CASES: list[tuple[type[Any], dict[str, Any], str, tuple[str, ...]]] = [
    (
        messages.Accelerator,
        {"id": "gpu0", "kind": "gpu", "vendor": "nvidia", "model": "H100", "pci_bus_id": "3B:0"},
        "pci_bus_id",
        ("PCI address",),
    ),
    (
        messages.AgentUpgrade,
        {"version": "latest", "rollout_id": "r", "url": "u", "sha256": "0" * 64,
         "size_bytes": 1, "signature": "s"},
        "version",
        ("version", "starting with a digit"),
    ),
    (
        messages.AgentUpgrade,
        {"version": "1.2.0", "rollout_id": "r", "url": "u", "sha256": "AB" * 32,
         "size_bytes": 1, "signature": "s"},
        "sha256",
        ("64", "hex"),
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("wire_type", "fields", "field", "words"),
    _WIRE_CASES,
    ids=[field for _, _, field, _ in _WIRE_CASES],
)
def test_a_refused_wire_value_is_explained_in_words(
    wire_type: type[Any], fields: dict[str, Any], field: str, words: tuple[str, ...]
) -> None:
    with pytest.raises(msgspec.ValidationError) as refused:
        msgspec.convert(fields, wire_type)
    error = FieldError.from_msgspec(refused.value)
    assert error.path == (field,)
    for word in words:
        assert word in error.reason, error.reason
    _assert_plain(error.reason)


def test_the_schema_version_is_explained_in_words() -> None:
    text = Annotated[str, msgspec.Meta(pattern=_pattern_of(messages.SchemaVersion))]
    with pytest.raises(msgspec.ValidationError) as refused:
        msgspec.convert("2.0", text)
    reason = FieldError.from_msgspec(refused.value).reason
    assert "1.<minor>" in reason
    _assert_plain(reason)


def _pattern_of(annotated: object) -> str:
    info = msgspec.inspect.type_info(annotated)
    while isinstance(info, msgspec.inspect.Metadata):
        info = info.type
    assert isinstance(info, msgspec.inspect.StrType)
    assert info.pattern is not None
    return info.pattern


# ---- the guard: no pattern without words ------------------------------------------------


def _children(info: msgspec.inspect.Type) -> list[msgspec.inspect.Type]:
    if isinstance(info, msgspec.inspect.Metadata):
        return [info.type]
    if isinstance(info, msgspec.inspect.UnionType):
        return list(info.types)
    if isinstance(info, msgspec.inspect.StructType | msgspec.inspect.DataclassType):
        return [field.type for field in info.fields]
    if isinstance(info, msgspec.inspect.DictType):
        return [info.key_type, info.value_type]
    if isinstance(info, msgspec.inspect.TupleType):
        return list(info.item_types)
    if isinstance(
        info,
        msgspec.inspect.ListType
        | msgspec.inspect.VarTupleType
        | msgspec.inspect.SetType
        | msgspec.inspect.FrozenSetType,
    ):
        return [info.item_type]
    return []


def _patterns(info: msgspec.inspect.Type, seen: set[int]) -> Iterator[str]:
    """Every `pattern` msgspec checks of a str that `info` holds, however deep."""
    if id(info) in seen:
        return
    seen.add(id(info))
    if isinstance(info, msgspec.inspect.StrType) and info.pattern is not None:
        yield info.pattern
    for child in _children(info):
        yield from _patterns(child, seen)


def _decoded_types() -> list[object]:
    """What the API decodes (each route's query and JSON body) and the wire's payloads."""
    app = create_app(Settings())  # not started: only its routes are read
    found: list[object] = []
    for route in app[REGISTERED_ROUTES]:
        found.extend(kind for kind in (route.query, route.body) if kind not in (None, bytes))
    wire = sys.modules[messages.__name__]
    found.extend(
        value
        for value in vars(wire).values()
        if isinstance(value, type) and issubclass(value, msgspec.Struct)
    )
    return found


def _unworded(pattern: str) -> str | None:
    """`pattern`, where a value it refuses is explained by no words of its own."""
    # Every pattern refuses one of these: a control character, a space, a NUL.
    refused_value = next(v for v in ("\x07", " :", "\x00") if not re.search(pattern, v))
    text = Annotated[str, msgspec.Meta(pattern=pattern)]
    with pytest.raises(msgspec.ValidationError) as refused:
        msgspec.convert(refused_value, text)
    reason = FieldError.from_msgspec(refused.value).reason
    if reason == UNWORDED_PATTERN_REASON or _REGEX_TRACES.search(reason):
        return pattern
    return None


def test_every_pattern_the_api_or_the_wire_checks_has_its_own_words() -> None:
    patterns: set[str] = set()
    for decoded in _decoded_types():
        patterns.update(_patterns(msgspec.inspect.type_info(decoded), set()))
    assert len(patterns) > 20  # the walk finds them
    unworded = sorted(pattern for pattern in patterns if _unworded(pattern) is not None)
    assert unworded == [], "patterns without words (shared.errors.worded_pattern)"
