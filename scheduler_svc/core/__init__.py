"""The scheduler's pure-Python core: jobs, KV block allocation, policies, batch formation.

No torch, gRPC or Prometheus imports here: the same objects run in the service, in unit tests
with hand-built worker results, and in the simulator.
"""
