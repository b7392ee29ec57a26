"""Functional collectives (what DTensor's redistributions and FSDP2 trace to) lower to extern
calls, and the schedule issues a collective as early as its inputs allow and waits for it as
late as its readers allow, so communication overlaps independent compute; a collective's
input is never lent to a later buffer while it may still be read (collective_order.py).
Run on a one-rank gloo group, so the collectives really run."""

from __future__ import annotations

import kiln_loopir as K
import pytest
import torch
from kiln_loopir.collective_order import COLLECTIVES
from kiln_loopir.ir import ExternKernel
from kiln_loopir.lowering import counters
from torch.fx.experimental.proxy_tensor import make_fx

c10d = torch.ops._c10d_functional


@pytest.fixture(scope="module")
def group():
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield dist.group.WORLD.group_name
    if owned:
        dist.destroy_process_group()


def _steps(sched) -> list[str]:
    """The schedule as 'all_reduce' / 'wait_tensor' / 'compute' steps."""
    out = []
    for s in sched.steps:
        kernel = getattr(s, "kernel", None)
        out.append(kernel.op.__name__.split(".")[0] if isinstance(kernel, ExternKernel)
                   else "compute")
    return out


def test_all_reduce_overlaps_independent_compute(group):
    def f(x, y, w):
        a = x.sin() * 2
        r = c10d.wait_tensor(c10d.all_reduce(a, "sum", group))  # traced back to back
        b = (y.cos() + 1).sum(0)  # needs no communication
        m = y @ w  # an extern call: crossed too
        return r + b, m

    x, y, w = torch.randn(8, 16), torch.randn(8, 16), torch.randn(16, 4)
    gm = make_fx(f)(x, y, w)
    before = sum(counters["aten_fallbacks"].values())
    sched = K.schedule(K.lower(gm, [x, y, w]))
    assert sum(counters["aten_fallbacks"].values()) == before  # externs by design
    order = _steps(sched)
    ar, wait = order.index("all_reduce"), order.index("wait_tensor")
    assert "compute" in order[ar + 1:wait], order  # y's compute runs while a is reduced
    assert "mm" in order[ar + 1:wait], order
    for got, want in zip(K.interpret(sched)(x, y, w), f(x, y, w), strict=True):
        torch.testing.assert_close(got, want)


def test_collectives_keep_their_order_and_reducer_input_is_not_reused(group):
    def f(x):
        a = x.exp()
        g1 = c10d.all_gather_into_tensor(a, 1, group)
        r = c10d.all_reduce(x * 3, "sum", group)
        c = (x + 1).tanh()  # could reuse a's storage once a's last reader ran
        return c10d.wait_tensor(g1) + c10d.wait_tensor(r) + c

    x = torch.randn(4, 8)
    sched = K.schedule(K.lower(make_fx(f)(x), [x]))
    order = [s for s in _steps(sched) if s != "compute"]
    assert order.index("all_gather_into_tensor") < order.index("all_reduce")
    read_by_collectives = {nm for s in sched.steps
                           if isinstance(getattr(s, "kernel", None), ExternKernel)
                           and s.kernel.op in COLLECTIVES for nm in s.kernel.input_buffers()}
    reused = {a.reuses for s in sched.steps for a in getattr(s, "allocations", None) or []
              if a.reuses is not None}
    assert read_by_collectives and not (reused & read_by_collectives), (reused,
                                                                        read_by_collectives)
    torch.testing.assert_close(K.interpret(sched)(x)[0], f(x))


def test_a_collectives_result_is_never_lent_while_its_wait_lives(group):
    """``wait_tensor`` returns its input's storage, though its schema declares no alias: the
    collective's result dies at the wait, yet its storage lives on in the wait's result, so
    neither may be lent to a later buffer (a tensor-parallel step computed wrong losses)."""
    def f(x):
        r = c10d.wait_tensor(c10d.all_reduce(x.sin(), "sum", group))
        a = (r * 2).cos()
        b = (x + 3).exp()  # same size as r: could take the collective's storage
        return a + r, b

    x = torch.randn(4, 8)
    sched = K.schedule(K.lower(make_fx(f)(x), [x]))
    communicated = {s.kernel.name for s in sched.steps
                    if isinstance(getattr(s, "kernel", None), ExternKernel)
                    and s.kernel.op in (*COLLECTIVES, c10d.wait_tensor.default)}
    reused = {a.reuses for s in sched.steps for a in getattr(s, "allocations", None) or []
              if a.reuses is not None}
    assert communicated and not (reused & communicated), (reused, communicated)
    for got, want in zip(K.interpret(sched)(x), f(x), strict=True):
        torch.testing.assert_close(got, want)
