"""A soak at a steady mixed load (issue 13): memory, file descriptors and KV blocks of every
process sampled while users stream, cancel, disconnect and send bad input for ``--minutes``.

    python docs/bench-reliability/soak.py [--minutes 30] [--every 30] [--users 6] \
        [--out docs/bench-reliability/soak.txt] [--plot docs/img/soak.png] \
        [--serve-arg=--kv-blocks=40 ...]

Starts `fastserve serve` (default model, with its KV store; each ``--serve-arg`` is passed on,
e.g. a small ``--kv-blocks`` so that preempted jobs' blocks go to the store). Each user loops
over requests drawn from ../shared/prompts (chat, greedy or sampled, 8 to 96 tokens):
  finish    read to the end: expect finish "length" or "stop"
  cancel    Cancel by id after a few chunks: expect finish "cancelled"
  disconnect close the stream after a few chunks: the client sees no final message
  bad       a request with one invalid field: expect InvalidArgument naming it
Every ``--probe`` seconds (default 1) each process's RSS is read; every ``--every`` seconds a
line gives each process's RSS at that moment (MB), the lowest RSS seen since the last line (its
floor) and open fds, the worker's and the store's used blocks, and the preemptions, swaps,
recomputations and requests so far. At the end, with the load stopped and the cluster idle, it
prints each process's RSS slope after the warm-up (least squares, MB per 10 minutes) of the
floors and of the momentary samples, whether every block came back, and every outcome that was
not the expected one.

Why the floor: under load the worker's RSS moves by ~15 MB from one moment to the next with the
shape of the batch in flight (activations freed after each step), so 30-second snapshots have
a residual of ~5 MB and a 25-minute slope of them a standard error of ~1 MB per 10 minutes, as
large as the goal. Memory that is kept (a leak) raises every moment's RSS, the lowest of a
window's included; memory freed within a step does not raise the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import pathlib
import random
import subprocess
import sys
import time

from fastserve.client import AsyncClient
from fastserve.errors import InvalidArgument

PROMPTS = pathlib.Path(__file__).resolve().parents[3] / "shared" / "prompts" / \
    "instructions.jsonl"
KINDS = (("finish", 6), ("cancel", 2), ("disconnect", 2), ("bad", 1))
BAD = (  # (field the error must name, options)
    ("temperature", {"temperature": -1.0}),
    ("max_tokens", {"max_tokens": 10**9}),
    ("request_id", {"request_id": "x" * 300}),
    ("stop", {"stop": [""]}),
    ("top_p", {"top_p": 2.0}),
)


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def role(pid: int) -> str:
    cmd = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    for name in (b"scheduler_svc", b"worker_svc", b"kvstore_svc"):
        if name in cmd:
            return name.decode().removesuffix("_svc")
    return "serve"


def rss_mb(pid: int) -> float:
    rss_kb = next(int(line.split()[1]) for line in
                  pathlib.Path(f"/proc/{pid}/status").read_text().splitlines()
                  if line.startswith("VmRSS:"))
    return rss_kb / 1024


def open_fds(pid: int) -> int:
    return len(list(pathlib.Path(f"/proc/{pid}/fd").iterdir()))


class Load:
    def __init__(self, client: AsyncClient, prompts: list[str], seed: int):
        self.client = client
        self.prompts = prompts
        self.rng = random.Random(seed)
        self.counts: collections.Counter[str] = collections.Counter()
        self.unexpected: list[str] = []
        self.stopping = False

    async def user(self) -> None:
        kinds, weights = zip(*KINDS, strict=True)
        while not self.stopping:
            kind = self.rng.choices(kinds, weights)[0]
            try:
                await getattr(self, kind)()
                self.counts[kind] += 1
            except Exception as e:  # noqa: BLE001 - every surprise is reported
                self.unexpected.append(f"{kind}: {type(e).__name__}: {e}"[:200])

    def _options(self) -> dict:
        greedy = self.rng.random() < 0.5
        return {"messages": [{"role": "user", "content": self.rng.choice(self.prompts)}],
                "max_tokens": self.rng.randint(8, 96),
                "temperature": 0.0 if greedy else 0.8, "seed": self.rng.randint(0, 10**6)}

    async def finish(self) -> None:
        stream = self.client.stream(**self._options())
        async for _ in stream:
            pass
        c = stream.completion
        if c is None or c.finish_reason not in ("length", "stop"):
            self.unexpected.append(f"finish: ended {c and c.finish_reason}: {c and c.error}")

    async def cancel(self) -> None:
        stream = self.client.stream(**{**self._options(), "max_tokens": 96})
        n, cancelled = 0, False
        async for _ in stream:
            n += 1
            if n == 3 and not cancelled:
                cancelled = await self.client.cancel(stream.request_id)
        c = stream.completion
        if not cancelled and c is not None and c.finish_reason in ("length", "stop"):
            return  # it finished before the cancel reached it: expected too
        if c is None or c.finish_reason != "cancelled":
            self.unexpected.append(f"cancel: ended {c and c.finish_reason} "
                                   f"(cancel found it: {cancelled})")

    async def disconnect(self) -> None:
        stream = self.client.stream(**self._options())
        n = 0
        async for _ in stream:
            n += 1
            if n == 2:
                stream.close()
        if stream.completion is not None and n >= 2:
            self.unexpected.append("disconnect: a final message after close")

    async def bad(self) -> None:
        field, opts = self.rng.choice(BAD)
        try:
            await self.client.generate(**{**self._options(), **opts})
        except InvalidArgument as e:
            if field not in e.details:
                self.unexpected.append(f"bad {field}: message does not name it: {e.details}")
            return
        self.unexpected.append(f"bad {field}: accepted")


class Floors:
    """The lowest RSS of each process since the last ``take``, read every ``probe`` seconds."""

    def __init__(self, pids: dict[str, int]):
        self.pids = pids
        self.low: dict[str, float] = {}

    def probe(self) -> dict[str, float]:
        now = {name: rss_mb(pid) for name, pid in self.pids.items()}
        for name, rss in now.items():
            self.low[name] = min(rss, self.low.get(name, rss))
        return now

    def take(self) -> tuple[dict[str, float], dict[str, float]]:
        """Each process's RSS now, and its lowest since the last take (now's included)."""
        now = self.probe()
        low, self.low = self.low, {}
        return now, low

    async def run(self, every: float) -> None:
        while True:
            self.probe()
            await asyncio.sleep(every)


def slope_mb_per_10min(points: list[tuple[float, float]]) -> float:
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 0.0 if var == 0 else sum((t - mt) * (v - mv) for t, v in points) / var * 600


async def soak(args: argparse.Namespace, address: str, pids: dict[str, int],
               out) -> dict[str, list]:
    prompts = [json.loads(line)["instruction"] for line in PROMPTS.read_text().splitlines()]
    client = AsyncClient(address)
    load = Load(client, prompts, args.seed)
    series: dict[str, list] = collections.defaultdict(list)
    floors = Floors(pids)

    async def sample(t: float, phase: str) -> None:
        status = await client.status()
        w = status["workers"][0]
        parts = []
        now, low = floors.take()
        for name, pid in pids.items():
            rss, fds = now[name], open_fds(pid)
            series[name].append((t, rss, fds, low[name]))
            parts.append(f"{name} {rss:7.1f} MB (floor {low[name]:7.1f}) {fds:3d} fd")
        series["blocks"].append((t, w["num_used_blocks"], w["store_used_blocks"]))
        done = sum(load.counts.values())
        line = (f"{t / 60:6.1f} min {phase:5s} | " + " | ".join(parts) +
                f" | blocks {w['num_used_blocks']:4d} store {w['store_used_blocks']:5d}"
                f" | preempted {w['num_preemptions']} swaps out {w['num_swap_outs']}"
                f" in {w['num_swap_ins']} recomputed {w['num_recomputes']}"
                f" | requests {done} unexpected {len(load.unexpected)}")
        print(line, file=out, flush=True)
        print(line, file=sys.stderr, flush=True)

    start = time.monotonic()
    prober = asyncio.create_task(floors.run(args.probe))
    users = [asyncio.create_task(load.user()) for _ in range(args.users)]
    while (t := time.monotonic() - start) < args.minutes * 60:
        await sample(t, "load")
        await asyncio.sleep(args.every)
    load.stopping = True
    await asyncio.gather(*users)
    for _ in range(60):  # idle: every block should come back
        st = (await client.status())["workers"][0]
        if st["num_used_blocks"] == 0 and st["store_used_blocks"] == 0:
            break
        await asyncio.sleep(1)
    await sample(time.monotonic() - start, "idle")
    prober.cancel()
    await client.close()
    print(f"\nrequests: {dict(load.counts)}; unexpected outcomes: {len(load.unexpected)}",
          file=out)
    for u in load.unexpected[:20]:
        print(f"  {u}", file=out)
    warm = args.warmup * 60
    print(f"RSS slope after {args.warmup} min of warm-up under load (MB per 10 min; goal under 1),"
          " of the floors and of the momentary samples:", file=out)
    for name in pids:
        load_pts = [p for p in series[name][:-1] if p[0] >= warm]  # the last is at idle
        floor = slope_mb_per_10min([(t, low) for t, _, _, low in load_pts])
        moment = slope_mb_per_10min([(t, rss) for t, rss, _, _ in load_pts])
        fds = [f for t, _, f, _ in series[name] if t >= warm]
        print(f"  {name:9s} floor {floor:+6.2f}, momentary {moment:+6.2f} MB/10 min; "
              f"fds {min(fds)}..{max(fds)}", file=out)
    last = series["blocks"][-1]
    print(f"blocks at idle: worker {last[1]}, store {last[2]}", file=out)
    return series


def plot(series: dict[str, list], path: str, pids: dict[str, int]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for name in pids:
        pts = series[name]
        line, = a.plot([t / 60 for t, *_ in pts], [r - pts[0][1] for _, r, _, _ in pts],
                       alpha=0.4, label=f"{name} (momentary)")
        a.plot([t / 60 for t, *_ in pts], [low - pts[0][1] for *_, low in pts],
               color=line.get_color(), label=f"{name} (floor)")
    a.set_ylabel("RSS change (MB)")
    a.legend(fontsize="small", ncol=2)
    pts = series["blocks"]
    b.plot([t / 60 for t, _, _ in pts], [x for _, x, _ in pts], label="worker blocks used")
    b.plot([t / 60 for t, _, _ in pts], [x for _, _, x in pts], label="store blocks used")
    b.set_xlabel("minutes")
    b.legend()
    fig.suptitle("Soak at a steady mixed load")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--every", type=float, default=30)
    p.add_argument("--probe", type=float, default=1.0,
                   help="seconds between the RSS reads that give each line's floor")
    p.add_argument("--warmup", type=float, default=5, help="minutes left out of the slope")
    p.add_argument("--users", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=50251)
    p.add_argument("--serve-arg", action="append", default=[],
                   help="one more argument for fastserve serve (repeat for more)")
    p.add_argument("--out", default=None)
    p.add_argument("--plot", default=None)
    args = p.parse_args()
    serve = subprocess.Popen([sys.executable, "-m", "fastserve.cli", "serve", "--port",
                              str(args.port), "--metrics-port", "-1", *args.serve_arg],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = open(args.out, "w") if args.out else sys.stdout  # noqa: SIM115 - closed below
    try:
        line = serve.stdout.readline()
        assert line.startswith("FastServe ready"), line
        pids = {"serve": serve.pid}
        for c in children(serve.pid):
            pids[role(c)] = c
        series = asyncio.run(soak(args, f"127.0.0.1:{args.port}", pids, out))
        if args.plot:
            plot(series, args.plot, pids)
    finally:
        serve.terminate()
        serve.wait(60)
        if out is not sys.stdout:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
