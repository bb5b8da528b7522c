"""The sampler alone, as it is against the sampler as it was at ``--ref`` (a git commit):
``sample()`` on b rows of 49,152 synthetic logits (a few peaked tokens over noise), every
row greedy, or at top-p 0.9 with temperature 0.2 or 1.0, alternated twice; ms per call, and
whether the two drew the same tokens:

    python docs/bench-sampler/sampler_alone.py --ref fe14102
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from same_tokens import load_ref


def main() -> int:
    import torch

    from worker_svc import sampler

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", required=True, help="git commit whose sampler to compare with")
    p.add_argument("--calls", type=int, default=200)
    args = p.parse_args()
    ref = load_ref(args.ref)
    torch.manual_seed(0)
    for b in (1, 8):
        logits = torch.randn(b, 49152) * 3
        logits[:, :5] += 25
        for temperature in (0.0, 0.2, 1.0):
            times: dict[str, list[float]] = {"now": [], args.ref: []}
            drawn = {}
            for _ in range(2):
                for name, mod in (("now", sampler), (args.ref, ref)):
                    params = [mod.SamplingParams(temperature=temperature, top_p=0.9, seed=i)
                              for i in range(b)]  # temperature 0: greedy
                    drawn[name] = mod.sample(logits, params, [3] * b, list(range(b)))[0]
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        mod.sample(logits, params, [3] * b, list(range(b)))
                    times[name].append((time.perf_counter() - t0) / args.calls * 1e3)
            print(f"{b} rows, temperature {temperature}: " + " | ".join(
                f"{name}: {' / '.join(f'{t:.3f}' for t in ts)} ms" for name, ts in times.items())
                + f" | same tokens: {drawn['now'] == drawn[args.ref]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
