"""The per-node host-memory KV block store: ``python -m kvstore_svc``, and its client.

``pool.py`` holds the state (blocks, leases, handles, checksums; pure Python), ``shm.py`` the
shared-memory segment, ``server.py`` the gRPC service, ``metrics.py`` the Prometheus exporter,
``client.py`` the ``KVStoreClient`` a worker uses (``errors.py`` what it raises,
``transfer.py`` how it moves the bytes), and ``bench.py`` ``fastserve bench kvstore``.
"""
