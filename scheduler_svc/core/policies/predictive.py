"""Shortest predicted remaining output first, with attained service as the safety net.

| rule        | what happens                                                                 |
|-------------|------------------------------------------------------------------------------|
| rank        | predicted output tokens still to come, fewest first (SRPT on predictions)     |
| wrong guess | a job past its prediction, or with none, ranks by the tokens it has made     |
|             | (least attained service, as an MLFQ approximates): the longer it has run,   |
|             | the longer it is likely to run, so an underestimated job sinks               |
| starvation  | a job that has not run for starve_limit x (1 + remaining / 16) x             |
|             | 2^(times promoted) goes to the front until it runs (the MLFQ's promotion,    |
|             | with the same backoff, and a wait that grows with the job's predicted size)  |
| ties        | less prefill left first (a job already running before a new one), then       |
|             | arrival order: at equal remaining output, the oracle's own tie-break         |
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.job import Job
from scheduler_svc.core.policies.base import Policy, register
from scheduler_svc.core.policies.starvation import StarvationClock

# Predicted output tokens per starvation limit a job may wait: its limit is
# ``starve_limit x (1 + remaining / STARVE_TOKENS)``. A fixed limit for every job undid the
# shortest-first order under load (the long jobs it promotes are the ones SRPT holds back): 248
# ms mean latency per token against 145 ms with this scaling and 142 ms with no starvation
# prevention at all (1,000 Azure conversations, 3 req/s, prediction sigma 0.75); the wait of a
# long job stays bounded, in proportion to its size.
STARVE_TOKENS = 16


class Predictive(Policy):
    name = "predictive"

    def __init__(self, config: SchedulerConfig, cost_model: CostModel | None = None):
        super().__init__(config, cost_model)
        self._jobs: dict[int, Job] = {}
        self._boosted: set[int] = set()  # promoted for starving, until they run
        self.starvation = StarvationClock(config.starve_limit_s)

    @staticmethod
    def remaining(job: Job) -> float:
        """Predicted output tokens still to come (see the module doc)."""
        made = len(job.output)
        predicted = job.predicted_output_tokens
        if predicted is None or predicted <= made:
            return float(made)
        return predicted - made

    def _touch(self, job: Job, now: float) -> None:
        self.starvation.touch(job.job_id, now, 1.0 + self.remaining(job) / STARVE_TOKENS)

    def add(self, job: Job, now: float) -> None:
        self._jobs[job.job_id] = job
        self._touch(job, now)

    def remove(self, job: Job) -> None:
        jid = job.job_id
        if self._jobs.pop(jid, None) is not None:
            self._boosted.discard(jid)
            self.starvation.forget(jid)

    def order(self, now: float) -> Iterable[Job]:
        for jid in self.starvation.starving(now):
            if jid in self._boosted:
                continue  # already at the front
            self._boosted.add(jid)
            self.starvation.promoted(jid)
            self.num_promotions += 1
        boosted, remaining = self._boosted, self.remaining
        # The tie-break matters: with exact predictions it took the mean latency per token
        # from 179 to 142 ms (1,000 Azure conversations at 3 req/s), the oracle's figure.
        return sorted(self._jobs.values(),
                      key=lambda j: (j.job_id not in boosted, remaining(j), j.num_pending,
                                     j.job_id))

    def on_iteration(self, ran: list[Job], elapsed_s: float, now: float) -> None:
        for job in ran:
            if job.job_id in self._jobs:
                self._boosted.discard(job.job_id)
                self._touch(job, now)

    def queues(self) -> list[tuple[str, int]]:
        return [("starving", len(self._boosted)),
                ("ranked", len(self._jobs) - len(self._boosted))]


register(Predictive)
