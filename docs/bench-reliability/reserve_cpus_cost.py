"""What `fastserve serve --reserve-cpus 1` costs in throughput: the worker on the cores left
after one is kept for the scheduler, store and HTTP API (on a 2-core machine, one core and one
PyTorch thread) against the default (two threads on any core), the same requests at 1, 8 and
32 concurrent streams, alternated in one run (issue 13).

    python docs/bench-reliability/reserve_cpus_cost.py [--rounds 2] [--tokens 64] [--streams 1,8,32]

Each round starts each cluster once and sends each burst (greedy, token-id prompts of 64
tokens, exact lengths, after one warm-up request); it prints tokens/s and mean time to first
token, then the ratios over all rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tls_cost import burst, serving  # the same cluster and burst as the TLS comparison


def run(port: int, reserve: int, streams: list[int], tokens: int) -> dict[int, tuple[float, float]]:
    with serving(port, ["--http-port", "-1", "--reserve-cpus", str(reserve)]) as address:
        return {n: asyncio.run(burst(address, None, n, tokens)) for n in streams}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--streams", default="1,8,32")
    p.add_argument("--port", type=int, default=50251)
    args = p.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    got: dict[int, list[dict[int, tuple[float, float]]]] = {0: [], 1: []}
    for r in range(args.rounds):
        for reserve in (0, 1):
            res = run(args.port, reserve, streams, args.tokens)
            got[reserve].append(res)
            for n, (tps, ttft) in res.items():
                print(f"round {r + 1} reserve {reserve} {n:3d} streams {tps:7.1f} tokens/s  "
                      f"mean TTFT {ttft * 1e3:7.1f} ms", flush=True)
    for n in streams:
        tp = (statistics.mean(x[n][0] for x in got[1])
              / statistics.mean(x[n][0] for x in got[0]))
        tt = (statistics.mean(x[n][1] for x in got[1])
              / statistics.mean(x[n][1] for x in got[0]))
        print(f"{n} streams, reserve 1 / reserve 0: throughput {tp:.3f}x, mean TTFT {tt:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
