"""`fastserve bench kvstore`: the store's copy bandwidth against a plain memory copy.

Starts a store process and times, over the same blocks (by default 256 SmolLM2-135M KV
blocks: 30 layers x K,V x 16 tokens x 3 KV heads x 64 dims x 4 bytes = 737,280 bytes):

- memcpy: torch ``copy_`` between two preallocated CPU tensors, the ceiling (and the same
  bytes through one thread's numpy ``copyto``, for scale);
- shm write / read: ``KVStoreClient.write`` (copy into the slots, checksums, one Seal RPC) and
  ``read`` (one GetChecksums RPC, copy out, verify), the same-node path a worker uses;
- shm copy only: the same copies into and out of the slots without checksums or RPCs;
- grpc write / read: the cross-node path, here over loopback.

Each figure is the best of ``--repeats`` timed runs after one warm-up; GB/s is 1e9 bytes/s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

SMOLLM2_135M_BLOCK_BYTES = 30 * 2 * 16 * 3 * 64 * 4


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kvstore", help="KV store copy bandwidth (shm and gRPC) vs memcpy")
    p.add_argument("--block-bytes", type=int, default=SMOLLM2_135M_BLOCK_BYTES,
                   help=f"bytes per block (default {SMOLLM2_135M_BLOCK_BYTES}: one SmolLM2-135M "
                        "fp32 block of 16 tokens)")
    p.add_argument("--blocks", type=int, default=256, help="blocks per transfer")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per case; the best is kept")
    p.add_argument("--copy-threads", type=int, default=2,
                   help="the client's copy threads (KVStoreClient copy_threads)")
    p.add_argument("--skip-grpc", action="store_true", help="time only the same-node path")
    p.add_argument("--json", default=None, metavar="OUT", help="write the figures as JSON")
    p.set_defaults(func=run)


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: page faults, connections, thread pools
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(address: str, args: argparse.Namespace, bar) -> dict[str, float]:
    """Seconds per transfer of every case, against the store at ``address``."""
    import numpy as np
    import torch

    from kvstore_svc.client import KVStoreClient
    from kvstore_svc.transfer import copy_blocks

    n, bb, repeats = args.blocks, args.block_bytes, args.repeats
    src = torch.randint(0, 256, (n, bb), dtype=torch.uint8)
    dst = torch.empty_like(src)
    seconds: dict[str, float] = {}

    def case(name: str, fn: Callable[[], object]) -> None:
        bar.set_description(name)
        seconds[name] = best_seconds(fn, repeats)
        bar.update()

    case("memcpy (torch copy_)", lambda: dst.copy_(src))
    case("memcpy (numpy, 1 thread)", lambda: np.copyto(dst.numpy(), src.numpy()))
    with KVStoreClient(address, client_id="bench-shm", block_bytes=bb,
                       copy_threads=args.copy_threads) as shm:
        if not shm.same_node:
            raise SystemExit("the store's shared memory cannot be mapped here; nothing to time")
        handles = shm.allocate(job_key=1, n=n)
        case("shm write + checksums", lambda: shm.write(handles, src))
        case("shm read + verify", lambda: shm.read(handles, dst))
        assert torch.equal(dst, src), "shm read returned other bytes"
        slots = [v.numpy() for v in shm.views(handles)]
        rows, out = list(src.numpy()), list(dst.numpy())
        with ThreadPoolExecutor(args.copy_threads) as pool:
            case("shm write, copy only", lambda: copy_blocks(slots, rows, pool, args.copy_threads,
                                                             checksum=False))
            case("shm read, copy only", lambda: copy_blocks(out, slots, pool, args.copy_threads,
                                                            checksum=False))
    if not args.skip_grpc:
        with KVStoreClient(address, client_id="bench-grpc", block_bytes=bb,
                           prefer_shm=False) as remote:
            handles = remote.allocate(job_key=1, n=n)
            case("grpc write", lambda: remote.write(handles, src))
            case("grpc read", lambda: remote.read(handles, dst))
            assert torch.equal(dst, src), "grpc read returned other bytes"
    return seconds


def report(seconds: dict[str, float], num_bytes: int, config: dict) -> tuple[str, dict]:
    """The table to print, and the figures for --json."""
    base = num_bytes / seconds["memcpy (torch copy_)"]
    lines = [(f"kvstore: {config['blocks']} blocks x {config['block_bytes']} bytes "
             f"({num_bytes / 1e6:.1f} MB), best of {config['repeats']}, copy threads "
             f"{config['copy_threads']}, torch threads {config['torch_threads']}"),
             f"{'case':<28}{'GB/s':>8}{'vs memcpy':>11}{'ms':>9}"]
    figures = {}
    for name, s in seconds.items():
        rate = num_bytes / s
        figures[name] = {"seconds": s, "gb_per_s": rate / 1e9, "ratio_to_memcpy": rate / base}
        lines.append(f"{name:<28}{rate / 1e9:>8.2f}{rate / base:>10.2f}x{s * 1e3:>9.1f}")
    return "\n".join(lines), figures


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm.auto import tqdm

    from fastserve.cli_serve import start_child, stop_child

    if min(args.block_bytes, args.blocks, args.repeats, args.copy_threads) < 1:
        raise SystemExit("--block-bytes, --blocks, --repeats and --copy-threads must be >= 1")
    num_bytes = args.blocks * args.block_bytes
    # Room for the shm and the gRPC client's blocks at once.
    store, address = start_child(
        [sys.executable, "-m", "kvstore_svc", "--listen", "127.0.0.1:0", "--budget-bytes",
         str(2 * num_bytes), "--block-bytes", str(args.block_bytes), "--log-level", "WARNING"],
        "kvstore listening on ", 60, name="kvstore")
    try:
        with tqdm(total=6 if args.skip_grpc else 8, file=sys.stderr, unit="case") as bar:
            seconds = measure(address, args, bar)
    finally:
        stop_child(store)
    config = {"block_bytes": args.block_bytes, "blocks": args.blocks, "repeats": args.repeats,
              "copy_threads": args.copy_threads, "torch_threads": torch.get_num_threads(),
              "torch": torch.__version__}
    table, figures = report(seconds, num_bytes, config)
    print(table, flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(json.dumps({"config": config, "results": figures}, indent=2) + "\n")
    return 0
