"""The `fastserve` command line.

Each command group lives in its own module and registers itself here; output meant for the user
goes to stdout, progress and logs to stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys


def _model_pull(args: argparse.Namespace) -> int:
    from fastserve.models import pull_default_model

    path = pull_default_model(progress=True)
    print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastserve", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="INFO", help="logging level (stderr)")
    sub = parser.add_subparsers(dest="command", required=True)
    from fastserve import cli_client, cli_serve

    cli_serve.add_parser(sub)
    cli_client.add_parsers(sub)
    from fastserve import cli_sim

    cli_sim.add_parser(sub)
    from fastserve.predictor import cli as cli_predictor

    cli_predictor.add_parser(sub)

    model = sub.add_parser("model", help="manage model weights")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    pull = model_sub.add_parser("pull", help="download and convert the default model (once)")
    pull.set_defaults(func=_model_pull)

    bench = sub.add_parser("bench", help="benchmarks that print figures")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    from fastserve.bench import breakdown as bench_breakdown
    from fastserve.bench import compare as bench_compare
    from fastserve.bench import engine as bench_engine
    from fastserve.bench import kvstore as bench_kvstore
    from fastserve.bench import overhead as bench_overhead
    from fastserve.bench import parallel as bench_parallel
    from fastserve.bench import serve as bench_serve

    bench_engine.add_parser(bench_sub)
    bench_overhead.add_parser(bench_sub)
    bench_serve.add_parser(bench_sub)
    bench_compare.add_parser(bench_sub)
    bench_breakdown.add_parser(bench_sub)
    bench_kvstore.add_parser(bench_sub)
    bench_parallel.add_parser(bench_sub)
    return parser


def _command(argv: list[str]) -> str | None:
    """The command named in ``argv`` (its first word that is not an option's)."""
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


def main(argv: list[str] | None = None) -> int:
    """The `fastserve` command (``argv`` None: this process's arguments). As a command,
    ``fastserve sim`` runs the scheduler core compiled (scheduler_svc/compiled.py), set up
    before anything imports it; a caller that passes ``argv`` keeps the modules it has."""
    if argv is None and _command(sys.argv[1:]) == "sim":
        from scheduler_svc import compiled

        compiled.activate()
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
