"""Ed25519 signature checks (shared/ed25519.py): the system libcrypto an agent already
has loaded and cryptography, its fallback, give the same answer on every signature,
good or bad, and agree with RFC 8032."""

from __future__ import annotations

import os

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.ed25519 import (
    _KNOWN_PUBLIC_KEY,
    _KNOWN_SIGNATURE,
    SignatureChecker,
    VerifyKey,
    cryptography_checker,
    is_signature,
    signature_checker,
    system_libcrypto_checker,
)

# The order of the group Ed25519 signs in: S + L is the same signature, not canonical.
GROUP_ORDER = 2**252 + 27742317777372353535851937790883648493
SYSTEM = system_libcrypto_checker()
CHECKERS = [
    pytest.param(cryptography_checker, id="cryptography"),
    pytest.param(
        SYSTEM,
        id="system-libcrypto",
        marks=pytest.mark.skipif(SYSTEM is None, reason="no libcrypto with Ed25519 mapped"),
    ),
]
KEY = Ed25519PrivateKey.generate()
PUBLIC = KEY.public_key().public_bytes_raw()


def test_the_known_answer_is_rfc_8032s_first_vector() -> None:
    secret = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    key = Ed25519PrivateKey.from_private_bytes(secret)
    assert key.public_key().public_bytes_raw() == _KNOWN_PUBLIC_KEY
    assert key.sign(b"") == _KNOWN_SIGNATURE


def test_linux_agents_check_with_the_libcrypto_they_have_loaded() -> None:
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("not Linux")
    assert SYSTEM is not None
    assert type(signature_checker()) is type(SYSTEM)


@pytest.mark.parametrize("checker", CHECKERS)
def test_a_signature_checks_out_and_any_change_is_refused(checker: SignatureChecker) -> None:
    message = b"greenfed-agent-package/1\n2.0\n"
    signature = KEY.sign(message)
    assert checker(PUBLIC, signature, message)
    assert not checker(PUBLIC, signature, message + b"\n")
    assert not checker(PUBLIC, bytes([signature[0] ^ 1]) + signature[1:], message)
    assert not checker(
        Ed25519PrivateKey.generate().public_key().public_bytes_raw(), signature, message
    )
    assert not checker(PUBLIC, signature[:63], message)
    assert not checker(PUBLIC, signature + b"\x00", message)
    assert not checker(PUBLIC[:31], signature, message)


@pytest.mark.parametrize("checker", CHECKERS)
def test_a_non_canonical_signature_is_refused(checker: SignatureChecker) -> None:
    message = b"malleable?"
    signature = KEY.sign(message)
    s = int.from_bytes(signature[32:], "little") + GROUP_ORDER
    assert s < 2**256
    assert not checker(PUBLIC, signature[:32] + s.to_bytes(32, "little"), message)


@pytest.mark.skipif(SYSTEM is None, reason="no libcrypto with Ed25519 mapped")
@settings(max_examples=200, deadline=None)
@given(
    message=st.binary(max_size=300),
    public_key=st.one_of(st.just(PUBLIC), st.binary(min_size=32, max_size=32)),
    signature=st.one_of(st.binary(min_size=64, max_size=64), st.just(b"")),
    signed=st.booleans(),
)
def test_both_checkers_agree_on_anything(
    message: bytes, public_key: bytes, signature: bytes, signed: bool
) -> None:
    if signed:
        public_key, signature = PUBLIC, KEY.sign(message)
    assert SYSTEM is not None
    answer = cryptography_checker(public_key, signature, message)
    assert SYSTEM(public_key, signature, message) == answer
    # Made-up signatures are refused too, except under a key of small order (all zeros,
    # say: no control plane's), for which OpenSSL accepts some, through either checker.
    assert answer or not signed


def test_keys_of_either_kind_check_signatures() -> None:
    message = b"desired"
    signature = KEY.sign(message)
    assert is_signature(VerifyKey(PUBLIC), signature, message)
    assert is_signature(KEY.public_key(), signature, message)  # the control plane's
    assert not is_signature(VerifyKey(PUBLIC), signature, b"other")
    assert not is_signature(KEY.public_key(), signature, b"other")


def test_a_verify_key_is_32_bytes_and_compares_by_value() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        VerifyKey(PUBLIC[:16])
    assert VerifyKey(PUBLIC) == VerifyKey(bytes(PUBLIC))
    assert len({VerifyKey(PUBLIC), VerifyKey(PUBLIC)}) == 1
