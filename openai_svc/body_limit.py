"""Refuse a request body larger than a limit (413, OpenAI's error shape) before reading it
all: by its Content-Length when it has one, else as the bytes arrive."""

from __future__ import annotations

import json
from typing import Any

# As gRPC's default message cap: no valid request is near it (the scheduler allows 32 bytes of
# prompt per token of context).
DEFAULT_MAX_BODY_BYTES = 4 << 20


class BodyLimit:
    """ASGI middleware around ``app``."""

    def __init__(self, app: Any, max_bytes: int = DEFAULT_MAX_BODY_BYTES):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(send, int(length))
            return
        seen = 0

        async def counting() -> dict:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return msg

        try:
            await self.app(scope, counting, send)
        except _TooLarge:
            await self._refuse(send, seen)

    async def _refuse(self, send: Any, size: int) -> None:
        body = json.dumps({"error": {
            "message": f"body: {size} bytes or more; the limit is {self.max_bytes}",
            "type": "invalid_request_error", "param": None, "code": "request_too_large"}})
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body.encode()})


class _TooLarge(Exception):
    pass
