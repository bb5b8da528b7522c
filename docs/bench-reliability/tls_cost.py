"""What TLS costs at 32 concurrent streams: `fastserve serve` plaintext and with `--tls-dir`
(TLS to the client, mutual TLS scheduler <-> worker <-> store), the same requests, alternated
in one run (issue 13).

    python docs/bench-reliability/tls_cost.py [--rounds 2] [--tokens 64]

Each round starts each cluster, sends 32 greedy requests at once (token-id prompts, exact
lengths), and prints tokens/s and mean time to first token; then the ratios over all rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from fastserve.client import AsyncClient


async def burst(address: str, tls_ca: str | None, n: int, tokens: int) -> tuple[float, float]:
    client = AsyncClient(address, tls_ca=tls_ca)
    ttfts: list[float] = []

    async def one(i: int) -> int:
        start = time.perf_counter()
        got = 0
        async for chunk in client.stream([(7 * i + j) % 1000 + 10 for j in range(64)],
                                         max_tokens=tokens, temperature=0.0, ignore_eos=True):
            if not got and chunk.token_ids:
                ttfts.append(time.perf_counter() - start)
            got += len(chunk.token_ids)
        return got

    await one(0)  # warm-up
    ttfts.clear()
    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(n)))
    took = time.perf_counter() - start
    await client.close()
    return sum(counts) / took, statistics.mean(ttfts)


@contextlib.contextmanager
def serving(port: int, extra: list[str]) -> Iterator[str]:
    """`fastserve serve` (default model, fcfs, batch 32, ``extra`` flags) until the block ends;
    its address."""
    cmd = [sys.executable, "-m", "fastserve.cli", "serve", "--port", str(port),
           "--metrics-port", "-1", "--kv-blocks", "2048", "--policy", "fcfs",
           "--max-batch-size", "32", *extra]
    serve = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = serve.stdout.readline()
        assert line.startswith("FastServe ready"), line
        yield f"127.0.0.1:{port}"
    finally:
        serve.terminate()
        serve.wait(30)


def run(port: int, tls_dir: str | None, tokens: int) -> tuple[float, float]:
    with serving(port, ["--tls-dir", tls_dir] if tls_dir else []) as address:
        ca = f"{tls_dir}/ca.pem" if tls_dir else None
        return asyncio.run(burst(address, ca, 32, tokens))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--port", type=int, default=50241)
    args = p.parse_args()
    tls_dir = tempfile.mkdtemp(prefix="fastserve-tls-")
    plain, tls = [], []
    for r in range(args.rounds):
        for name, d, out in (("plaintext", None, plain), ("tls", tls_dir, tls)):
            tps, ttft = run(args.port, d, args.tokens)
            out.append((tps, ttft))
            print(f"round {r + 1} {name:9s} {tps:7.1f} tokens/s  mean TTFT {ttft * 1e3:7.1f} ms",
                  flush=True)
    tp = statistics.mean(t for t, _ in tls) / statistics.mean(t for t, _ in plain)
    tt = statistics.mean(t for _, t in tls) / statistics.mean(t for _, t in plain)
    print(f"TLS / plaintext: throughput {tp:.3f}x, mean TTFT {tt:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
