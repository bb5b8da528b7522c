"""Offline training of the output-length predictor (``fastserve predictor train``)."""
