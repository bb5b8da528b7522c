"""The scheduler's settings: one frozen, validated dataclass with documented defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KV_POLICIES = ("proactive", "reactive", "recompute", "defer")


def setting(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:
    """A field with its documentation: ``help`` (and ``choices``, when the values are a fixed
    set) are the command lines' for it; ``scheduler_svc/config_args.py`` reads them."""
    metadata: dict[str, Any] = {"help": help}
    if choices is not None:
        metadata["choices"] = choices
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class SchedulerConfig:
    """Every setting of the scheduler. A new setting is one field here: the command lines
    (``python -m scheduler_svc``, ``fastserve serve``, ``fastserve sim``) take each field as
    an option named after it (``--max-batch-size``; a trailing ``_s``, seconds, is dropped:
    ``--starve-limit``), typed, defaulted and documented by the field."""

    policy: str = setting("fcfs", "scheduling policy: the order in which jobs get into a batch")
    max_batch_size: int = setting(64, "jobs in one iteration at most")
    max_batched_tokens: int = setting(
        512, "tokens computed in one iteration at most (prefill chunks plus one per decode): "
        "bounds the iteration time, so a long prompt is prefilled over several iterations")
    max_waiting: int = setting(
        1024, "admitted jobs that have not started yet; beyond this Generate is refused at once")
    default_max_tokens: int = setting(256, "max_tokens when the request does not say")
    worker_loss_wait_s: float = setting(
        120.0, "how long the jobs of a lost worker wait for a worker to take them (another, "
        "or the same one back) before they fail with UNAVAILABLE; with another ready they "
        "move at once")
    steps_in_flight: int | None = setting(
        None, "Steps a worker group may have in flight at once (unset: one per pipeline stage "
        "of the group, as its Describe says; 1 keeps a pipeline to one batch at a time)")
    watermark: float = setting(
        0.01, "free KV blocks kept back from new jobs, as a fraction of the pool, so running "
        "jobs can still grow by a block without preempting anyone")
    mlfq_num_queues: int = setting(
        8, "multi-level feedback queue (skip-join-mlfq, mlfq): number of queues")
    mlfq_ratio: float = setting(
        2.0, "MLFQ: each queue's quantum is this many times the one above")
    mlfq_q1_quantum_s: float | None = setting(
        None, "MLFQ: Q1's quantum in seconds, or none for the worker's minimal iteration time "
        "(one decode at batch 1, from its profile)")
    starve_limit_s: float = setting(
        3.0, "MLFQ: seconds without running before a job is promoted to Q1 (starvation "
        "prevention; the FastServe authors' code uses 3 s, lower it for tighter tail latency); "
        "doubled for each promotion the job has had")
    starve_tokens: float = setting(
        4.0, "predictive: a job may wait starve_limit x (1 + predicted output tokens left / "
        "this) before it is promoted, so the wait a wrong guess can cost grows with the job's "
        "predicted size; lower lets long jobs wait longer behind short ones (a lower mean "
        "latency under bursts, a longer tail), higher brings the MLFQ's fixed limit nearer")
    priority_aging_s: float = setting(
        100.0, "fixed-priority: seconds of waiting worth halving a prompt: a job that arrives "
        "t seconds after another goes first only with a prompt under 2^-(t / this) times as "
        "long, so under overload long prompts do not wait behind every shorter one that "
        "comes later and end up in a drain few to a batch; 0: pure shortest prompt first")
    predictive_aging_s: float = setting(
        0.0, "predictive: seconds of waiting worth halving a job's predicted output left: a "
        "job that arrives t seconds after another goes first only if predicted to have under "
        "2^-(t / this) times as much left, which bounds how long later, shorter jobs keep "
        "passing one (the tail), at some cost to the mean where predictions are good; its "
        "scale is the cluster's (a few times one job's run); 0: off")
    displace_running_ratio: float = setting(
        8.0, "predictive, srpt-oracle: a new job ranked first that finds no free blocks may "
        "take them from a started job ranked below it even when that job would run in this "
        "Step (offloaded to the store, or dropped under the recompute KV policy), if that "
        "job's remaining work (predicted output tokens left) is at least this many times the "
        "new job's, as SRPT preempts for a much shorter job: long prompts then stop waiting for "
        "blocks that shorter ones keep taking, for a lower mean latency per token under "
        "bursts; the ratio keeps mispredictions from trading jobs of about the same size. "
        "0: new jobs take blocks from paused jobs only")
    kv_policy: str = setting(
        "proactive", "what happens to the KV of paused jobs when device blocks run short "
        "(FastServe section 3): 'proactive' offloads the jobs with the largest Estimated Next "
        "Scheduled Time to the node's KV store ahead of need, keeps a headroom of free blocks "
        "and uploads the jobs about to run one iteration before they run, overlapped with "
        "compute; 'reactive' swaps a paused job out only when a higher-priority job needs its "
        "blocks, and back in when it is scheduled (the copy on the critical path); "
        "'recompute' drops a paused job's KV when a higher-priority job needs its blocks and "
        "prefills its prompt and output again when it next runs; 'defer' keeps paused jobs' "
        "KV and lets a new job wait for free blocks (vLLM-like). Without a KV store, "
        "proactive and reactive keep paused jobs' KV as defer does. Under every policy, when "
        "nothing at all can run, the oldest job takes the blocks of the newest (offloaded "
        "when a store has room, else dropped), so the system never deadlocks",
        choices=KV_POLICIES)
    kv_headroom_window_s: float = setting(
        1.0, "proactive KV policy: free device blocks are kept for arrivals, as many as the "
        "prompts admitted in the last this many seconds take")
    kv_headroom_max: float = setting(
        0.25, "proactive KV policy: the headroom is at most this fraction of the pool")
    kv_recompute_budget: float = setting(
        0.01, "recompute KV policy: new jobs may drop paused jobs' KV for their blocks only "
        "while computing the dropped tokens again takes at most this fraction of the group's "
        "compute time so far (by the cost model; without one, while the tokens dropped are at "
        "most this fraction of the prompt tokens prefilled); beyond it they wait for free "
        "blocks, as under defer, so recomputation costs a bounded share of the device")
    kv_growth_reserve: int = setting(
        3, "blocks per job holding KV on the device that a new job must leave free when it "
        "starts, under a policy whose arrivals preempt while paused jobs' KV has nowhere to go "
        "(a KV policy that does not swap, or a store that cannot take a holder's mean KV): "
        "started jobs then have room to grow instead of being recomputed by the last resort; "
        "0: only the watermark")
    kv_memory_bound_iterations: int = setting(
        256, "with kv_growth_reserve on, for this many iterations after one whose batch had a "
        "free slot and a started job short of blocks, a new job whose start pauses a started "
        "one (the batch is full of jobs holding KV) and whose paused KV has nowhere to go "
        "leaves free blocks for the mean KV of every job holding KV that the batch cannot "
        "take, so paused KV does not take the blocks the batch needs; outside it, for one such "
        "job; 0: always one")
    arrival_probe_tokens: int = setting(
        128, "predictive: a job that waits for room is estimated before its prefill from its "
        "prompt's last this-many tokens (the worker runs them up to its predictor's layer, no "
        "KV kept), so a burst's waiting jobs are ranked by predicted size; 0: a job is "
        "estimated only with its first token. Probe tokens per iteration are at most "
        "max_batched_tokens")

    def __post_init__(self) -> None:
        def check(name: str, ok: bool, limit: str) -> None:
            if not ok:
                raise ValueError(f"scheduler {name} must be {limit}, got {getattr(self, name)!r}")

        check("max_batch_size", self.max_batch_size >= 1, ">= 1")
        check("max_batched_tokens", self.max_batched_tokens >= 1, ">= 1")
        check("max_waiting", self.max_waiting >= 0, ">= 0")
        check("default_max_tokens", self.default_max_tokens >= 1, ">= 1")
        check("worker_loss_wait_s", self.worker_loss_wait_s >= 0, ">= 0")
        check("steps_in_flight", self.steps_in_flight is None or self.steps_in_flight >= 1,
              ">= 1 (or unset)")
        check("watermark", 0.0 <= self.watermark < 1.0, "in [0, 1)")
        check("mlfq_num_queues", 1 <= self.mlfq_num_queues <= 64, "in [1, 64]")
        check("mlfq_ratio", self.mlfq_ratio > 1.0, "> 1")
        check("mlfq_q1_quantum_s", self.mlfq_q1_quantum_s is None or self.mlfq_q1_quantum_s > 0,
              "> 0 (or unset)")
        check("starve_limit_s", self.starve_limit_s > 0, "> 0")
        check("starve_tokens", self.starve_tokens > 0, "> 0")
        check("priority_aging_s", self.priority_aging_s >= 0, ">= 0")
        check("predictive_aging_s", self.predictive_aging_s >= 0, ">= 0")
        check("displace_running_ratio", self.displace_running_ratio >= 0, ">= 0")
        check("kv_policy", self.kv_policy in KV_POLICIES, f"one of {', '.join(KV_POLICIES)}")
        check("kv_headroom_window_s", self.kv_headroom_window_s >= 0, ">= 0")
        check("kv_headroom_max", 0.0 <= self.kv_headroom_max < 1.0, "in [0, 1)")
        check("kv_recompute_budget", self.kv_recompute_budget >= 0, ">= 0")
        check("kv_growth_reserve", self.kv_growth_reserve >= 0, ">= 0")
        check("kv_memory_bound_iterations", self.kv_memory_bound_iterations >= 0, ">= 0")
        check("arrival_probe_tokens", 0 <= self.arrival_probe_tokens <= 65536, "in [0, 65536]")
