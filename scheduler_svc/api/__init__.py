"""The scheduler's request-facing layer: validation and text handling."""
