"""How client and admin keys are stored: as `sha256:<hex>` of the secret, never plaintext."""

from __future__ import annotations

import hashlib


def hash_key(secret: str) -> str:
    """The stored form of a key, for `keys.<id>.hash` in the policy.

    >>> hash_key("fake-key")[:7]
    'sha256:'
    """
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()
