"""Llama-family forward pass over a paged KV pool."""
