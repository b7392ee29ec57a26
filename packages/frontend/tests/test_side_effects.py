"""Side effects (symbolic/side_effects.py): mutations of lists, dicts, objects, modules and
globals from outside the frame are replayed after the graph, in one graph."""

from __future__ import annotations

import types

import kiln_frontend
import pytest
import torch
from _counting_backend import CountingBackend
from kiln_frontend import eval_frame


@pytest.fixture(autouse=True)
def _reset():
    kiln_frontend.reset()
    yield
    kiln_frontend.reset()


class Box:
    pass


HISTORY: list = []
TOTAL = torch.zeros(3)


def many_mutations(x, lst, d, box):
    global TOTAL
    lst.append(x * 2)
    lst[0] = x + 1
    lst.insert(1, "s")
    d["new"] = x.sin()
    del d["gone"]
    d.update(k=3)
    box.val = x.cos()
    y = box.val * 3  # read after the store: the stored value, no guard on box.val
    HISTORY.append(y)
    TOTAL = TOTAL + x
    return y + len(lst)


def fresh_args():
    box = Box()
    box.val = 1.0
    return [1, 2], {"gone": 0, "a": 1}, box


def test_mutations_replayed_in_one_graph():
    global TOTAL
    rec = CountingBackend()
    f = kiln_frontend.optimize(rec)(many_mutations)
    x = torch.randn(3)
    HISTORY.clear()
    TOTAL = torch.zeros(3)
    e_lst, e_d, e_box = fresh_args()
    expected = many_mutations(x, e_lst, e_d, e_box)
    e_hist, e_total = list(HISTORY), TOTAL
    HISTORY.clear()
    TOTAL = torch.zeros(3)
    lst, d, box = fresh_args()
    out = f(x, lst, d, box)
    assert len(rec.graphs) == 1
    torch.testing.assert_close(out, expected)
    assert len(lst) == len(e_lst) == 4 and lst[1] == "s"
    for a, b in [(lst[0], e_lst[0]), (lst[3], e_lst[3]), (d["new"], e_d["new"]),
                 (box.val, e_box.val), (HISTORY[0], e_hist[0]), (TOTAL, e_total)]:
        torch.testing.assert_close(a, b)
    assert list(d) == list(e_d) == ["a", "new", "k"]
    assert len(HISTORY) == 1


def read_item_then_pop(x, xs):
    first = xs[0]
    xs.pop(0)
    xs.append(first * x)
    return first + xs[0]


def test_values_read_before_mutation_keep_their_meaning():
    rec = CountingBackend()
    f = kiln_frontend.optimize(rec)(read_item_then_pop)
    a, b = torch.randn(2), torch.randn(2)
    x = torch.randn(2)
    xs = [a, b]
    out = f(x, xs)
    torch.testing.assert_close(out, a + b)
    assert xs[0] is b
    torch.testing.assert_close(xs[1], a * x)
    assert len(rec.graphs) == 1


def swap_attrs(x, box):
    box.a, box.b = box.b, box.a
    return x + box.a


def test_attribute_swap_reads_old_values_first():
    box = Box()
    box.a, box.b = torch.ones(2), torch.zeros(2)
    f = kiln_frontend.optimize(CountingBackend())(swap_attrs)
    out = f(torch.ones(2), box)
    torch.testing.assert_close(out, torch.ones(2))
    torch.testing.assert_close(box.a, torch.zeros(2))
    torch.testing.assert_close(box.b, torch.ones(2))


def mutate_then_break(x, state):
    state["before"] = x + 1
    print("", end="")  # graph break: Python must see "before" already
    state["seen"] = sorted(state)
    return x * 2


def test_mutations_applied_before_a_graph_break():
    rec = CountingBackend()
    f = kiln_frontend.optimize(rec)(mutate_then_break)
    state = {"a": 1}
    x = torch.randn(2)
    torch.testing.assert_close(f(x, state), x * 2)
    assert state["seen"] == ["a", "before"]
    torch.testing.assert_close(state["before"], x + 1)


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.last = None

    def forward(self, x):
        y = self.lin(x)
        self.last = y.detach()
        return y + self.last


def test_module_attribute_store():
    m = Counter()
    rec = CountingBackend()
    om = kiln_frontend.optimize(rec)(m)
    x = torch.randn(2, 3)
    out = om(x)
    ref = m.lin(x)
    torch.testing.assert_close(out, ref * 2)
    torch.testing.assert_close(m.last, ref)
    om(x)
    assert len(rec.graphs) == 1


def new_object_stored(x, registry):
    entry = Box()
    entry.value = x * 2
    registry["last"] = entry
    return entry


def test_new_object_stored_and_returned_is_one_object():
    registry = {}
    f = kiln_frontend.optimize(CountingBackend())(new_object_stored)
    x = torch.randn(2)
    out = f(x, registry)
    assert registry["last"] is out
    torch.testing.assert_close(out.value, x * 2)


def deletes_attr(x, box):
    del box.tmp
    return x + 1


def test_delete_attribute():
    box = Box()
    box.tmp = 5
    f = kiln_frontend.optimize(CountingBackend())(deletes_attr)
    f(torch.randn(2), box)
    assert not hasattr(box, "tmp")


def grows(x, log):
    log.append(x.sum())
    return x + 1


def test_growing_list_recompiles_but_stays_correct():
    # the list's length is guarded (the replay rebuilds its items), as TorchDynamo does
    rec = CountingBackend()
    f = kiln_frontend.optimize(rec)(grows)
    log: list = []
    for i in range(3):
        x = torch.full((2,), float(i))
        torch.testing.assert_close(f(x, log), x + 1)
    assert [float(v) for v in log] == [0.0, 2.0, 4.0]
    assert len(rec.graphs) == 3


def test_store_on_leaf_module_is_a_graph_break():
    lin = torch.nn.Linear(2, 2)

    def f(x):
        lin.some_flag = True
        return lin(x)

    rec = CountingBackend()
    out = kiln_frontend.optimize(rec)(f)(torch.randn(1, 2))
    assert out.shape == (1, 2) and lin.some_flag is True


def test_module_global_written_by_inlined_helper_of_same_module():
    def helper(t):
        global TOTAL
        TOTAL = t * 3
        return t

    def f(x):
        return helper(x) + 1

    g = types.FunctionType(f.__code__, globals(), "f", None, f.__closure__)
    rec = CountingBackend()
    x = torch.randn(3)
    kiln_frontend.optimize(rec)(g)(x)
    torch.testing.assert_close(TOTAL, x * 3)
    assert eval_frame.counters["compiles"] >= 1


class ReplacesBuffer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("running", torch.zeros(3))

    def forward(self, x):
        self.running = self.running + x
        return self.running * 2


def test_replaced_buffer_is_never_read_stale():
    m, ref = ReplacesBuffer(), ReplacesBuffer()
    om = kiln_frontend.optimize(CountingBackend())(m)
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(om(x), ref(x))
        torch.testing.assert_close(m.running, ref.running)
    assert "running" in dict(m.named_buffers())
