"""A small OpenAI-compatible completions server for the benchmark client's tests.

``POST /v1/completions`` with ``stream`` sends one server-sent event per output token
(``max_tokens`` of them, every prompt token id must be an int), then a usage chunk and
``[DONE]``; a prompt longer than ``MAX_PROMPT`` gets a 400 in OpenAI's error shape.
``POST /v1/chat/completions`` answers a user message with ``answer_length(text)`` tokens (at
most ``max_tokens``), finishing with "stop" (or "length" at the cap), its usage counting the
message's words as prompt tokens. ``GET /v1/models`` lists one model. Every request body is
kept in ``bodies``. Run as a script
(``python fake_openai.py PORT``) it serves until killed.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "fake-model"
MAX_PROMPT = 64
TOKEN_DELAY_S = 0.002


class FakeOpenAI(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int = 0):
        super().__init__(("127.0.0.1", port), _Handler)
        self.bodies: list[dict] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _json(self, code: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "not found", "type": "not_found"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.bodies.append(body)
        if self.path == "/v1/chat/completions" and body.get("model") == MODEL:
            self._chat(body)
            return
        prompt = body.get("prompt")
        if self.path != "/v1/completions" or body.get("model") != MODEL:
            self._json(404, {"error": {"message": "unknown model or path", "type": "not_found"}})
            return
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            self._json(400, {"error": {"message": "prompt must be token ids", "param": "prompt"}})
            return
        if len(prompt) > MAX_PROMPT:
            self._json(400, {"error": {"message": f"prompt has {len(prompt)} tokens; the limit "
                                       f"is {MAX_PROMPT}", "param": "prompt",
                                       "type": "invalid_request_error"}})
            return
        n = body["max_tokens"]
        usage = body.get("stream_options", {}).get("include_usage")
        self._stream(n, "length", lambda i: {"text": f"t{i} "}, len(prompt) if usage else None)

    def _chat(self, body: dict) -> None:
        text = body["messages"][-1]["content"]
        n = min(answer_length(text), body["max_tokens"])
        self._stream(n, "length" if n == body["max_tokens"] else "stop",
                     lambda i: {"delta": {"content": f"w{i} "}}, len(text.split()))

    def _stream(self, n: int, last_reason: str, choice, prompt_tokens: int | None) -> None:
        """n streamed choices (``choice(i)`` fields each), the last with ``last_reason``, a
        usage chunk unless ``prompt_tokens`` is None, then [DONE]."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(n):
            time.sleep(TOKEN_DELAY_S)
            reason = last_reason if i == n - 1 else None
            self._event({"choices": [{"index": 0, **choice(i), "finish_reason": reason}]})
        if prompt_tokens is not None:
            self._event({"choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                  "completion_tokens": n,
                                                  "total_tokens": prompt_tokens + n}})
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _event(self, obj: dict) -> None:
        self._chunk(f"data: {json.dumps(obj)}\n\n".encode())

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def answer_length(text: str) -> int:
    """The fake model's natural answer length for a message."""
    return 2 + len(text) % 9


def start(port: int = 0) -> FakeOpenAI:
    server = FakeOpenAI(port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


if __name__ == "__main__":
    FakeOpenAI(int(sys.argv[1])).serve_forever()
