"""A 3.9 MB prompt sent while four streams decode: how fast it is refused, and whether the
streams keep their pace (issue 13). Starts `fastserve serve` with the default model.

    python docs/bench-reliability/big_prompt.py [--port 50231] [--sender process|thread]
        [--sender-nice 19] [--reserve-cpus 1] [--bytes 3900000]

Prints the refusal time and, per stream, the median and largest gap between its chunks, the
largest as a multiple of the median iteration.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

from fastserve.client import Client


def send_big(address: str, size: int = 3_900_000) -> tuple[str, float]:
    """Send a prompt of ``size`` bytes; what came back and how long it took (s)."""
    prompt = "x" * size
    with Client(address) as c:
        start = time.perf_counter()
        try:
            c.generate(prompt, max_tokens=5)
            refused = "not refused"
        except Exception as e:  # noqa: BLE001 - reported
            refused = f"{type(e).__name__}: {str(e)[:90]}"
        return refused, time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=50231)
    p.add_argument("--sender", choices=("thread", "process"), default="thread",
                   help="send the big prompt from a thread of the process that reads the streams "
                        "(default) or from a process of its own, started before")
    p.add_argument("--sender-nice", type=int, default=0,
                   help="with --sender process: its niceness (19 stands in for a sender on "
                        "another host, whose CPU is not the worker's)")
    p.add_argument("--reserve-cpus", type=int, default=0,
                   help="`fastserve serve --reserve-cpus`: the worker on cores of its own")
    p.add_argument("--bytes", type=int, default=3_900_000, help="the prompt's size in bytes")
    p.add_argument("--send-only", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.send_only:
        os.nice(args.sender_nice)
        sys.stdin.readline()
        refused, took = send_big(args.send_only, args.bytes)
        print(f"{refused}\t{took}")
        return 0
    serve = subprocess.Popen([sys.executable, "-m", "fastserve.cli", "serve", "--port",
                              str(args.port), "--metrics-port", "-1", "--no-kvstore",
                              "--policy", "fcfs", "--reserve-cpus", str(args.reserve_cpus)],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = serve.stdout.readline()
        assert line.startswith("FastServe ready"), line
        address = f"127.0.0.1:{args.port}"
        gaps: dict[int, list[float]] = {}
        sent_at: list[float] = []

        def stream(i: int) -> None:
            with Client(address) as c:
                last, out = None, []
                for _ in c.stream("Tell me a long story about the sea.", max_tokens=200,
                                  temperature=0.0, ignore_eos=True):
                    now = time.perf_counter()
                    if last is not None:
                        out.append((now, now - last))
                    last = now
                gaps[i] = out

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        sender = None
        if args.sender == "process":
            # Another user: its own process, so building and sending 3.9 MB does not hold
            # the interpreter lock of the process that reads the four streams, and runs beside
            # it on the other core. Started now and told when to send, so its interpreter's
            # start-up is not measured.
            sender = subprocess.Popen([sys.executable, __file__, "--send-only", address,
                                       "--sender-nice", str(args.sender_nice),
                                       "--bytes", str(args.bytes)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        time.sleep(3.0)  # the streams are decoding
        start = time.perf_counter()
        if sender is None:
            refused, took = send_big(address, args.bytes)
        else:
            out, _ = sender.communicate("go\n", timeout=60)
            refused, took_s = out.rsplit("\t", 1)
            took = float(took_s)
        sent_at.append(start)
        for t in threads:
            t.join()
        print(f"{args.bytes / 1e6:g} MB prompt: {refused} in {took * 1e3:.1f} ms")
        for i, out in sorted(gaps.items()):
            g = [d for _, d in out]
            near = [d for at, d in out if abs(at - sent_at[0]) < 2.0]
            med = statistics.median(g)
            print(f"stream {i}: median gap {med * 1e3:.1f} ms, largest {max(g) * 1e3:.1f} ms "
                  f"({max(g) / med:.2f}x); within 2 s of the big prompt largest "
                  f"{max(near) * 1e3:.1f} ms ({max(near) / med:.2f}x)")
    finally:
        serve.terminate()
        serve.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
