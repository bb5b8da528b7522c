"""The linears' two CPU kernels and the load-time choice between them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from worker_svc.model.linear import Linear, pick_kernel, usable_kernels


def _case(out_features=48, in_features=32, bias=True):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(out_features, in_features, generator=g)
    b = torch.randn(out_features, generator=g) if bias else None
    return w, b, torch.randn(5, in_features, generator=g)


@pytest.mark.parametrize("kernel", ["blas", "onednn", "tiled"])
def test_each_kernel_computes_the_linear(kernel):
    w, b, x = _case()
    lin = Linear(w, b, kernel)
    assert lin.kernel == (kernel if kernel in usable_kernels(w) else "blas")
    torch.testing.assert_close(lin(x), F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert lin(x[:0]).shape == (0, 48)


def test_the_tiled_layout_keeps_the_plain_weight_beside_it():
    w, b, x = _case(bias=False)
    lin = Linear(w.clone(), b, "tiled")
    if "tiled" in usable_kernels(w):
        assert set(lin._layouts) == {"blas", "tiled"}
    lin.use("blas")
    assert lin.kernel == "blas" and torch.equal(lin._layouts["blas"], w)
    torch.testing.assert_close(lin(x), F.linear(x, w))


def test_auto_picks_one_kernel_for_every_linear():
    cases = [_case(o, i) for o, i in ((48, 32), (32, 48), (64, 32))]
    linears = [Linear(w, b) for w, b, _ in cases]
    chosen = pick_kernel(linears, "auto")
    assert set(chosen.replace(",", " ").replace("<=", " ").split()) <= {
        "blas", "onednn", "tiled", *map(str, (1, 2, 4, 8, 16, 32, 128))}
    assert {lin.kernel for lin in linears} == {chosen}
    for lin, (w, b, x) in zip(linears, cases):
        for rows in (1, 3, 40):  # whichever kernel the row count picks
            xr = x.repeat(8, 1)[:rows]
            torch.testing.assert_close(lin(xr), F.linear(xr, w, b), rtol=1e-5, atol=1e-5)
    assert pick_kernel(linears, "blas") == "blas"
    assert {lin.kernel for lin in linears} == {"blas"}


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_a_plan_switches_kernels_by_row_count_and_keeps_only_its_layouts():
    w, b, x = _case()
    lin = Linear(w, b)
    lin.use_plan([(2, "blas"), (8, "onednn"), (16, "onednn"), (32, "blas")])
    assert lin.kernel == "blas<=2,onednn<=16,blas"
    assert set(lin._layouts) == {"blas", "onednn"}
    for rows in (1, 2, 3, 16, 17, 40):
        xr = x.repeat(8, 1)[:rows]
        torch.testing.assert_close(lin(xr), F.linear(xr, w, b), rtol=1e-5, atol=1e-5)
    lin.use("onednn")
    assert lin.kernel == "onednn" and set(lin._layouts) == {"onednn"}
    lin.use("blas")  # the plain weight comes back from oneDNN's layout exactly
    assert torch.equal(lin._layouts["blas"], w)


def test_an_unknown_kernel_is_refused_by_name():
    with pytest.raises(ValueError, match="linear kernel must be one of auto, blas, onednn"):
        pick_kernel([Linear(torch.ones(2, 2))], "mkl")
    with pytest.raises(ValueError, match="linear kernel must be one of blas, onednn, tiled"):
        Linear(torch.ones(2, 2), kernel="fast")


class _Others:
    """``OtherWork`` with a fixed share of the cores taken by other processes."""

    share_taken = 0.0

    def share(self):
        return self.share_taken


def test_the_auto_plan_is_timed_once_per_machine_and_then_read_back(tmp_path, monkeypatch):
    from worker_svc.model import linear

    monkeypatch.setenv("FASTSERVE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(linear, "OtherWork", _Others)  # a quiet machine, whatever CI runs
    cases = [_case(o, i) for o, i in ((48, 32), (32, 48))]
    first = pick_kernel([Linear(w, b) for w, b, _ in cases], "auto")
    if len(usable_kernels(cases[0][0])) > 1:
        assert list((tmp_path / "kernels").glob("linear-plan-*.json"))

    def no_timing(*args):
        raise AssertionError("timed again")

    monkeypatch.setattr(linear, "_time_all", no_timing)
    assert pick_kernel([Linear(w, b) for w, b, _ in cases], "auto") == first


def test_the_plan_is_timed_again_when_the_native_kernels_change(tmp_path, monkeypatch):
    from worker_svc.model import linear, native

    monkeypatch.setenv("FASTSERVE_CACHE_DIR", str(tmp_path))
    lins = [Linear(*_case()[:2])]
    with_tiled = ["blas", "tiled"]
    before = linear._plan_path(lins, with_tiled)
    no_native = linear._plan_path(lins, ["blas", "onednn"])
    monkeypatch.setattr(native, "build_key", lambda: "another-build")
    assert linear._plan_path(lins, with_tiled) != before
    assert linear._plan_path(lins, ["blas", "onednn"]) == no_native  # not timed on them


def test_a_plan_timed_beside_other_work_is_timed_again_up_to_a_limit(tmp_path, monkeypatch,
                                                                       caplog):
    from worker_svc.model import linear

    monkeypatch.setenv("FASTSERVE_CACHE_DIR", str(tmp_path))
    cases = [_case(o, i) for o, i in ((48, 32), (32, 48))]
    if len(usable_kernels(cases[0][0])) == 1:
        pytest.skip("one kernel here: nothing is timed")
    timings = []
    real_time_plan = linear._time_plan

    def counted(linears, candidates):
        timings.append(1)
        return real_time_plan(linears, candidates)

    def load():
        lins = [Linear(w, b) for w, b, _ in cases]
        chosen = pick_kernel(lins, "auto")
        assert {lin.kernel for lin in lins} == {chosen}
        return len(timings)

    monkeypatch.setattr(linear, "_time_plan", counted)
    monkeypatch.setattr(linear, "OtherWork", type("Busy", (_Others,), {"share_taken": 0.5}))
    with caplog.at_level("WARNING", logger=linear.__name__):
        assert load() == 1
    assert "50%" in caplog.text and "timed again at the next start" in caplog.text
    assert load() == 2  # contended again: timed again
    monkeypatch.setattr(linear, "OtherWork", _Others)  # quiet: timed, and kept
    assert load() == 3
    assert load() == 3
    # Contended every time (the ranks of a group load together): kept after the limit.
    for path in tmp_path.glob("kernels/linear-plan-*.json"):
        path.unlink()
    monkeypatch.setattr(linear, "OtherWork", type("Busy", (_Others,), {"share_taken": 0.5}))
    for n in range(1, linear.CONTENDED_TIMINGS + 1):
        assert load() == 3 + n
    assert "kept from now on" in caplog.text
    assert load() == 3 + linear.CONTENDED_TIMINGS


def test_a_burst_of_other_work_in_one_kernels_turn_alone_counts(tmp_path, monkeypatch):
    from worker_svc.model import linear

    monkeypatch.setenv("FASTSERVE_CACHE_DIR", str(tmp_path))
    w, b, _ = _case()
    kernels = usable_kernels(w)
    if len(kernels) == 1:
        pytest.skip("one kernel here: nothing is timed")
    # Quiet but for the last kernel's turn, timed again at once: a burst that passes is not
    # counted, one that lasts is.
    shares: list[float] = []

    class Burst(_Others):
        def __init__(self):
            self.share_taken = shares.pop(0)

    monkeypatch.setattr(linear, "OtherWork", Burst)
    for again, contended in ((0.0, 0), (0.5, 1)):
        shares[:] = [0.0] * (len(kernels) - 1) + [0.5, again]
        pick_kernel([Linear(w, b)], "auto")
        assert not shares  # one measurement per kernel's turn, and one more for the last
        (path,) = tmp_path.glob("kernels/linear-plan-*.json")
        assert linear._load_plan(path)[1] == contended  # 1: to be timed again
        path.unlink()
    # Steady contention (a group's ranks loading together): the first turn is timed twice,
    # the others once.
    shares[:] = [0.5] * (len(kernels) + 1)
    pick_kernel([Linear(w, b)], "auto")
    assert not shares
