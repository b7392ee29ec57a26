"""Corpus: side effects on lists, dicts, objects, modules and globals from outside the frame
(replayed after the graph, see symbolic/side_effects.py).

``check_case`` calls each function twice on the same objects, so the mutations here keep
lengths and keys stable (a list that grows each call recompiles: its length is guarded) and
global writes are idempotent (eager and compiled runs share the module's globals)."""

from __future__ import annotations

import types

import torch
from _harness import Case, case_params, check_case


def _t(*shape):
    return torch.randn(*shape)


class Box:
    def __init__(self, **kw):
        self.__dict__.update(kw)


# -- lists and dicts passed in ---------------------------------------------------------------


def list_setitem(x, xs):
    xs[0] = x * 2
    return x + xs[1]


def list_append_pop(x, xs):
    xs.append(x.sin())
    old = xs.pop(0)
    return old + xs[-1]


def list_reverse_and_read(x, xs):
    xs.reverse()
    return xs[0] * x


def list_clear_extend(x, xs):
    n = len(xs)
    xs.clear()
    xs.extend([x * i for i in range(n)])
    return x.sum()


def list_insert_del(x, xs):
    xs.insert(0, x + 1)
    del xs[-1]
    return xs[0] * 2


def list_slice_assign(x, xs):
    xs[1:] = [x, x * 2]
    return x - 1


def list_iadd_then_pop(x, xs):
    xs += [x * 3]
    xs.pop()
    xs[0] = xs[0] + x
    return xs[0]


def dict_setitem_existing(x, d):
    d["a"] = x + 1
    d["b"] = d["a"] * 2  # read after write sees the new value
    return d["b"]


def dict_update_and_pop(x, d):
    d.update(a=x.cos(), b=x.sin())
    v = d.pop("a")
    d["a"] = v * 2
    return v


def dict_del_and_readd(x, d):
    old = d["k"]
    del d["k"]
    d["k"] = old * x
    return old


def dict_setdefault_get(x, d):
    d.setdefault("a", x)
    return d.get("a") * x + d.get("missing", 1.0)


def nested_list_in_dict(x, d):
    d["items"][0] = x * 5
    d["items"][1] = d["items"][0] + 1
    return d["items"][1]


def returns_mutated_list(x, xs):
    xs[0] = x
    return xs


def helper_mutates(xs, v):
    xs[0] = v


def mutation_in_inlined_helper(x, xs):
    helper_mutates(xs, x * 7)
    return x + 1


# -- attributes of objects and modules -------------------------------------------------------


def object_attr_store(x, box):
    box.val = x.sin()
    return box.val * 2


def object_attr_swap(x, box):
    box.a, box.b = box.b, box.a
    return box.a + x


def object_attr_delete_readd(x, box):
    old = box.tmp
    del box.tmp
    box.tmp = old + x
    return old


def object_setattr_builtin(x, box, name="val"):
    setattr(box, name, x * 4)
    return getattr(box, name) + 1


def nested_object_attr(x, box):
    box.sub.val = x - 1
    return box.sub.val * x


def object_counter_attr(x, box):
    box.total = box.total * 0 + x.sum()
    return x * box.total


class CachesLast(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.last = torch.zeros(2, 4)

    def forward(self, x):
        y = self.lin(x)
        self.last = y.detach() * 2
        return y + self.last


class RunningMean(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.running = torch.zeros(4)  # a plain tensor attribute (reloaded each call)

    def forward(self, x):
        self.running = self.running * 0.9 + x.mean(0) * 0.1
        return x - self.running


class StoresPlainNumber(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 2.0

    def forward(self, x):
        self.scale = 3.0
        return x * self.scale


# -- globals ---------------------------------------------------------------------------------

LAST = None
FLAG = False
G_LIST = [torch.zeros(3), torch.zeros(3)]
G_DICT = {"k": torch.zeros(3)}
STATE_MOD = types.ModuleType("kiln_corpus_state")
STATE_MOD.value = None


def global_tensor_store(x):
    global LAST
    LAST = x * 2
    return LAST + 1


def global_flag_store(x):
    global FLAG
    FLAG = True
    return x + 1


def global_store_then_read(x):
    global LAST
    LAST = x.cos()
    return LAST * LAST


def global_list_setitem(x):
    G_LIST[0] = x * 3
    return G_LIST[0] + G_LIST[1]


def global_dict_setitem(x):
    G_DICT["k"] = x.exp()
    return G_DICT["k"] - 1


def python_module_attr_store(x):
    STATE_MOD.value = x * 3
    return STATE_MOD.value + 1


# -- new objects and graph breaks ------------------------------------------------------------


class Entry:
    def __init__(self, value):
        self.value = value


def new_object_into_dict(x, d):
    entry = Entry(x * 2)
    d["entry"] = entry
    return entry


def new_list_into_object(x, box):
    box.items = [x, x + 1]
    return box.items


def mutate_then_graph_break(x, d):
    d["a"] = x + 1
    print("", end="")  # runs in Python, after the mutation was applied
    d["b"] = d["a"] * 2
    return d["b"]


def break_sees_list_state(x, xs):
    xs[0] = x * 2
    print("", end="")
    return xs[0] + len(xs)


CASES = [
    Case(list_setitem, (_t(3), [_t(3), _t(3)]), 1),
    Case(list_append_pop, (_t(3), [_t(3), _t(3)]), 1),
    Case(list_reverse_and_read, (_t(3), [_t(3), _t(3), _t(3)]), 1),
    Case(list_clear_extend, (_t(3), [_t(3), _t(3)]), 1),
    Case(list_insert_del, (_t(3), [_t(3), _t(3)]), 1),
    Case(list_slice_assign, (_t(3), [_t(3), _t(3), _t(3)]), 1),
    Case(list_iadd_then_pop, (_t(3), [_t(3)]), 1),
    Case(dict_setitem_existing, (_t(3), {"a": _t(3), "b": _t(3)}), 1),
    Case(dict_update_and_pop, (_t(3), {"b": _t(3), "a": _t(3)}), 1),
    Case(dict_del_and_readd, (_t(3), {"j": 1, "k": _t(3)}), 1),
    Case(dict_setdefault_get, (_t(3), {"a": _t(3)}), 1),
    Case(nested_list_in_dict, (_t(3), {"items": [_t(3), _t(3)]}), 1),
    Case(returns_mutated_list, (_t(3), [_t(3), 5]), 0),
    Case(mutation_in_inlined_helper, (_t(3), [_t(3)]), 1),
    Case(object_attr_store, (_t(3), Box(val=_t(3))), 1),
    Case(object_attr_swap, (_t(3), Box(a=_t(3), b=_t(3))), 1),
    Case(object_attr_delete_readd, (_t(3), Box(tmp=_t(3))), 1),
    Case(object_setattr_builtin, (_t(3), Box(val=_t(3))), 1),
    Case(nested_object_attr, (_t(3), Box(sub=Box(val=_t(3)))), 1),
    Case(object_counter_attr, (_t(3), Box(total=_t(()))), 1),
    Case(CachesLast(), (_t(2, 4),), 1),
    Case(RunningMean(), (_t(5, 4),), 1),
    Case(StoresPlainNumber(), (_t(3),), 1),
    Case(global_tensor_store, (_t(3),), 1),
    Case(global_flag_store, (_t(3),), 1),
    Case(global_store_then_read, (_t(3),), 1),
    Case(global_list_setitem, (_t(3),), 1),
    Case(global_dict_setitem, (_t(3),), 1),
    Case(python_module_attr_store, (_t(3),), 1),
    Case(new_object_into_dict, (_t(3), {"other": 1, "entry": Entry(None)}), 1),
    Case(new_list_into_object, (_t(3), Box(items=None)), 1),
    Case(mutate_then_graph_break, (_t(3), {"a": _t(3), "b": _t(3)}), 2),
    Case(break_sees_list_state, (_t(3), [_t(3)]), 2),
]


@case_params(CASES)
def test_side_effect_case(case):
    result = case.check()
    assert result.backend.graphs is not None


def test_global_state_after_compiled_call():
    global LAST
    LAST = None
    x = torch.randn(3)
    check_case(global_tensor_store, (x,), 1)
    torch.testing.assert_close(LAST, x * 2)
    G_LIST[1] = torch.ones(3)
    check_case(global_list_setitem, (x,), 1)
    torch.testing.assert_close(G_LIST[0], x * 3)
    check_case(python_module_attr_store, (x,), 1)
    torch.testing.assert_close(STATE_MOD.value, x * 3)
