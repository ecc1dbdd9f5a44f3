"""The signing rule of `desired` documents (shared/desired_signature.py): what the
control plane publishes verifies with its public key and decodes to the same document;
anything unsigned, altered or signed by another key is refused before it is decoded."""

from __future__ import annotations

import base64

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.desired_signature import (
    DesiredSignatureError,
    PublicKeyError,
    load_public_key,
    public_key_base64,
    sign_desired,
    verify_desired,
)
from shared.messages import DesiredState, DesiredTraining, encode
from shared.settings import ConfigError
from tests.support.fleet import mqtt_settings, simulated_agent

KEY = Ed25519PrivateKey.generate()
OTHER_KEY = Ed25519PrivateKey.generate()

# Text that is hard on a splice: quotes, backslashes, braces, non-ASCII, and the member
# name itself.
tricky_text = st.lists(
    st.sampled_from(['"', "\\", "{", "}", ",", ":", "signature", "null", "é", "🔑", "a"]),
    max_size=6,
).map("".join)
environments = st.dictionaries(
    st.one_of(st.just("signature"), tricky_text), tricky_text, max_size=4
)
workers = st.builds(
    DesiredTraining,
    job_id=tricky_text.filter(bool),
    command=st.lists(tricky_text, max_size=3).map(tuple),
    env=environments,
)
documents = st.builds(
    DesiredState,
    node_id=st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,20}\Z"),
    generation=st.integers(min_value=0, max_value=2**53),
    issued_at=st.floats(min_value=0, max_value=4e9),
    cluster_id=st.one_of(st.none(), tricky_text),
    for_instance=st.one_of(st.none(), tricky_text),
    training=st.lists(workers, max_size=3).map(tuple),
)


def document(**changes: object) -> DesiredState:
    base = DesiredState(
        node_id="a100-1",
        generation=3,
        issued_at=1.0,
        cluster_id="c1",
        training=(DesiredTraining(job_id="j1", command=("python", "train.py")),),
    )
    return msgspec.structs.replace(base, **changes)


@settings(max_examples=200, deadline=None)
@given(documents)
def test_what_is_signed_verifies_and_decodes_to_the_same_document(original: DesiredState) -> None:
    payload = sign_desired(original, KEY)
    verified = verify_desired(payload, KEY.public_key())
    assert msgspec.structs.replace(verified, signature=None) == original
    assert verified.signature is not None
    assert payload.endswith(b',"signature":"' + verified.signature.encode() + b'"}')


@settings(max_examples=100, deadline=None)
@given(documents)
def test_a_document_signed_by_another_key_is_refused(original: DesiredState) -> None:
    with pytest.raises(DesiredSignatureError) as refused:
        verify_desired(sign_desired(original, OTHER_KEY), KEY.public_key())
    assert refused.value.reason == "bad-signature"


def test_the_published_bytes_are_the_unsigned_encoding_with_the_signature_spliced_in() -> None:
    """The rule docs/mqtt.md gives third-party agents, checked byte for byte."""
    original = document()
    payload = sign_desired(original, KEY)
    unsigned = encode(original)
    assert unsigned.endswith(b',"signature":null}')
    head, _, signature = payload.rpartition(b',"signature":')
    assert head + b',"signature":null}' == unsigned
    raw = base64.b64decode(signature.removeprefix(b'"').removesuffix(b'"}'))
    KEY.public_key().verify(raw, unsigned)  # raises if not


def test_one_signature_has_one_spelling() -> None:
    """The last base64 character of a 64-byte signature carries 4 spare bits, which
    decoding ignores: another spelling of the same signature (other bytes, a document
    that looks new) is refused."""
    payload = sign_desired(document(), KEY)
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = payload[-5:-4]  # before the padding "==" and the closing '"}'
    respelled = payload[:-5] + bytes([alphabet[alphabet.index(last) ^ 1]]) + payload[-4:]
    assert respelled != payload
    assert base64.b64decode(respelled[-90:-2]) == base64.b64decode(payload[-90:-2])
    assert verify_desired(payload, KEY.public_key()).generation == document().generation
    with pytest.raises(DesiredSignatureError) as refused:
        verify_desired(respelled, KEY.public_key())
    assert refused.value.reason == "malformed"


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (encode(document()), "unsigned"),
        (b'{"node_id":"a100-1","generation":1,"issued_at":1.0}', "unsigned"),
        (b"{not json", "unsigned"),
        (b"", "unsigned"),
        (encode(document()).replace(b'"signature":null', b'"signature":"bm9wZQ=="'), "malformed"),
        (encode(document()).replace(b'"signature":null', b'"signature":7'), "malformed"),
    ],
    ids=["encoded-unsigned", "pre-1.3", "garbage", "empty", "short-signature", "not-a-string"],
)
def test_unsigned_and_malformed_documents_are_refused_with_their_reason(
    payload: bytes, reason: str
) -> None:
    with pytest.raises(DesiredSignatureError) as refused:
        verify_desired(payload, KEY.public_key())
    assert refused.value.reason == reason


@pytest.mark.parametrize(
    "tamper",
    [
        lambda p: p.replace(b'"generation":3', b'"generation":999999'),
        lambda p: p.replace(b'"train.py"', b'"evil.py"'),
        lambda p: p.replace(b'"node_id":"a100-1"', b'"node_id":"a100-2"'),
        # Member added after the splice point: the document no longer ends with it.
        lambda p: p[:-1] + b',"extra":1}',
        # The signature moved inside an env dict, a new one at the end: not ours.
        lambda p: p.replace(b'"env":{}', b'"env":{"signature":"x"}'),
    ],
    ids=["generation", "command", "addressee", "appended-member", "env"],
)
def test_any_change_to_a_signed_document_is_refused(tamper: object) -> None:
    payload = sign_desired(document(), KEY)
    changed = tamper(payload)  # type: ignore[operator]
    assert changed != payload
    with pytest.raises(DesiredSignatureError) as refused:
        verify_desired(changed, KEY.public_key())
    assert refused.value.reason in ("bad-signature", "malformed")


def test_a_signed_document_that_is_not_a_valid_desired_state_is_malformed() -> None:
    """Our key over bytes the decoder refuses (a non-additive change): never applied."""
    body = b'{"node_id":"../..","generation":-1,"issued_at":1.0,"signature":null}'
    signature = base64.b64encode(KEY.sign(body))
    payload = body[: -len(b"null}")] + b'"' + signature + b'"}'
    with pytest.raises(DesiredSignatureError) as refused:
        verify_desired(payload, KEY.public_key())
    assert refused.value.reason == "malformed"


def test_a_public_key_round_trips_through_base64() -> None:
    text = public_key_base64(KEY)
    assert text == public_key_base64(KEY.public_key())
    assert len(base64.b64decode(text)) == 32
    loaded = load_public_key(text)
    assert verify_desired(sign_desired(document(), KEY), loaded).generation == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not base64!", "not valid base64"),
        (base64.b64encode(b"short").decode(), "32 bytes, this one is 5"),
        ("", "32 bytes, this one is 0"),
    ],
)
def test_a_bad_public_key_is_refused_clearly(text: str, message: str) -> None:
    with pytest.raises(PublicKeyError, match=message):
        load_public_key(text)


def test_an_agent_given_a_bad_public_key_names_the_setting() -> None:
    with pytest.raises(ConfigError) as refused:
        simulated_agent(
            "orin-1", mqtt_settings("mqtt://127.0.0.1:1", "x"), control_plane_public_key="AAAA"
        )
    assert refused.value.key == "agent.control_plane_public_key"
    assert "32 bytes" in str(refused.value)


def test_the_instance_a_document_was_issued_for_is_signed_with_it() -> None:
    payload = sign_desired(document(for_instance="instance-a"), KEY)
    assert verify_desired(payload, KEY.public_key()).for_instance == "instance-a"

    rebound = payload.replace(b'"for_instance":"instance-a"', b'"for_instance":"instance-b"')
    assert rebound != payload
    with pytest.raises(DesiredSignatureError) as refused:
        verify_desired(rebound, KEY.public_key())
    assert refused.value.reason == "bad-signature"
