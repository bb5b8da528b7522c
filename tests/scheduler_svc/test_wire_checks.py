"""What a worker answers is checked before the scheduler believes it (issue 13, item 7)."""

from __future__ import annotations

import pytest

from fastserve.proto import worker_pb2 as wpb
from scheduler_svc.core.contract import Command, StepPlan, StepResult, TokenResult
from scheduler_svc.wire import BadWorkerReply, check_describe, check_result

GOOD = {"num_blocks": 64, "block_size": 16, "max_context": 2048, "vocab_size": 1000,
        "eos_token_ids": [2]}


def test_a_sound_describe_passes():
    check_describe(wpb.DescribeResponse(**GOOD))


@pytest.mark.parametrize("field,value", [("num_blocks", 0), ("block_size", 0),
                                         ("max_context", 1), ("vocab_size", 0),
                                         ("eos_token_ids", [5000])])
def test_a_describe_no_core_can_use_is_refused_naming_the_field(field, value):
    with pytest.raises(BadWorkerReply, match=field):
        check_describe(wpb.DescribeResponse(**{**GOOD, field: value}))


def plan():
    return StepPlan(step_id=7, commands=[Command(1, 1, []), Command(2, 4, [])])


def test_a_sound_result_passes():
    check_result(plan(), StepResult([TokenResult(1, 10, 5), TokenResult(2, 4, None)]), 1000)


@pytest.mark.parametrize("results,words", [
    ([TokenResult(3, 1, 5)], "did not command"),
    ([TokenResult(1, 10, 5), TokenResult(1, 11, 6)], "twice"),
    ([TokenResult(1, 10, 1000)], "outside [0, 1000)"),
    ([TokenResult(1, 10, -1)], "outside"),
    ([TokenResult(2, -4, None)], "num_computed"),
])
def test_a_result_that_breaks_the_protocol_is_refused(results, words):
    with pytest.raises(BadWorkerReply) as e:
        check_result(plan(), StepResult(results), 1000)
    assert words in str(e.value) and "step 7" in str(e.value)
