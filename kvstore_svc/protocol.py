"""What the KV store and its clients agree on besides the protos: message sizes and the
trailer that says a lease is gone. Both ``server.py`` and ``client.py`` import it, so the
client does not import the server."""

from __future__ import annotations

# Data moves in chunks of at most this size, well under the message limit below (set
# explicitly on both ends, since gRPC's default receive limit is 4 MiB).
CHUNK_BYTES = 1 << 20
MAX_MESSAGE_BYTES = 8 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# Trailing metadata on the NOT_FOUND that tells a client its lease is gone (register again),
# as opposed to a handle it does not hold.
ERROR_KEY = "fastserve-kvstore-error"
LEASE_UNKNOWN = "lease-unknown"
