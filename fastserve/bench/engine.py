"""`fastserve bench engine`: this engine against transformers generate()."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engine", help="decode and prefill throughput vs transformers")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise SystemExit("not yet implemented")
