"""Benchmark commands (`fastserve bench ...`): each prints its figures and can write JSON."""
