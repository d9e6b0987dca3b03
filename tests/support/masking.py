"""What a masked feed's ``hash`` gives, computed apart from Tidemark (the tests' oracle), and a key that passes.

HKDF-SHA256 (RFC 5869: no salt, ``info`` = ``tidemark masking v1``, the feed's name and the
field's, NUL-separated, 32 bytes) of the masking key, computed by ``cryptography``; then
HMAC-SHA256 of the value's bytes under that key, by Python's ``hmac``, as lower-case hex.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF


def strong_key() -> str:
    """A masking key of 256 random bits (64 hex digits), as the deployment docs say to make one."""
    return secrets.token_hex(32)


def hashed(value: str | bytes, field: str, key: str | bytes, feed: str) -> str:
    """``value``'s hash in ``field`` (``customer.email``, ``key``, ``headers.<name>``) of ``feed`` under ``key``."""
    root = key.encode() if isinstance(key, str) else key
    info = b"\0".join((b"tidemark masking v1", feed.encode(), field.encode()))
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(root)
    data = value.encode() if isinstance(value, str) else value
    return hmac.new(derived, data, hashlib.sha256).hexdigest()
