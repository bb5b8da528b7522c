"""Scheduling policies by name: ``POLICIES`` and ``make_policy``.

Importing the package imports every policy module, each registering its classes, so the
registry is complete for anyone who imports it; the modules import only ``base`` (and
``starvation``, the deadlines the promoting policies share, and ``ranked``, the key-ordered
job set the ranking ones keep).
"""

from scheduler_svc.core.policies import fcfs, mlfq, predictive, priority  # noqa: F401
from scheduler_svc.core.policies.base import POLICIES, Policy, make_policy, register

__all__ = ["POLICIES", "Policy", "make_policy", "register"]
