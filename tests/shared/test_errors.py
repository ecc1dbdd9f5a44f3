"""FieldError: the path and reason of a refused value, as data, from our checks and from
msgspec's own messages (whose format the parser here pins)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import msgspec
import pytest

from shared.errors import (
    FieldError,
    MissingFieldError,
    UnknownFieldError,
    dotted_path,
    json_path,
)


class Leaf(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    size: Annotated[int, msgspec.Meta(ge=0)] = 0
    name: str = ""

    def __post_init__(self) -> None:
        if self.name == "bad":
            raise FieldError("name", "is bad")


class Root(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    required: int
    leaves: tuple[Leaf, ...] = ()
    by_key: dict[Annotated[str, msgspec.Meta(min_length=1)], Leaf] = {}
    leaf: Leaf | None = None


def refusal(document: object) -> FieldError:
    with pytest.raises(msgspec.ValidationError) as error:
        msgspec.json.decode(msgspec.json.encode(document), type=Root)
    return FieldError.from_msgspec(error.value)


def test_paths_render_as_json_paths_and_dotted_keys() -> None:
    path = ("affinity", 0, "values")
    assert (json_path(path), dotted_path(path)) == ("$.affinity[0].values", "affinity[0].values")
    assert (json_path(("table", ..., "x")), dotted_path(("table", ..., "x"))) == (
        "$.table[...].x",
        "table[...].x",
    )
    assert (json_path(()), dotted_path(())) == ("$", "")


def test_a_field_error_is_a_value_error_that_says_path_and_reason() -> None:
    error = FieldError(("leaves", 2, "name"), "is bad")
    assert isinstance(error, ValueError)
    assert str(error) == "leaves[2].name: is bad"
    assert str(FieldError((), "is bad")) == "is bad"
    assert str(FieldError("name", "is bad", message="leaf 7: is bad")) == "leaf 7: is bad"
    assert FieldError("name", "x").path == ("name",)


@pytest.mark.parametrize(
    ("document", "kind", "path", "reason"),
    [
        ({"required": "x"}, FieldError, ("required",), "Expected `int`, got `str`"),
        ({"required": 1, "extra": 1}, UnknownFieldError, ("extra",), "unknown field"),
        ({}, MissingFieldError, ("required",), "required field is missing"),
        (
            {"required": 1, "leaves": [{}, {"size": -1}]},
            FieldError,
            ("leaves", 1, "size"),
            "Expected `int` >= 0",
        ),
        (
            {"required": 1, "leaves": [{"sise": 1}]},
            UnknownFieldError,
            ("leaves", 0, "sise"),
            "unknown field",
        ),
        (
            {"required": 1, "by_key": {"k": {"size": -1}}},
            FieldError,
            ("by_key", ..., "size"),
            "Expected `int` >= 0",
        ),
        (
            {"required": 1, "by_key": {"": {}}},
            FieldError,
            ("by_key",),
            "Expected `str` of length >= 1 (a key)",
        ),
        ([1], FieldError, (), "Expected `object`, got `array`"),
    ],
)
def test_msgspec_refusals_become_typed_field_errors(
    document: object, kind: type[FieldError], path: tuple[object, ...], reason: str
) -> None:
    refused = refusal(document)
    assert type(refused) is kind
    assert (refused.path, refused.reason) == (path, reason)


def test_msgspec_keeps_its_own_words_for_unknown_and_missing_fields() -> None:
    assert str(refusal({"required": 1, "extra": 1})) == "Object contains unknown field `extra`"
    assert str(refusal({})) == "Object missing required field `required`"


def _decode_json(document: object) -> Root:
    return msgspec.json.decode(msgspec.json.encode(document), type=Root)


def _convert(document: object) -> Root:
    return msgspec.convert(document, Root)


@pytest.mark.parametrize("decode", [_decode_json, _convert])
def test_a_post_init_field_error_keeps_its_path_under_msgspecs_location(
    decode: Callable[[object], Root],
) -> None:
    document = {"required": 1, "leaves": [{}, {"name": "bad"}], "leaf": {"name": "bad"}}
    with pytest.raises(msgspec.ValidationError) as error:
        decode(document)
    assert isinstance(error.value.__cause__, FieldError)  # msgspec wraps, keeping ours
    refused = FieldError.from_msgspec(error.value)
    assert (refused.path, refused.reason) == (("leaves", 1, "name"), "is bad")
    nested = refusal({"required": 1, "leaf": {"name": "bad"}})
    assert (nested.path, nested.reason) == (("leaf", "name"), "is bad")
