"""Predicted iteration times, from a worker's profile or from published constants.

The same object serves skip-join placement and quanta in the scheduler, and the clock of the
simulator, so a policy is evaluated in simulation with the costs it is scheduled with.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, replace

# Bytes of one activation value (FP16): what a tensor-parallel all-reduce and a pipeline
# hand-off move per token and hidden unit.
ACTIVATION_BYTES = 2


def _interp(points: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear through ``points`` (sorted by x), extrapolated linearly at both ends."""
    xs = [p[0] for p in points]
    if len(points) == 1:
        return points[0][1] * max(x, 1.0) / max(xs[0], 1.0)
    i = min(max(bisect.bisect_left(xs, x), 1), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return max(y, 0.0)


@dataclass(frozen=True)
class Interconnect:
    """What splitting a model over devices costs in communication, per crossing.

    Tensor parallelism (Megatron-LM's layout) ends each layer's attention and each layer's MLP
    in an all-reduce of the layer's output among the T ranks: 2 per layer per iteration. A
    ring all-reduce takes 2(T - 1) steps and each rank sends 2(T - 1)/T of the bytes; the
    fixed part is what every all-reduce costs whatever T (launch and synchronisation, and the
    per-layer work that does not shrink with T). Pipeline parallelism hands a batch's
    activations from each stage to the next, and the last stage's tokens back to the first.
    """

    allreduce_fixed_s: float
    allreduce_step_s: float
    allreduce_bytes_per_s: float
    stage_hop_s: float  # one hand-off between stages, whatever its size
    stage_bytes_per_s: float

    def allreduce_time(self, tensor_parallel: int, num_bytes: float) -> float:
        if tensor_parallel <= 1:
            return 0.0
        steps = 2 * (tensor_parallel - 1)
        return (self.allreduce_fixed_s + steps * self.allreduce_step_s
                + steps / tensor_parallel * num_bytes / self.allreduce_bytes_per_s)

    def hop_time(self, num_bytes: float) -> float:
        return self.stage_hop_s + num_bytes / self.stage_bytes_per_s


@dataclass(frozen=True)
class CostModel:
    """Iteration time as a function of the work in it.

    ``decode``: (batch size, seconds) for iterations of one token per job;
    ``prefill``: (prompt tokens, seconds) for one job's prompt in one iteration.
    A mixed iteration costs its prefill tokens' prefill time plus its decode jobs' decode time
    less one iteration's fixed cost (the weights are read once per iteration).

    A model split over a group of ``tensor_parallel`` x ``pipeline_parallel`` devices
    (``split()``) keeps the same interface: every time is a batch's latency through the whole
    group, and ``stage_time()`` is the part one pipeline stage holds it for.
    """

    decode: tuple[tuple[float, float], ...]
    prefill: tuple[tuple[float, float], ...]
    name: str = "profile"
    source: str = ""
    # KV swaps between the device and the node's KV store: bytes of KV per token (all layers,
    # keys and values) and the copy bandwidth one way. 0 = swaps cost nothing.
    kv_bytes_per_token: int = 0
    swap_bytes_per_s: float = 0.0
    # The model's shape and the links between its devices, for split(); 0 / None: unknown
    # (a worker's profile), so the model cannot be split.
    num_layers: int = 0
    hidden_size: int = 0
    interconnect: Interconnect | None = None
    # The group these times are for (split() sets them).
    tensor_parallel: int = 1
    pipeline_parallel: int = 1

    def __post_init__(self) -> None:
        for label, pts in (("decode", self.decode), ("prefill", self.prefill)):
            if not pts:
                raise ValueError(f"cost model needs at least one {label} point")
            if any(b[0] <= a[0] for a, b in itertools.pairwise(pts)):
                raise ValueError(f"cost model {label} points must have increasing sizes: {pts}")
            if any(t <= 0 for _, t in pts):
                raise ValueError(f"cost model {label} times must be > 0: {pts}")

    @property
    def min_iteration_time(self) -> float:
        """One decode iteration at batch 1: the quantum of the highest-priority queue."""
        return self.decode_time(1)

    def decode_time(self, batch_size: int) -> float:
        return _interp(self.decode, batch_size)

    def prefill_time(self, num_tokens: int) -> float:
        return _interp(self.prefill, num_tokens)

    def prefill_tokens_within(self, seconds: float, limit: int) -> int:
        """The most tokens, up to ``limit``, whose prefill takes at most ``seconds`` (by
        bisection on ``prefill_time``, which rises with the tokens); -1 if ``limit`` tokens
        take no longer than that."""
        if self.prefill_time(limit) <= seconds:
            return -1
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.prefill_time(mid) <= seconds:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def iteration_time(self, num_decodes: int, prefill_tokens: int) -> float:
        """An iteration with ``num_decodes`` one-token jobs and ``prefill_tokens`` others."""
        if prefill_tokens <= 0:
            return self.decode_time(max(num_decodes, 1))
        t = self.prefill_time(prefill_tokens)
        if num_decodes > 0:
            # prefill_time(1) is an iteration's fixed cost, already paid by the prefill.
            t += max(self.decode_time(num_decodes) - self.prefill_time(1), 0.0)
        return t

    def stage_time(self, num_decodes: int, prefill_tokens: int) -> float:
        """How long one pipeline stage holds such an iteration: the stages are equal (the
        layers are split evenly, each stage sends one hand-off), so a stage takes 1/P of the
        latency, and a pipeline full of batches finishes one every stage time."""
        return self.iteration_time(num_decodes, prefill_tokens) / self.pipeline_parallel

    def split(self, tensor_parallel: int, pipeline_parallel: int) -> CostModel:
        """This model on a group of ``tensor_parallel`` x ``pipeline_parallel`` devices of the
        kind its times are for; (1, 1) is the model itself.

        Every table point of b tokens (decode batch size, prefill tokens) becomes
            t / T + 2 L x allreduce(T, B) + (P - 1) x hop(B) + hop(0),  B = b x H x 2 bytes
        the compute divided among all T x P devices (each stage computes L / P layers on T
        ranks: t / (T P) a stage, t / T through P stages), two all-reduces per layer, and
        the hand-offs between stages plus the tokens' return to the first. Each device copies
        its own share of a job's KV over its own host link, so swaps go T x P times as fast.
        """
        t, p = tensor_parallel, pipeline_parallel
        if t < 1 or p < 1:
            raise ValueError(f"tensor_parallel and pipeline_parallel must be >= 1, got {t}, {p}")
        if (t, p) == (1, 1):
            return self
        if (self.tensor_parallel, self.pipeline_parallel) != (1, 1):
            raise ValueError(f"cost model {self.name!r} is already split; split the "
                             "one-device model")
        link = self.interconnect
        if link is None or self.num_layers < 1 or self.hidden_size < 1:
            raise ValueError(f"cost model {self.name!r} has no model shape and interconnect "
                             "to split it by (a worker's profile is of its own group)")
        if p > self.num_layers:
            raise ValueError(f"pipeline_parallel must be <= the model's {self.num_layers} "
                             f"layers, got {p}")
        if self.hidden_size % t:
            raise ValueError(f"tensor_parallel must divide the hidden size {self.hidden_size}, "
                             f"got {t}")
        token_bytes = ACTIVATION_BYTES * self.hidden_size

        def group(points: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
            out = []
            for tokens, seconds in points:
                nbytes = tokens * token_bytes
                comm = 2 * self.num_layers * link.allreduce_time(t, nbytes)
                if p > 1:
                    comm += (p - 1) * link.hop_time(nbytes) + link.hop_time(0)
                out.append((tokens, seconds / t + comm))
            return tuple(out)

        return replace(self, decode=group(self.decode), prefill=group(self.prefill),
                       name=f"{self.name}-tp{t}pp{p}", tensor_parallel=t, pipeline_parallel=p,
                       swap_bytes_per_s=self.swap_bytes_per_s * t * p)

    def swap_time(self, num_blocks: int, block_size: int) -> float:
        """Seconds to copy ``num_blocks`` KV blocks one way between device and store."""
        if self.swap_bytes_per_s <= 0:
            return 0.0
        return num_blocks * block_size * self.kv_bytes_per_token / self.swap_bytes_per_s

    @classmethod
    def from_profile(cls, decode: list[tuple[int, float]], prefill: list[tuple[int, float]],
                     name: str = "profile") -> CostModel:
        return cls(tuple(sorted((float(b), t) for b, t in decode)),
                   tuple(sorted((float(n), t) for n, t in prefill)), name=name)


# Links of A100 servers, for split().
# - All-reduce (NVLink 3 within a node): the fixed and per-step costs are fitted to
#   FasterTransformer's GPT-20B table (NVIDIA/FasterTransformer docs/gpt_guide.md, "Performance
#   of GPT-20B": 44 layers, batch 1, input 20, output 8, on 8 x A100-80GB with NVSwitch:
#   225 / 147 / 102 / 89 ms on 1 / 2 / 4 / 8-way TP). Taking 8 forward passes (the context
#   pass samples the first token) of 2 x 44 all-reduces each, the latency above 225 ms / T is
#   49 / 65 / 86 us per all-reduce at T = 2 / 4 / 8; a least-squares line in the ring's
#   2(T - 1) steps gives 44 us + 3.1 us a step (it reproduces the table within 2%,
#   tests/scheduler_svc/test_sim_parallel.py). The bytes go at 240 GB/s: 80% of NVLink 3's
#   300 GB/s each way per A100 (600 GB/s in all, NVIDIA A100 datasheet); at batch 1 they
#   are negligible, for a 512-token prefill of OPT-175B ~0.1 ms an all-reduce.
# - Stage hand-offs (across nodes, FASTSERVE.md section 4): one HDR InfiniBand NIC per GPU
#   (200 Gb/s, the SuperPod setup of FasterTransformer's figures) at 80%: 20 GB/s; 30 us a
#   hand-off is assumed (an NCCL send/receive with its launch), not fitted: no published
#   figure here isolates it, and it is under 0.1% of a stage at these model sizes.
A100_LINKS = Interconnect(allreduce_fixed_s=44e-6, allreduce_step_s=3.1e-6,
                          allreduce_bytes_per_s=240e9, stage_hop_s=30e-6,
                          stage_bytes_per_s=20e9)


def _kv_bytes_per_token(num_layers: int, hidden_size: int) -> int:
    """Keys and values of every layer, FP16 (OPT has no grouped-query attention)."""
    return 2 * num_layers * hidden_size * 2


def _layer_params(num_layers: int, hidden_size: int) -> int:
    """A decoder's weights but the embeddings: 12 H^2 a layer (4 H^2 attention, 8 H^2 MLP)."""
    return 12 * num_layers * hidden_size * hidden_size


# OPT-13B on one A100-80GB (FP16), as reported for FasterTransformer-class engines: a decode
# iteration ~24 ms at batch 1 rising to ~38 ms at batch 32 (memory-bound), and prefill
# ~0.16 ms per token (compute-bound, ~26 TFLOP/s effective on 2 x 13e9 FLOP per token).
# Sources: the FastServe paper's setup (arXiv 2305.05920, section 6: OPT-13B, one A100) and
# the Orca / vLLM papers' OPT-13B latency figures; see docs/benchmarks.md.
OPT_13B_A100 = CostModel(
    decode=((1, 0.024), (8, 0.026), (16, 0.029), (32, 0.038), (64, 0.055), (128, 0.090)),
    prefill=((1, 0.024), (128, 0.040), (512, 0.090), (1024, 0.170), (2048, 0.340)),
    name="opt-13b-a100",
    source=("FastServe (arXiv 2305.05920) setup; Orca (OSDI'22) and vLLM (SOSP'23) OPT-13B "
            "latencies"),
    # 2 (K, V) x 40 layers x 5120 hidden x 2 bytes (FP16); PCIe 4.0 x16 host copies from
    # pinned memory at ~25 GB/s.
    kv_bytes_per_token=_kv_bytes_per_token(40, 5120),
    swap_bytes_per_s=25e9,
    num_layers=40,  # OPT-13B (Zhang et al. 2022, arXiv 2205.01068, table 1)
    hidden_size=5120,
    interconnect=A100_LINKS,
)


def _scaled(num_layers: int, hidden_size: int, name: str, source: str) -> CostModel:
    """OPT-13B's A100 times scaled to a larger OPT by its weights, as if it fitted on one
    A100: a decode iteration reads every weight once (memory-bound) and a prefill token
    costs 2 FLOP per weight (compute-bound), so both grow with the weights. Only meant to be
    split() over the devices it needs. Checked against FasterTransformer's GPT-175B figures
    (same shape as OPT-175B) in tests/scheduler_svc/test_sim_parallel.py."""
    k = _layer_params(num_layers, hidden_size) / _layer_params(40, 5120)
    base = OPT_13B_A100
    return replace(base, decode=tuple((b, s * k) for b, s in base.decode),
                   prefill=tuple((n, s * k) for n, s in base.prefill), name=name,
                   source=source, kv_bytes_per_token=_kv_bytes_per_token(num_layers, hidden_size),
                   num_layers=num_layers, hidden_size=hidden_size)


# OPT-66B (64 layers, hidden 9216) and OPT-175B (96 layers, hidden 12288; OPT paper table 1):
# 5.18x and 13.8x OPT-13B's layer weights. Published settings: vLLM (SOSP'23, table 1) serves
# OPT-66B on 4 A100s and OPT-175B on 8 A100-80GB, tensor-parallel (split(4, 1), split(8, 1));
# FasterTransformer's GPT-175B figures are on 8 A100-80GB, TP 8.
OPT_66B_A100 = _scaled(64, 9216, "opt-66b-a100",
                       "OPT-13B/A100 scaled by weights; vLLM (SOSP'23) setting: 4 x A100")
OPT_175B_A100 = _scaled(96, 12288, "opt-175b-a100",
                        "OPT-13B/A100 scaled by weights; FasterTransformer GPT-175B and vLLM "
                        "(SOSP'23) setting: 8 x A100-80GB")

PUBLISHED = {m.name: m for m in (OPT_13B_A100, OPT_66B_A100, OPT_175B_A100)}
