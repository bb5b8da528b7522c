"""What the OpenAI HTTP API costs beside the gRPC API at 32 concurrent streams (issue 16):
one `fastserve serve`, the same trace replayed by `fastserve bench serve` through the gRPC API
and through `--openai-url` (the HTTP front end), alternated round by round in one run.

    python docs/bench-openai/http_cost.py [--rounds 3] [--trace ../shared/traces/...]

Each round sends the trace's first 32 requests at once (exact lengths, token-id prompts,
ignore_eos, greedy; lengths divided by --length-scale) through each API; it prints each run's
throughput and mean TTFT, then HTTP / gRPC ratios over all rounds (goal: TTFT at most 1.05x,
throughput at least 0.95x).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRACE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def bench(target: list[str], args: argparse.Namespace, out: pathlib.Path) -> dict:
    cmd = [sys.executable, "-m", "fastserve.cli", "bench", "serve", *target, "--trace",
           str(args.trace), "--num-requests", "32", "--rate", "10000", "--length-scale",
           str(args.length_scale), "--max-output", str(args.max_output), "--warmup", "2",
           "--no-progress", "--json", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["summary"]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--trace", default=str(TRACE))
    p.add_argument("--length-scale", type=float, default=4.0)
    p.add_argument("--max-output", type=int, default=256)
    p.add_argument("--port", type=int, default=50261)
    p.add_argument("--http-port", type=int, default=50262)
    args = p.parse_args()
    serve = subprocess.Popen([sys.executable, "-m", "fastserve.cli", "serve", "--port",
                              str(args.port), "--http-port", str(args.http_port),
                              "--metrics-port", "-1", "--kv-blocks", "4096", "--policy",
                              "fcfs", "--max-batch-size", "32"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             cwd=ROOT)
    rows: dict[str, list[dict]] = {"grpc": [], "http": []}
    try:
        line = serve.stdout.readline()
        assert line.startswith("FastServe ready"), line
        targets = {"grpc": ["--address", f"127.0.0.1:{args.port}"],
                   "http": ["--openai-url", f"http://127.0.0.1:{args.http_port}"]}
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                order = ("grpc", "http") if r % 2 == 0 else ("http", "grpc")
                for name in order:
                    s = bench(targets[name], args, pathlib.Path(tmp) / f"{name}{r}.json")
                    assert s["num_failed"] == 0, s["failures"]
                    rows[name].append(s)
                    print(f"round {r} {name:4s}: {s['throughput_tokens_s']:7.1f} tokens/s, "
                          f"mean TTFT {s['mean_ttft_s'] * 1e3:7.1f} ms, mean JCT "
                          f"{s['mean_jct_s']:.2f} s, {s['total_output_tokens']} tokens",
                          flush=True)
    finally:
        serve.terminate()
        serve.wait(60)

    def mean(name: str, key: str) -> float:
        return statistics.mean(s[key] for s in rows[name])

    print(f"HTTP / gRPC over {args.rounds} rounds: throughput "
          f"{mean('http', 'throughput_tokens_s') / mean('grpc', 'throughput_tokens_s'):.3f}x, "
          f"mean TTFT {mean('http', 'mean_ttft_s') / mean('grpc', 'mean_ttft_s'):.3f}x, "
          f"mean JCT {mean('http', 'mean_jct_s') / mean('grpc', 'mean_jct_s'):.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
