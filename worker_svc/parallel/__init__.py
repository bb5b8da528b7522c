"""Tensor parallelism inside a worker group: the layout, the weight shards, the ranks' link."""
