"""A refused text value says in words what is wrong, never as the regex that refused it:
an image reference names the part at fault (upper case in the path, a bad tag, a bad
digest); every other patterned field of a job spec says what it takes. Through the real
REST API on both databases, and in `greenfed submit`'s local check of a spec file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pytest

from cloud.work.specs import DeploymentSpec, TrainingJobSpec, describe_error
from greenfed.spec_files import SpecFileError, load_spec_file
from shared.errors import UNWORDED_PATTERN_REASON, FieldError
from tests.api.support import Api, job_spec, problem

pytestmark = pytest.mark.timeout(60)

# What a regex leaks into a message: msgspec's own words, escapes, groups, anchors.
_REGEX_TRACES = re.compile(r"regex|\\\\|\(\?|\[\^|\{0,|\$\(")


def _assert_plain(reason: str) -> None:
    assert _REGEX_TRACES.search(reason) is None, reason


# (the spec's fields, the field at fault, words its reason must hold)
_REFUSED: list[tuple[dict[str, Any], str, tuple[str, ...]]] = [
    ({"image": "ghcr.io/Acme/trainer:2"}, "$.image", ("OCI image reference", "lower case")),
    ({"image": "Trainer"}, "$.image", ("lower case",)),
    ({"image": "ghcr.io/acme/trainer:v1+build"}, "$.image", ("tag",)),
    ({"image": "ghcr.io/acme/trainer:.v1"}, "$.image", ("tag",)),
    ({"image": "acme/trainer@sha256:xyz"}, "$.image", ("digest",)),
    ({"image": "ghcr.io:123456/acme/trainer"}, "$.image", ("registry",)),
    ({"image": "ghcr.io//trainer"}, "$.image", ("empty",)),
    ({"image": "ghcr.io/acme/train..er"}, "$.image", ("path",)),
    ({"image": "ghcr.io/acme/trainer 2"}, "$.image", ("whitespace",)),
    (
        {
            "image": "ghcr.io/acme/t:1",
            "registry_auth": {"registry": "ghcr io", "username": "u", "password": "p"},
        },
        "$.registry_auth.registry",
        ("registry", "host"),
    ),
    (
        {
            "image": "ghcr.io/acme/t:1",
            "registry_auth": {"username": "bob\x1b[31m", "password": "p"},
        },
        "$.registry_auth.username",
        ("control",),
    ),
    ({"secret_env": {"HF/TOKEN": "x"}}, "$.secret_env", ("variable name", "a key")),
    ({"secret_env": {"HF=TOKEN": "x"}}, "$.secret_env", ("variable name", "a key")),
    ({"secret_env": {"": "x"}}, "$.secret_env", ("variable name", "a key")),
    ({"env": {"1ST": "x"}}, "$.env", ("variable name", "a key")),
    ({"name": "train resnet"}, "$.name", ("letters, digits",)),
    ({"mig_profile": "1g10gb"}, "$.mig_profile", ("MIG profile",)),
    ({"start_window": "8pm-6am"}, "$.start_window", ("HH:MM-HH:MM",)),
    ({"working_dir": "/my dir"}, "$.working_dir", ("whitespace",)),
    ({"depends_on": [{"job": "a job"}]}, "$.depends_on[0].job", ("letters, digits",)),
]


async def test_a_refused_text_value_is_explained_in_words(api: Api) -> None:
    token = await api.tenant("acme")
    for fields, name, words in _REFUSED:
        response = await api.submit(token, job_spec(**fields))
        body = await problem(response, 422)
        (invalid,) = body["invalid_params"]
        assert invalid["name"] == name, (fields, invalid)
        for word in words:
            assert word in invalid["reason"], (fields, invalid)
        _assert_plain(invalid["reason"])
        _assert_plain(body["detail"])


async def test_well_formed_images_are_still_taken(api: Api) -> None:
    token = await api.tenant("acme")
    for image in (
        "ghcr.io/acme/trainer:2",
        "Acme/trainer",  # an upper-case first component names a registry
        "localhost:5000/job",
        "pytorch/pytorch@sha256:" + "ab" * 32,
        "registry.example:443/a__b/c-d/e.f:Tag_1.0@sha256:" + "0" * 64,
    ):
        spec = job_spec(image=image, allow_unschedulable=True)
        response = await api.submit(token, spec)
        assert response.status == 201, (image, await response.text())


def test_greenfed_submit_names_the_image_part_at_fault(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(
        'kind = "training"\nname = "train"\ncommand = ["python"]\n'
        'image = "ghcr.io/Acme/trainer:2"\n'
    )
    with pytest.raises(SpecFileError) as refused:
        load_spec_file(path)
    message = str(refused.value)
    assert "$.image: not an OCI image reference" in message
    assert "lower case" in message
    _assert_plain(message)


def _patterned_strings(info: msgspec.inspect.Type, seen: set[int]) -> list[str]:
    """Every `pattern` of a str that `info` holds, however deep."""
    if id(info) in seen:
        return []
    seen.add(id(info))
    if isinstance(info, msgspec.inspect.StrType):
        return [info.pattern] if info.pattern is not None else []
    found: list[str] = []
    for child in _children(info):
        found.extend(_patterned_strings(child, seen))
    return found


def _children(info: msgspec.inspect.Type) -> list[msgspec.inspect.Type]:
    if isinstance(info, msgspec.inspect.Metadata):
        return [info.type]
    if isinstance(info, msgspec.inspect.UnionType):
        return list(info.types)
    if isinstance(info, msgspec.inspect.StructType):
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


@pytest.mark.parametrize("spec_type", [TrainingJobSpec, DeploymentSpec])
def test_every_patterned_field_of_a_spec_has_its_own_words(spec_type: type[Any]) -> None:
    patterns = _patterned_strings(msgspec.inspect.type_info(spec_type), set())
    assert patterns  # the walk finds them
    for pattern in patterns:
        text = Annotated[str, msgspec.Meta(pattern=pattern)]
        with pytest.raises(msgspec.ValidationError) as refused:
            msgspec.convert("\x07", text)
        _, reason = describe_error(refused.value)
        _assert_plain(reason)
        assert reason != UNWORDED_PATTERN_REASON, f"{pattern!r} has no words of its own"


def _unworded_refusal() -> msgspec.ValidationError:
    text = Annotated[str, msgspec.Meta(pattern=r"^only-in-this-test$(?!\n)")]
    try:
        msgspec.convert("other", text)
    except msgspec.ValidationError as error:
        return error
    raise AssertionError("converted")


def test_a_pattern_without_words_still_shows_no_regex() -> None:
    refused = FieldError.from_msgspec(_unworded_refusal())
    assert (refused.path, refused.reason) == ((), UNWORDED_PATTERN_REASON)
    _assert_plain(refused.reason)
