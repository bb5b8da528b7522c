"""`fastserve serve`: process supervision with stand-in children, and the real thing end to end.

The supervision tests replace the worker and scheduler commands with a small script that
prints the same ready line and logs what happens to it; the end-to-end test runs the real
services on the default model and is skipped until ``python -m scheduler_svc`` exists.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from procs import free_port

from fastserve import cli_serve
from fastserve.cli import build_parser

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAKE_CHILD = """
import signal, sys, time
name, log, mode = sys.argv[1:4]
def say(event):
    with open(log, "a") as f:
        f.write(f"{name} {event}\\n")
def on_term(signum, frame):
    say("stopped")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "stubborn" else on_term)
print(f"{name} is starting", file=sys.stderr, flush=True)
if mode == "dies":
    print("boom: no such model", file=sys.stderr)
    sys.exit(3)
say("ready")
if mode != "mute":
    print(f"{name.rstrip('0123456789')} listening on 127.0.0.1:4242")  # worker1: a worker
if mode == "crash-once":  # crashes on its first run only
    import pathlib
    marker = pathlib.Path(log + "." + name)
    mode = "ok" if marker.exists() else "crash"
    marker.touch()
deadline = time.time() + (0.5 if mode == "crash" else 60)
while time.time() < deadline:
    time.sleep(0.05)
sys.exit(1)
"""


def _scheduler_available() -> bool:
    return importlib.util.find_spec("scheduler_svc.__main__") is not None


@pytest.fixture
def fake(tmp_path):
    script = tmp_path / "fake_child.py"
    script.write_text(FAKE_CHILD)
    log = tmp_path / "events.log"
    log.touch()

    def command(name: str, mode: str = "ok") -> list[str]:
        return [sys.executable, str(script), name, str(log), mode]

    command.events = lambda: log.read_text().splitlines()
    return command


def test_start_child_returns_the_address_and_stop_child_terminates(fake):
    proc, address = cli_serve.start_child(fake("worker"), "worker listening on ", 30)
    assert address == "127.0.0.1:4242"
    assert cli_serve.stop_child(proc) == 0
    assert fake.events() == ["worker ready", "worker stopped"]


def test_start_child_reports_a_child_that_dies(fake):
    with pytest.raises(cli_serve.ChildFailed, match="code 3") as info:
        cli_serve.start_child(fake("worker", "dies"), "worker listening on ", 30, name="worker")
    assert "boom: no such model" in str(info.value) and "worker exited" in str(info.value)


def test_start_child_times_out_and_leaves_nothing_running(fake):
    with pytest.raises(cli_serve.ChildFailed, match=r"not ready after 0\.5 s"):
        cli_serve.start_child(fake("worker", "mute"), "worker listening on ", 0.5)
    assert fake.events() == ["worker ready", "worker stopped"]


def test_stop_child_kills_what_ignores_sigterm(fake):
    proc, _ = cli_serve.start_child(fake("worker", "stubborn"), "worker listening on ", 30)
    assert cli_serve.stop_child(proc, timeout=0.5) == -signal.SIGKILL


def _serve_with_fakes(monkeypatch, fake, scheduler_mode: str, argv: list[str]):
    seen: dict[str, list[str]] = {}
    real_scheduler_command = cli_serve.scheduler_command

    def scheduler_command(args, workers):
        seen["real"] = real_scheduler_command(args, workers)
        return fake("scheduler", scheduler_mode)

    monkeypatch.setattr(cli_serve, "scheduler_command", scheduler_command)
    def worker_command(args, kvstore=None, index=0):
        seen["worker_kvstore"] = kvstore
        return fake(f"worker{index}" if index else "worker")

    monkeypatch.setattr(cli_serve, "worker_command", worker_command)
    monkeypatch.setattr(cli_serve, "kvstore_command", lambda args: fake("kvstore"))
    monkeypatch.setattr(cli_serve, "http_command", lambda args, scheduler: fake("http"))
    monkeypatch.setattr("fastserve.models.resolve_model", lambda model, progress=True: model)
    args = build_parser().parse_args(["serve", *argv])
    return args.func(args), seen


def test_serve_stops_the_scheduler_then_the_worker_then_the_store_on_sigterm(monkeypatch, fake,
                                                                           capsys):
    def terminate_when_ready():
        deadline = time.monotonic() + 30
        while "scheduler ready" not in fake.events() and time.monotonic() < deadline:
            time.sleep(0.05)
        if "scheduler ready" not in fake.events():
            return  # serve failed before: a SIGTERM now would hit pytest itself
        time.sleep(0.2)  # let serve print its ready line
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_when_ready, daemon=True).start()
    code, seen = _serve_with_fakes(monkeypatch, fake, "ok",
                                   ["--port", "0", "--policy", "rtc", "--max-waiting", "8"])
    assert code == 0
    assert fake.events() == ["kvstore ready", "worker ready", "scheduler ready", "http ready",
                             "http stopped", "scheduler stopped", "worker stopped",
                             "kvstore stopped"]
    assert seen["worker_kvstore"] == "127.0.0.1:4242"
    out = capsys.readouterr().out
    assert out.startswith("FastServe ready at 127.0.0.1:4242 (policy rtc, model ")
    assert "; OpenAI API at http://127.0.0.1:4242/v1)" in out
    cmd = seen["real"]
    assert cmd[cmd.index("--workers") + 1] == "127.0.0.1:4242"
    assert cmd[cmd.index("--listen") + 1] == "127.0.0.1:0"
    assert cmd[cmd.index("--max-waiting") + 1] == "8" and "--max-batch-size" not in cmd


def test_replicas_start_a_worker_each_behind_the_one_scheduler(monkeypatch, fake):
    def terminate_when_ready():
        deadline = time.monotonic() + 30
        while "http ready" not in fake.events() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_when_ready, daemon=True).start()
    code, seen = _serve_with_fakes(monkeypatch, fake, "ok", ["--port", "0", "--replicas", "3"])
    assert code == 0
    events = fake.events()
    assert events[:5] == ["kvstore ready", "worker ready", "worker1 ready", "worker2 ready",
                          "scheduler ready"]
    cmd = seen["real"]
    assert cmd[cmd.index("--workers") + 1] == ",".join(["127.0.0.1:4242"] * 3)


def test_replicas_get_consecutive_ports_and_metrics_ports_clear_of_the_store():
    args = build_parser().parse_args(["serve", "--worker-port", "7000", "--metrics-port", "9400"])
    ports = [cli_serve.worker_command(args, None, i) for i in range(3)]
    assert [c[c.index("--listen") + 1] for c in ports] == [
        "127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"]
    assert [c[c.index("--metrics-port") + 1] for c in ports] == ["9401", "9403", "9404"]
    assert {c[c.index("--loop-ngram") + 1] for c in ports} == {"32"}
    args = build_parser().parse_args(["serve", "--loop-ngram", "0"])
    assert cli_serve.worker_command(args)[-2:] == ["--loop-ngram", "0"]
    for bad in ("-1", "x"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--loop-ngram", bad])


def test_a_group_is_t_x_p_ranks_and_only_rank_0_serves(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 12)
    args = build_parser().parse_args(["serve", "--worker-port", "7000", "--tensor-parallel", "3",
                                      "--pipeline-parallel", "2"])
    cmds = cli_serve.group_commands(args, "127.0.0.1:9000")
    assert len(cmds) == 6

    def flag(cmd, name):
        return cmd[cmd.index(name) + 1] if name in cmd else None

    assert [(flag(c, "--tensor-parallel-rank"), flag(c, "--pipeline-parallel-rank"))
            for c in cmds] == [(None, None), ("1", "0"), ("2", "0"), ("0", "1"), ("1", "1"),
                               ("2", "1")]
    assert {flag(c, "--group-address") for c in cmds} == {flag(cmds[0], "--group-address")}
    assert all(flag(c, "--pipeline-parallel-size") == "2" and flag(c, "--threads") == "2"
               for c in cmds)
    assert [("--listen" in c, "--metrics-port" in c) for c in cmds] == [(True, True)] + [
        (False, False)] * 5
    assert all(flag(c, "--kvstore") == "127.0.0.1:9000" for c in cmds)  # each rank its lease
    args = build_parser().parse_args(["serve"])
    assert cli_serve.group_commands(args) == [cli_serve.worker_command(args)]


def test_reserved_cores_give_each_worker_process_a_slice_of_its_own(monkeypatch):
    from fastserve.cpus import plan_cpus

    args = build_parser().parse_args(["serve", "--tensor-parallel", "2", "--replicas", "2",
                                      "--reserve-cpus", "2"])
    args.cpu_plan = plan_cpus(tuple(range(12)), 2, 4)
    groups = [cli_serve.group_commands(args, None, i) for i in range(2)]
    assert [[c[c.index("--cpus") + 1] for c in g] for g in groups] == [["2-4", "5-7"],
                                                                      ["8-9", "10-11"]]
    assert not any("--threads" in c for g in groups for c in g)  # one per core of --cpus
    args = build_parser().parse_args(["serve"])  # no --reserve-cpus: no binding
    args.cpu_plan = None
    assert "--cpus" not in cli_serve.group_commands(args)[0]


def test_reserving_every_core_is_refused_before_anything_starts():
    n = len(os.sched_getaffinity(0))
    out = _cli("serve", "--reserve-cpus", str(n), "--port", "0", "--metrics-port", "-1")
    assert out.returncode == 2
    assert f"--reserve-cpus {n}: " in out.stderr and f"reserve at most {n - 1}" in out.stderr
    out = _cli("serve", "--reserve-cpus", "-1", "--port", "0", "--metrics-port", "-1")
    assert out.returncode == 2 and "--reserve-cpus must not be negative" in out.stderr


def test_serve_restarts_a_child_that_dies_and_keeps_the_others(monkeypatch, fake, capsys):
    monkeypatch.setattr(cli_serve, "RESTART_BACKOFF_S", 0.05)

    def terminate_when_restarted():
        deadline = time.monotonic() + 30
        while fake.events().count("scheduler ready") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_when_restarted, daemon=True).start()
    code, _ = _serve_with_fakes(monkeypatch, fake, "crash-once", ["--port", "0"])
    assert code == 0
    assert fake.events() == ["kvstore ready", "worker ready", "scheduler ready", "http ready",
                             "scheduler ready", "http stopped", "scheduler stopped",
                             "worker stopped", "kvstore stopped"]
    err = capsys.readouterr().err
    assert "scheduler exited unexpectedly with code 1; restarting it in 0 s" in err
    assert "scheduler restarted" in err


def test_serve_gives_up_on_a_child_that_keeps_dying(monkeypatch, fake, capsys):
    monkeypatch.setattr(cli_serve, "RESTART_BACKOFF_S", 0.01)
    code, _ = _serve_with_fakes(monkeypatch, fake, "crash", ["--port", "0"])
    assert code == 1
    events = fake.events()
    assert events.count("scheduler ready") == 1 + cli_serve.RESTART_LIMIT
    assert events[-2:] == ["worker stopped", "kvstore stopped"]
    assert "scheduler died 6 times within 600 s; not restarting it again" in (
        capsys.readouterr().err)


def test_restarts_back_off_and_forget_old_deaths():
    now = [0.0]
    r = cli_serve.Restarts(limit=3, window_s=100, backoff_s=1, clock=lambda: now[0])
    assert [r.next_delay("w") for _ in range(3)] == [1, 2, 4]
    with pytest.raises(cli_serve.ChildFailed, match="w died 4 times within 100 s"):
        r.next_delay("w")
    assert r.next_delay("store") == 1  # per child
    now[0] = 150.0
    assert r.next_delay("w") == 1


def test_a_restart_listens_where_the_first_start_did():
    cmd = ["python", "-m", "worker_svc", "--listen", "127.0.0.1:0", "--model", "m"]
    assert cli_serve.pinned(cmd, "127.0.0.1:43210")[4] == "127.0.0.1:43210"
    assert cli_serve.pinned(["x"], "h:1") == ["x"]


def _children(pid: int) -> list[int]:
    found = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # fields: state, ppid, ...
            found.append(int(stat.parent.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@contextlib.contextmanager
def _serving(tmp_path, *args: str):
    """``fastserve serve ARGS`` (no metrics) for a ``with`` block, once it printed its ready
    line: the process, its stderr log (open, at its start) and the ready line. Whatever
    happens in the block (or if serve never gets ready), serve is gone after."""
    log = (tmp_path / "serve.log").open("w+")
    serve = subprocess.Popen(
        [sys.executable, "-m", "fastserve.cli", "serve", "--metrics-port", "-1", *args],
        stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
    try:
        ready: list[str] = []
        reader = threading.Thread(target=lambda: ready.append(serve.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(timeout=300)
        log.seek(0)
        if not (ready and ready[0].startswith("FastServe ready at ")):
            raise AssertionError(f"fastserve serve did not get ready:\n{log.read()[-4000:]}")
        yield serve, log, ready
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        log.close()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastserve.cli", *args], capture_output=True,
                          text=True, check=False, timeout=120, cwd=ROOT)


@pytest.mark.slow
@pytest.mark.skipif(not _scheduler_available(), reason="python -m scheduler_svc does not exist yet")
def test_serve_end_to_end(tmp_path):
    port = free_port()
    with _serving(tmp_path, "--port", str(port), "--kv-blocks", "256",
                  "--http-port", "0") as (serve, log, ready):
        address = f"127.0.0.1:{port}"
        assert address in ready[0]
        children = _children(serve.pid)
        assert len(children) == 4  # KV store, worker, scheduler, HTTP front end
        http = ready[0].split("OpenAI API at ")[1].rstrip(")\n")
        models = httpx.get(f"{http}/models", timeout=10).json()
        r = httpx.post(f"{http}/chat/completions", timeout=60, json={
            "model": models["data"][0]["id"], "max_tokens": 20, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["message"]["content"]
        # The official openai client gets what the gRPC SDK gets, token for token (greedy).
        import openai

        from fastserve.client import Client

        oai = openai.OpenAI(base_url=http, api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": "Name a colour."}]
        got = oai.chat.completions.create(model=models["data"][0]["id"], messages=msgs,
                                          max_tokens=16, temperature=0.0)
        with Client(address) as sdk:
            want = sdk.generate(messages=msgs, max_tokens=16, temperature=0.0)
        assert got.choices[0].message.content == want.text
        assert got.usage.completion_tokens == want.usage.completion_tokens
        chunks = list(oai.completions.create(model=models["data"][0]["id"], prompt="The sea",
                                             max_tokens=12, temperature=0.0, stream=True,
                                             stream_options={"include_usage": True}))
        with Client(address) as sdk:
            want = sdk.generate("The sea", max_tokens=12, temperature=0.0)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
        assert chunks[-1].usage.completion_tokens == want.usage.completion_tokens

        status = _cli("status", "--json", "--address", address)
        assert status.returncode == 0, status.stderr
        workers = json.loads(status.stdout)["workers"]
        assert [w["state"] for w in workers] == ["ready"]

        gen = _cli("generate", "What is the capital of France?", "--temperature",
                   "0", "--max-tokens", "20", "--address", address)
        assert gen.returncode == 0, gen.stderr
        assert "Paris" in gen.stdout

        # kill -9 of the worker, then of the store: serve restarts each, and answers again.
        for module in ("worker_svc", "kvstore_svc"):
            (victim,) = [pid for pid in _children(serve.pid) if module in _cmdline(pid)]
            os.kill(victim, signal.SIGKILL)
            killed = time.monotonic()
            while time.monotonic() - killed < 60:
                gen = _cli("generate", "What is the capital of France?", "--temperature",
                           "0", "--max-tokens", "20", "--address", address)
                if gen.returncode == 0:
                    break
                time.sleep(1)
            log.seek(0)
            assert gen.returncode == 0 and "Paris" in gen.stdout, log.read()[-4000:]
            print(f"{module} killed: answering again after {time.monotonic() - killed:.1f} s")
            assert serve.poll() is None
        deadline = time.monotonic() + 60  # the store comes back after its backoff
        while len(_children(serve.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
        children = _children(serve.pid)
        assert len(children) == 4, log.read()[-4000:]

        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=30) == 0
        assert not [pid for pid in children if pathlib.Path(f"/proc/{pid}").exists()]


def test_tls_dir_gives_every_child_a_certificate_of_its_own(tmp_path):
    args = build_parser().parse_args(["serve", "--tls-dir", str(tmp_path), "--insecure"])
    for role, cmd in (("kvstore", cli_serve.kvstore_command(args)),
                      ("worker", cli_serve.worker_command(args, "h:1")),
                      ("scheduler", cli_serve.scheduler_command(args, "h:2"))):
        assert cmd[cmd.index("--tls-cert") + 1] == str(tmp_path / f"{role}.pem")
        assert cmd[cmd.index("--tls-key") + 1] == str(tmp_path / f"{role}-key.pem")
        assert cmd[cmd.index("--tls-ca") + 1] == str(tmp_path / "ca.pem")
        assert "--insecure" in cmd
    http = cli_serve.http_command(args, "h:3")
    assert http[http.index("--tls-cert") + 1] == str(tmp_path / "http.pem")
    assert http[http.index("--tls-ca") + 1] == str(tmp_path / "ca.pem")
    assert http[http.index("--scheduler") + 1] == "h:3" and "--insecure" in http
    plain = build_parser().parse_args(["serve"])
    assert "--tls-cert" not in cli_serve.scheduler_command(plain, "h:2")


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "victim"), [(["--tensor-parallel", "2"],
                                                 "--tensor-parallel-rank 1"),
                                                (["--pipeline-parallel", "2"],
                                                 "--pipeline-parallel-rank 1")])
def test_serve_restarts_a_whole_worker_group_and_the_stream_goes_on(gqa_model, tmp_path, layout,
                                                                   victim):
    """The only worker group, 2 ranks (2 tensor ranks, or 2 pipeline stages): kill -9 of rank 1
    mid-stream loses the group (rank 0 exits at its next collective or hand-off); serve starts
    both ranks again and the client's stream finishes token for token as an uninterrupted one,
    without an error."""
    import grpc
    from streams import run

    from fastserve.proto import scheduler_pb2 as spb
    from fastserve.proto import scheduler_pb2_grpc

    port = free_port()
    with _serving(tmp_path, "--model", str(gqa_model), "--port", str(port),
                  "--kv-blocks", "256", "--http-port", "-1", "--no-kvstore",
                  *layout, "--predictor", "none") as (serve, log, _):
        ranks = [pid for pid in _children(serve.pid) if "worker_svc" in _cmdline(pid)]
        assert len(ranks) == 2
        (follower,) = [pid for pid in ranks if victim in _cmdline(pid)]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = scheduler_pb2_grpc.SchedulerStub(ch)
            want, _ = run(stub, "reference", tokens=600)
            killed = threading.Event()

            def kill_midway(n):
                if n >= 100 and not killed.is_set():
                    killed.set()
                    os.kill(follower, signal.SIGKILL)

            got, final = run(stub, "victim", kill_midway, tokens=600)
            assert killed.is_set()
            assert final.finish_reason == spb.FINISH_REASON_LENGTH, final.error_message
            assert got == want
            workers = stub.Status(spb.StatusRequest()).workers
            size = 2 if "--tensor-parallel" in layout else 1
            assert [(w.state, w.tensor_parallel_size, w.pipeline_parallel_size)
                    for w in workers] == [("ready", size, 3 - size)]
        log.seek(0)
        text = log.read()
        assert "restarting it with the rest of its group" in text and "worker restarted" in text
        new = [pid for pid in _children(serve.pid) if "worker_svc" in _cmdline(pid)]
        assert len(new) == 2 and not set(new) & set(ranks)
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0


def _cores(pid: int, tid: int | None = None) -> str | None:
    """The cores process ``pid`` (or its thread ``tid``) may run on; None if it is gone."""
    where = f"/proc/{pid}" + (f"/task/{tid}" if tid is not None else "")
    try:
        text = pathlib.Path(f"{where}/status").read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list in {where}/status")


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to reserve one")
def test_reserve_cpus_keeps_the_worker_on_cores_of_its_own_across_a_restart(gqa_model,
                                                                            tmp_path):
    """`--reserve-cpus 1`: the store and scheduler on the first allowed core, the worker (and
    every thread of it) on the rest, with one PyTorch thread per core; a worker killed with -9
    comes back on the same cores and serves."""
    from fastserve.client import Client

    cores = sorted(os.sched_getaffinity(0))
    reserved, rest = str(cores[0]), cli_serve.format_cpu_list(cores[1:])
    port = free_port()
    with _serving(tmp_path, "--model", str(gqa_model), "--port", str(port),
                  "--kv-blocks", "256", "--http-port", "-1", "--predictor",
                  "none", "--reserve-cpus", "1") as (serve, log, _):
        with Client(f"127.0.0.1:{port}") as c:
            want = c.generate([5, 6, 7, 8], max_tokens=8, temperature=0.0).token_ids
        for attempt in range(2):
            kids = {pid: _cmdline(pid) for pid in _children(serve.pid)}
            (worker,) = [pid for pid, cmd in kids.items() if "worker_svc" in cmd]
            assert _cores(worker) == rest
            threads = {_cores(worker, int(t)) for t in os.listdir(f"/proc/{worker}/task")}
            assert threads - {None} == {rest}  # PyTorch's and gRPC's too (None: ended since)
            assert {_cores(pid) for pid, cmd in kids.items() if "worker_svc" not in cmd} == {
                reserved}
            log.seek(0)
            assert f"on cores {rest} with {len(cores) - 1} PyTorch thread(s)" in log.read()
            if attempt:
                break
            os.kill(worker, signal.SIGKILL)
            deadline = time.monotonic() + 60
            got = None
            while time.monotonic() < deadline and got is None:
                try:
                    with Client(f"127.0.0.1:{port}") as c:
                        got = c.generate([5, 6, 7, 8], max_tokens=8, temperature=0.0).token_ids
                except Exception:  # noqa: BLE001 - not back yet
                    time.sleep(0.5)
            assert got == want
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=60) == 0
