"""FastServe: distributed LLM inference serving with token-level preemption."""

__version__ = "0.1.0"
