"""A report refused for who sent it: it speaks for a rank or pod name that belongs to
another sender (peer.py), names a pod the pod map does not vouch for (kubepods.py), or a
name the allow-list pins elsewhere (names.py). The admission (admission.py) raises it;
the agent counts it by its reason and never applies the report."""
from __future__ import annotations


class Refused(Exception):
    """A report refused for who sent it (counted by ``reason``, never applied)."""

    def __init__(self, reason: str = "identity_mismatch") -> None:
        super().__init__(reason)
        self.reason = reason
