"""A worker group whose two ranks (two tensor ranks, or two pipeline stages) run on two hosts
(network namespaces on a bridge, tests/netns.py): greedy parity holds over the real network,
and cutting the link between them gets the group declared lost within a bounded time while its
jobs finish on another group."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import grpc
import netns
import pytest
from procs import ServiceProcess, start_scheduler, start_worker
from test_e2e_tensor_parallel import all_streams, reference

from fastserve.proto import scheduler_pb2 as spb
from fastserve.proto import scheduler_pb2_grpc

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not netns.available(), reason="needs root and iproute2")]

GROUP_TIMEOUT_S = 5


LAYOUTS = {"tensor": (["--tensor-parallel-size", "2"], ["--tensor-parallel-rank", "1"]),
           "pipeline": (["--pipeline-parallel-size", "2"], ["--pipeline-parallel-rank", "1"])}


@pytest.mark.parametrize("split", list(LAYOUTS))
def test_a_group_across_two_hosts_matches_and_a_cut_link_moves_its_jobs(gqa_model, tmp_path,
                                                                       split):
    layout, second_rank = LAYOUTS[split]
    hosts = netns.Hosts(2)
    procs: list[ServiceProcess] = []
    try:
        common = ["--model", str(gqa_model), "--num-blocks", "512", "--threads", "1",
                  *layout, "--group-address",
                  f"{hosts.address(0)}:29500", "--group-timeout-s", str(GROUP_TIMEOUT_S),
                  "--insecure"]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            ranks = [pool.submit(ServiceProcess, "worker_svc",
                                 [*common, "--listen", f"{hosts.address(0)}:0"],
                                 "worker listening on", tmp_path / "rank0.log",
                                 prefix=hosts.exec_prefix(0)),
                     pool.submit(ServiceProcess, "worker_svc",
                                 [*common, *second_rank], "worker rank",
                                 tmp_path / "rank1.log", prefix=hosts.exec_prefix(1))]
            group = [r.result() for r in ranks]
        procs += group
        if split == "tensor":
            assert "all-reduce over gloo" in group[0].log()  # two hosts: no shared memory
        other = start_worker(str(gqa_model), tmp_path, 512, "other")
        procs.append(other)
        sched = start_scheduler(str(gqa_model), [group[0].address, other.address], tmp_path,
                                "--max-batch-size", "16", "--insecure")
        procs.append(sched)
        prompts = [[400 + 17 * i + k for k in range(25 + 6 * i)] for i in range(8)]
        tokens = 250
        want = reference(gqa_model, prompts, tokens)
        with grpc.insecure_channel(sched.address) as ch:
            stub = scheduler_pb2_grpc.SchedulerStub(ch)
            first = all_streams(stub, "a", prompts, tokens)
            assert [r[0] for r in first] == want  # across the hosts, token for token
            served = {w.address: w.num_iterations for w in stub.Status(spb.StatusRequest()).workers}
            assert served[group[0].address] > 0, "the two-host group served nothing"

            cut_at: list[float] = []
            progress = [0] * len(prompts)

            def on_chunk(i, n):
                progress[i] = n
                if min(progress) >= 50 and not cut_at:
                    cut_at.append(time.monotonic())
                    hosts.cut(1)

            lost_after: list[float] = []

            def watch():
                deadline = time.monotonic() + 300
                while not lost_after and time.monotonic() < deadline:
                    if cut_at:
                        states = {w.address: w.state
                                  for w in stub.Status(spb.StatusRequest()).workers}
                        if states[group[0].address] != "ready":
                            lost_after.append(time.monotonic() - cut_at[0])
                    time.sleep(0.1)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            second = all_streams(stub, "b", prompts, tokens, on_chunk)
            watcher.join(60)
            assert cut_at
            for i, (got, final, _) in enumerate(second):
                assert final is not None and final.finish_reason == spb.FINISH_REASON_LENGTH, \
                    (i, got if isinstance(got, Exception) else final.error_message)
                assert got == want[i], f"stream {i} differs after the link was cut"
            assert lost_after and lost_after[0] < 3 * GROUP_TIMEOUT_S, lost_after
            print(f"group declared lost {lost_after[0]:.1f} s after the cut; longest pause a "
                  f"client saw: {max(r[2] for r in second):.2f} s")
        # Both ranks gave up on the group by themselves: rank 1, cut off, hears no command
        # (not even a heartbeat) within its wait, whatever it was doing at the cut.
        assert group[0].proc.wait(30) == 75 and group[1].proc.wait(60) == 75
    finally:
        for p in reversed(procs):
            p.stop()
        hosts.close()
