"""The scheduler's settings: one frozen, validated dataclass with documented defaults."""

from __future__ import annotations

from dataclasses import dataclass

KV_POLICIES = ("proactive", "reactive", "recompute", "defer")


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "fcfs"
    # Jobs in one iteration at most.
    max_batch_size: int = 64
    # Tokens computed in one iteration at most (prefill chunks plus one per decode): bounds the
    # iteration time, so a long prompt is prefilled over several iterations.
    max_batched_tokens: int = 512
    # Admitted jobs that have not started yet; beyond this Generate is refused at once.
    max_waiting: int = 1024
    # max_tokens when the request does not say.
    default_max_tokens: int = 256
    # Free KV blocks kept back from new jobs, as a fraction of the pool, so running jobs can
    # still grow by a block without preempting anyone.
    watermark: float = 0.01
    # Multi-level feedback queue (skip-join-mlfq, mlfq): number of queues; each queue's quantum
    # is `mlfq_ratio` times the one above; Q1's is the worker's minimal iteration time (one
    # decode at batch 1, from its profile) unless `mlfq_q1_quantum_s` sets it.
    mlfq_num_queues: int = 8
    mlfq_ratio: float = 2.0
    mlfq_q1_quantum_s: float | None = None
    # A job that has not run for this long is promoted to Q1 (starvation prevention). The
    # FastServe authors' code uses 3 s; lower it for tighter tail latency.
    starve_limit_s: float = 3.0
    # What happens to the KV of paused jobs when device blocks run short (FastServe section 3):
    # "proactive": offload the jobs with the largest Estimated Next Scheduled Time to the
    #   node's KV store ahead of need, keep a headroom of free blocks, and upload the jobs
    #   about to run one iteration before they run, overlapped with compute;
    # "reactive": swap a paused job out only when a higher-priority job needs its blocks, and
    #   back in at the moment it is scheduled (the copy sits on the critical path);
    # "recompute": drop a paused job's KV when a higher-priority job needs its blocks, and
    #   prefill its prompt and output again when it next runs;
    # "defer": paused jobs keep their KV; a new job waits for free blocks (vLLM-like).
    # Without a KV store, "proactive" and "reactive" keep paused jobs' KV as "defer" does.
    # Under every policy, when nothing at all can run, the oldest job takes the blocks of the
    # newest (offloaded when a store has room, else dropped), so the system never deadlocks.
    kv_policy: str = "proactive"
    # Proactive headroom: free device blocks kept for arrivals, sized as the blocks of the
    # prompts admitted in the last `kv_headroom_window_s`, capped at `kv_headroom_max` of the pool.
    kv_headroom_window_s: float = 1.0
    kv_headroom_max: float = 0.25

    def __post_init__(self) -> None:
        def check(name: str, ok: bool, limit: str) -> None:
            if not ok:
                raise ValueError(f"scheduler {name} must be {limit}, got {getattr(self, name)!r}")

        check("max_batch_size", self.max_batch_size >= 1, ">= 1")
        check("max_batched_tokens", self.max_batched_tokens >= 1, ">= 1")
        check("max_waiting", self.max_waiting >= 0, ">= 0")
        check("default_max_tokens", self.default_max_tokens >= 1, ">= 1")
        check("watermark", 0.0 <= self.watermark < 1.0, "in [0, 1)")
        check("mlfq_num_queues", 1 <= self.mlfq_num_queues <= 64, "in [1, 64]")
        check("mlfq_ratio", self.mlfq_ratio > 1.0, "> 1")
        check("mlfq_q1_quantum_s", self.mlfq_q1_quantum_s is None or self.mlfq_q1_quantum_s > 0,
              "> 0 (or unset)")
        check("starve_limit_s", self.starve_limit_s > 0, "> 0")
        check("kv_policy", self.kv_policy in KV_POLICIES, f"one of {', '.join(KV_POLICIES)}")
        check("kv_headroom_window_s", self.kv_headroom_window_s >= 0, ">= 0")
        check("kv_headroom_max", 0.0 <= self.kv_headroom_max < 1.0, "in [0, 1)")
