"""The FastServe scheduler service: client API, scheduling core, per-worker iteration loops."""
