"""A report refused for who sent it: it speaks for a rank or pod name that belongs to
another sender (peer.py), names a pod the pod map does not vouch for (kubepods.py), or a
name the allow-list pins elsewhere (names.py). Counted by its reason, never applied."""
from __future__ import annotations


class Mismatch(Exception):
    """A report speaks for a rank or pod of another domain (counted, never applied)."""

    def __init__(self, reason: str = "identity_mismatch") -> None:
        super().__init__(reason)
        self.reason = reason
