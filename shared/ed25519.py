"""Ed25519 signatures checked by the OpenSSL an agent has already loaded.

An agent checks what the control plane signs (`desired` documents, agent packages) and
keeps whatever did the checking for as long as it runs. cryptography's extension links
a copy of OpenSSL of its own: about 7 MB resident once imported, for one function. The
interpreter's `_hashlib` and `_ssl` link the system's libcrypto (every distribution's
Python does), which every agent has mapped already (asyncio imports ssl), and its
`EVP_DigestVerify` checks Ed25519 signatures (RFC 8032) since OpenSSL 1.1.1: called
through ctypes, the check costs about 0.5 MB.

Where no libcrypto is mapped (a Python that links OpenSSL statically, another OS) or it
cannot check Ed25519, cryptography checks instead: the same answer from the same
implementation (OpenSSL's), for more memory. Which one is used is decided once, after a
known-answer test (RFC 8032's first vector) passes.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:
    import ctypes

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

PUBLIC_KEY_BYTES: Final = 32
SIGNATURE_BYTES: Final = 64
_EVP_PKEY_ED25519: Final = 1087  # NID_ED25519 in every OpenSSL since 1.1.1

# RFC 8032, section 7.1, TEST 1: the empty message.
_KNOWN_PUBLIC_KEY: Final = bytes.fromhex(
    "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"
)
_KNOWN_SIGNATURE: Final = bytes.fromhex(
    "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555"
    "fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
)


class SignatureChecker(Protocol):
    def __call__(self, public_key: bytes, signature: bytes, message: bytes) -> bool: ...


class VerifyKey:
    """An Ed25519 public key, its 32 raw bytes, which checks signatures made with it."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        if len(raw) != PUBLIC_KEY_BYTES:
            raise ValueError(
                f"an Ed25519 public key is {PUBLIC_KEY_BYTES} bytes, this one is {len(raw)}"
            )
        self.raw = bytes(raw)

    def is_signature(self, signature: bytes, message: bytes) -> bool:
        """Whether `signature` is this key's over `message`."""
        return signature_checker()(self.raw, signature, message)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VerifyKey) and other.raw == self.raw

    def __hash__(self) -> int:
        return hash(self.raw)

    def __repr__(self) -> str:
        return f"VerifyKey({self.raw.hex()})"


def is_signature(key: VerifyKey | Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    """Whether `signature` is `key`'s over `message`, whichever kind of key it is: the
    control plane holds cryptography's (it signs with cryptography), agents a VerifyKey."""
    if isinstance(key, VerifyKey):
        return key.is_signature(signature, message)
    from cryptography.exceptions import InvalidSignature

    try:
        key.verify(signature, message)
    except InvalidSignature:
        return False
    return True


@functools.cache
def signature_checker() -> SignatureChecker:
    """The system's libcrypto where it passes the known-answer test, else cryptography."""
    system = system_libcrypto_checker()
    return system if system is not None else cryptography_checker


def cryptography_checker(public_key: bytes, signature: bytes, message: bytes) -> bool:
    if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except InvalidSignature:
        return False
    return True


def system_libcrypto_checker() -> SignatureChecker | None:
    """A checker calling the libcrypto this process has mapped; None where there is none,
    or it cannot check Ed25519, or gets RFC 8032's first vector wrong."""
    path = _mapped_libcrypto()
    if path is None:
        return None
    import ctypes

    try:
        checker = _LibcryptoChecker(ctypes.CDLL(path))
    except (OSError, AttributeError):  # not loadable, or older than OpenSSL 1.1.1
        return None
    try:
        passes = checker(_KNOWN_PUBLIC_KEY, _KNOWN_SIGNATURE, b"") and not checker(
            _KNOWN_PUBLIC_KEY, _KNOWN_SIGNATURE, b"\x00"
        )
    except _Unsupported:
        return None
    return checker if passes else None


def _mapped_libcrypto() -> str | None:
    """The path of the libcrypto the interpreter's OpenSSL modules linked, if mapped."""
    try:
        import _hashlib  # noqa: F401  (loads libcrypto where it is a shared library)
    except ImportError:
        return None
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6:
                    path = fields[5].rstrip("\n")
                    if path.rpartition("/")[2].startswith("libcrypto.so"):
                        return path
    except OSError:  # no /proc: not Linux
        return None
    return None


class _Unsupported(Exception):
    """This libcrypto makes no Ed25519 key (a FIPS-only provider, say)."""


class _LibcryptoChecker:
    def __init__(self, library: ctypes.CDLL) -> None:
        import ctypes

        pointer, size, data = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        self._new_key = library.EVP_PKEY_new_raw_public_key
        self._new_key.argtypes = [ctypes.c_int, pointer, data, size]
        self._new_key.restype = pointer
        self._free_key = library.EVP_PKEY_free
        self._free_key.argtypes = [pointer]
        self._free_key.restype = None
        self._new_context = library.EVP_MD_CTX_new
        self._new_context.argtypes = []
        self._new_context.restype = pointer
        self._free_context = library.EVP_MD_CTX_free
        self._free_context.argtypes = [pointer]
        self._free_context.restype = None
        self._init = library.EVP_DigestVerifyInit
        self._init.argtypes = [pointer, pointer, pointer, pointer, pointer]
        self._init.restype = ctypes.c_int
        self._verify = library.EVP_DigestVerify
        self._verify.argtypes = [pointer, data, size, data, size]
        self._verify.restype = ctypes.c_int
        # A refused signature leaves an entry in this thread's OpenSSL error queue, which
        # the ssl module would otherwise find on its next call.
        self._clear_errors = library.ERR_clear_error
        self._clear_errors.argtypes = []
        self._clear_errors.restype = None

    def __call__(self, public_key: bytes, signature: bytes, message: bytes) -> bool:
        if len(public_key) != PUBLIC_KEY_BYTES or len(signature) != SIGNATURE_BYTES:
            return False
        key = self._new_key(_EVP_PKEY_ED25519, None, public_key, len(public_key))
        if not key:
            self._clear_errors()
            raise _Unsupported
        context = self._new_context()
        try:
            if not context:
                raise MemoryError("EVP_MD_CTX_new")
            if self._init(context, None, None, None, key) != 1:
                raise _Unsupported
            verified: int = self._verify(context, signature, len(signature), message, len(message))
            return verified == 1
        finally:
            self._free_context(context)
            self._free_key(key)
            self._clear_errors()
