"""Client authentication: API keys sent as bearer tokens in gRPC metadata.

A client sends ``authorization: Bearer <key>``. Keys come from a file, one per line (blank
lines and ``#`` comments ignored, at least 16 characters each); every key is compared in
constant time, all of them on every call, so neither a key's bytes nor its position leaks by
timing. A request belongs to the key that made it: only that key can cancel it. Without a
keys file the scheduler serves whoever reaches it (local use), and says so at start-up.
"""

from __future__ import annotations

import hashlib
import hmac
import pathlib
from collections.abc import Iterable

MIN_KEY_LEN = 16
HEADER = "authorization"
SCHEME = "bearer "


class ApiKeys:
    def __init__(self, keys: Iterable[str]):
        self._keys = [k.encode() for k in keys]
        if not self._keys:
            raise ValueError("the API keys file holds no key")
        for i, k in enumerate(self._keys):
            if len(k) < MIN_KEY_LEN:
                raise ValueError(f"API key {i + 1} has {len(k)} characters; at least "
                                 f"{MIN_KEY_LEN} are required")

    @classmethod
    def load(cls, path: str | pathlib.Path) -> ApiKeys:
        lines = pathlib.Path(path).read_text().splitlines()
        return cls(s for line in lines if (s := line.strip()) and not s.startswith("#"))

    def __len__(self) -> int:
        return len(self._keys)

    def owner(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
        """Who sent ``metadata``: a stable id of the key it carries (a hash prefix, never
        the key), or None when it carries no known key."""
        token = b""
        for name, value in metadata or ():
            if name.lower() == HEADER:
                text = value.decode() if isinstance(value, bytes) else value
                if text[:len(SCHEME)].lower() == SCHEME:
                    token = text[len(SCHEME):].strip().encode()
        found = None
        for key in self._keys:  # every key, every time: constant time in which one matches
            if hmac.compare_digest(key, token) and token:
                found = key
        return None if found is None else hashlib.sha256(found).hexdigest()[:16]
