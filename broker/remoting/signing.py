"""Request signatures of RocketMQ's plain ACL: what the client's ``AclClientRPCHook`` adds and the broker checks.

The signed content is the values of the request's ``extFields`` (the ``AccessKey`` and, when given, the
``SecurityToken`` among them; never ``Signature`` itself) concatenated in the order of their keys (Java's
``TreeMap``: UTF-16 code-unit order, the same as Python's for the ASCII keys RocketMQ uses), in UTF-8, then
the body bytes. The signature is HmacSHA1 of that under the secret key, base64-encoded.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from broker.remoting.command import RemotingCommand

ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"


NOT_SIGNED = frozenset({SIGNATURE})


def signed_values(ext: Mapping[str, str], exclude: frozenset[str] = NOT_SIGNED) -> bytes:
    """The ext values sorted by key (``exclude`` left out), concatenated, UTF-8: what precedes the body."""
    return "".join([ext[k] for k in sorted(ext) if k not in exclude]).encode("utf-8")


def signed_content(ext: Mapping[str, str], body: bytes, exclude: Iterable[str] = NOT_SIGNED) -> bytes:
    """The bytes a signature covers: the ext values sorted by key (``exclude`` left out), then the body."""
    return signed_values(ext, frozenset(exclude)) + (body or b"")


_BLOCK = 64  # SHA-1's block size


@functools.lru_cache(maxsize=256)
def _keyed(key: bytes) -> tuple[hashlib._Hash, hashlib._Hash]:
    """HMAC's inner and outer hashes with the key already absorbed (RFC 2104), to be copied per message.

    ``hmac.digest`` would do the same in C, but it drops and retakes the GIL on every call, which on a busy
    broker turns a few microseconds of hashing into a wait for the GIL behind the store's threads."""
    if len(key) > _BLOCK:
        key = hashlib.sha1(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    return hashlib.sha1(bytes(b ^ 0x36 for b in key)), hashlib.sha1(bytes(b ^ 0x5C for b in key))


def signature(content: bytes, secret_key: str | bytes, body: bytes = b"") -> str:
    """HmacSHA1 of ``content`` + ``body`` under ``secret_key`` (UTF-8), base64 (``AclSigner.calSignature``);
    the body is hashed where it lies rather than copied onto the content."""
    inner, outer = _keyed(secret_key.encode("utf-8") if isinstance(secret_key, str) else secret_key)
    digest = inner.copy()
    digest.update(content)
    if body:
        digest.update(body)
    mac = outer.copy()
    mac.update(digest.digest())
    return base64.b64encode(mac.digest()).decode("ascii")


@dataclass(frozen=True, slots=True)
class Credentials:
    """An access key and its secret (``SessionCredentials``); the secret never shows in ``repr``."""

    access_key: str
    secret_key: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)

    def sign(self, cmd: RemotingCommand) -> None:
        """Add ``AccessKey`` (and ``SecurityToken``) and the ``Signature`` over them, the others and the body."""
        ext = cmd.ext_fields
        ext[ACCESS_KEY] = self.access_key
        if self.security_token is not None:
            ext[SECURITY_TOKEN] = self.security_token
        ext[SIGNATURE] = signature(signed_values(ext), self.secret_key, cmd.body)

    def signed(self, cmd: RemotingCommand) -> bool:
        """Whether ``cmd`` carries this account's ``AccessKey`` and a ``Signature`` made with its secret."""
        ext = cmd.ext_fields
        given = ext.get(SIGNATURE)
        if ext.get(ACCESS_KEY) != self.access_key or given is None:
            return False
        expected = signature(signed_values(ext), self.secret_key, cmd.body)
        return hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace"))
