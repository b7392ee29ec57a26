"""The guard tree (``_guardtree.c`` via ``guards.build_check_fn``): one node per value read,
shared by every guard below it, leaf checks in C, and memos that skip checks that cannot
fail.  Every test changes the state a guard protects and asserts the tree says no, and that
the tree and the per-guard Python path (``failure_reason``) agree."""

from __future__ import annotations

import collections
import sys

import pytest
import torch
from kiln_frontend import guards as G
from kiln_frontend.guards import Guard, GuardKind, GuardSet, build_check_fn
from kiln_frontend.sources import (
    AttrSource,
    AttrTupleSource,
    ClosureSource,
    GetItemSource,
    GlobalSource,
    IdentitySource,
    LocalSource,
    NNModuleMemberSource,
)

pytestmark = pytest.mark.skipif(G.GuardTree is None, reason="C extension not built")

#: 3.13 writes attributes of an object with inline values past its __dict__'s version tag
#: 3.13: an instance __dict__ sharing its object's inline values has no trustworthy version
#: tag; the memo holds such an object's attributes by slot (_guardtree.c, "Memo")
INLINE_VALUES_UNVERSIONED = sys.version_info >= (3, 13)


def tree(guards, names, f_globals=None):
    gs = GuardSet()
    for g in guards:
        gs.add(g)
    check = build_check_fn(gs, names, f_globals if f_globals is not None else {})
    assert isinstance(check, G.GuardTree)
    return check


def agree(check, *args) -> bool:
    """The tree's answer, checked against the per-guard Python path."""
    ok = check(*args)
    reason = check.failure_reason(*args)
    assert ok == (reason is None), (ok, reason)
    return ok


class Obj:
    pass


# -- one test per node kind ----------------------------------------------------------------


def test_arg_node():
    check = tree([Guard(LocalSource("n"), GuardKind.CONSTANT_MATCH, 3)], ["x", "n"])
    assert agree(check, None, 3)
    assert not agree(check, None, 4)
    assert not agree(check, None, 3.0)
    assert check.failure_reason(None, 4) == "L['n'] == 3 (actual 4)"


def test_global_node():
    glob = {"k": 2}
    check = tree([Guard(GlobalSource("k"), GuardKind.CONSTANT_MATCH, 2)], ["x"], glob)
    assert agree(check, 0)
    glob["k"] = 5
    assert not agree(check, 0)
    del glob["k"]  # a missing global is a miss, not an error
    assert not agree(check, 0)
    assert "KeyError" in check.failure_reason(0)


def test_closure_node():
    """A cell of the function whose frame is checked: read through guarded_function(),
    which only the eval-frame hook sets, so outside of it the guard is a miss."""
    check = tree([Guard(ClosureSource("k", 0), GuardKind.CONSTANT_MATCH, 1)], ["x"])
    assert not agree(check, 0)


def test_closure_node_through_the_hook():
    import kiln_frontend

    def make(k):
        def f(x):
            return x * k
        return f

    seen = []

    def backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    for k in (2, 3, 2):
        f = make(k)
        compiled = kiln_frontend.compile(f, backend=backend)
        x = torch.randn(3)
        torch.testing.assert_close(compiled(x), f(x))
    kiln_frontend.reset()


def test_const_node_global_module_hooks():
    check = tree([Guard(None, GuardKind.GLOBAL_STATE, G.torch_global_state())], ["x"])
    assert "torch.nn.modules.module:" in check.code
    assert agree(check, 0)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        assert not agree(check, 0)
        assert "global nn.Module hooks" in check.failure_reason(0)
    finally:
        handle.remove()
    assert agree(check, 0)


def test_attr_node():
    o = Obj()
    o.v = 1
    check = tree([Guard(AttrSource(LocalSource("o"), "v"), GuardKind.CONSTANT_MATCH, 1)], ["o"])
    assert agree(check, o)
    o.v = 2
    assert not agree(check, o)
    del o.v
    assert not agree(check, o)
    assert "AttributeError" in check.failure_reason(o)


@pytest.mark.parametrize("container", [list, tuple, dict])
def test_item_node(container):
    value = container({0: "a", 1: "b"}) if container is dict else container(["a", "b"])
    check = tree([Guard(GetItemSource(LocalSource("xs"), 1), GuardKind.CONSTANT_MATCH, "b")],
                 ["xs"])
    assert agree(check, value)
    other = container({0: "a", 1: "c"}) if container is dict else container(["a", "c"])
    assert not agree(check, other)
    short = container({0: "a"}) if container is dict else container(["a"])
    assert not agree(check, short)


def test_module_member_node_shares_modules_dict():
    m = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh())
    relu, tanh = m[0], m[1]
    guards = [
        Guard(LocalSource("m"), GuardKind.NN_MODULE, (id(m), True)),
        Guard(AttrSource(LocalSource("m"), "_modules"), GuardKind.DICT_KEYS,
              (dict, ("0", "1"))),
        Guard(NNModuleMemberSource(LocalSource("m"), "0"), GuardKind.NN_MODULE,
              (id(relu), True)),
        Guard(NNModuleMemberSource(LocalSource("m"), "1"), GuardKind.NN_MODULE,
              (id(tanh), True)),
    ]
    check = tree(guards, ["m"])
    assert check.code.count("._modules:") == 1  # one read for all three guards
    assert agree(check, m)
    m[1] = torch.nn.Tanh()
    assert not agree(check, m)
    m[1] = tanh
    assert agree(check, m)
    m.append(torch.nn.ReLU())
    assert not agree(check, m)  # keys changed
    assert "list(L['m']._modules.keys())" in check.failure_reason(m)


# -- leaves ------------------------------------------------------------------------------


def test_type_id_is_leaves():
    a = Obj()
    check = tree([Guard(LocalSource("t"), GuardKind.TYPE_MATCH, Obj),
                  Guard(LocalSource("i"), GuardKind.ID_MATCH, id(a)),
                  Guard(LocalSource("n"), GuardKind.CONSTANT_MATCH, None)], ["t", "i", "n"])
    assert agree(check, Obj(), a, None)
    assert not agree(check, object(), a, None)
    assert not agree(check, Obj(), Obj(), None)
    assert not agree(check, Obj(), a, 0)


def test_nan_leaf():
    check = tree([Guard(LocalSource("f"), GuardKind.CONSTANT_MATCH, float("nan"))], ["f"])
    assert agree(check, float("nan"))
    assert not agree(check, 1.0)


def test_len_falsy_keys_leaves():
    check = tree([Guard(LocalSource("xs"), GuardKind.LIST_LENGTH, (list, 2)),
                  Guard(LocalSource("e"), GuardKind.DICT_KEYS, (dict, ())),
                  Guard(LocalSource("d"), GuardKind.DICT_KEYS, (dict, ("a", "b")))],
                 ["xs", "e", "d"])
    d = {"a": 1, "b": 2}
    assert agree(check, [1, 2], {}, d)
    assert not agree(check, [1], {}, d)
    assert not agree(check, (1, 2), {}, d)
    assert not agree(check, [1, 2], {"x": 1}, d)
    assert agree(check, [1, 2], {}, d)  # cached on d's version tag now
    d["b"] = 3  # a value change: compared again, still the same keys
    assert agree(check, [1, 2], {}, d)
    del d["b"]
    d["c"] = 2  # same size, other keys: the cached tag must not be trusted
    assert not agree(check, [1, 2], {}, d)
    del d["c"]
    d["b"] = 2
    assert agree(check, [1, 2], {}, d)
    d2 = {"b": 1, "a": 2}  # order matters
    assert not agree(check, [1, 2], {}, d2)


def test_keys_of_ordered_dict_follow_its_order():
    od = collections.OrderedDict(a=1, b=2)
    check = tree([Guard(LocalSource("d"), GuardKind.DICT_KEYS,
                        (collections.OrderedDict, ("a", "b")))], ["d"])
    assert agree(check, od)
    od.move_to_end("a")  # reorders without touching the dict's storage version
    assert not agree(check, od)


def test_hasattr_leaf():
    o = Obj()
    check = tree([Guard(LocalSource("o"), GuardKind.HASATTR, ("x", False))], ["o"])
    assert agree(check, o)
    o.x = 1
    assert not agree(check, o)


def test_tensor_leaf():
    t = torch.randn(2, 3)
    check = tree([Guard(LocalSource("t"), GuardKind.TENSOR_MATCH, G.TensorGuard(t))], ["t"])
    assert "TENSOR_MATCH" in check.code and "python:" not in check.code
    assert agree(check, torch.randn(2, 3))
    assert not agree(check, torch.randn(3, 2))
    assert not agree(check, "not a tensor")
    assert check.failure_reason(torch.randn(3, 2)).startswith("tensor L['t'] size mismatch")


def test_grad_mode_and_global_state_leaves():
    check = tree([Guard(None, GuardKind.GRAD_MODE, True),
                  Guard(None, GuardKind.GLOBAL_STATE, G.torch_global_state())], ["x"])
    assert agree(check, 0)
    with torch.no_grad():
        assert not agree(check, 0)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert not agree(check, 0)
        assert "default dtype" in check.failure_reason(0)
    finally:
        torch.set_default_dtype(old)
    with torch.autocast("cpu"):
        assert not agree(check, 0)
    assert agree(check, 0)


class _Mode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _set_default_dtype(stack):
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    stack.callback(torch.set_default_dtype, old)


def _set_matmul_precision(value):
    def enter(stack):
        old = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(value)
        stack.callback(torch.set_float32_matmul_precision, old)
    return enter


def _set_deterministic(stack):
    old = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    stack.callback(torch.use_deterministic_algorithms, old)


#: one change of each piece of torch's global state the guards read
STATE_CHANGES = {
    "no_grad": lambda stack: stack.enter_context(torch.no_grad()),
    "inference_mode": lambda stack: stack.enter_context(torch.inference_mode()),
    "deterministic": _set_deterministic,
    "default_dtype": _set_default_dtype,
    "torch_function_mode": lambda stack: stack.enter_context(_Mode()),
    "matmul_precision_high": _set_matmul_precision("high"),
    "matmul_precision_medium": _set_matmul_precision("medium"),
    "autocast_cpu": lambda stack: stack.enter_context(torch.autocast("cpu")),
}


@pytest.mark.skipif(not G.USING_FAST_TENSOR_CHECK, reason="_tensorcheck (C++) not built")
def test_global_state_leaves_read_the_state_in_cxx():
    """Grad mode and every GLOBAL_STATE getter are read from torch's C++ state, not called
    (a Python call per getter on every guarded call, 2-3k instructions in all)."""
    check = tree([Guard(None, GuardKind.GRAD_MODE, True),
                  Guard(None, GuardKind.GLOBAL_STATE, G.torch_global_state())], ["x"])
    getters = [read for _, read in G.GLOBAL_STATE_READERS
               if read not in (G._autocast_state, G._global_module_hooks)]
    # grad mode, the plain getters, and autocast's "any enabled" leaf
    assert check.state_leaves == 1 + len(getters) + 1
    assert agree(check, 0)


@pytest.mark.parametrize("change", list(STATE_CHANGES))
def test_global_state_leaves_see_every_state_change(change):
    import contextlib

    check = tree([Guard(None, GuardKind.GRAD_MODE, True),
                  Guard(None, GuardKind.GLOBAL_STATE, G.torch_global_state())], ["x"])
    assert agree(check, 0)
    with contextlib.ExitStack() as stack:
        STATE_CHANGES[change](stack)
        assert not agree(check, 0)
        # a tree built in the changed state passes there and fails back outside
        inside = tree([Guard(None, GuardKind.GRAD_MODE, torch.is_grad_enabled()),
                       Guard(None, GuardKind.GLOBAL_STATE, G.torch_global_state())], ["x"])
        assert agree(inside, 0)
    assert agree(check, 0)
    assert not agree(inside, 0)


def test_state_leaf_on_a_value_the_getter_never_returns_calls_it():
    leaves = (("call_eq", torch._C._get_float32_matmul_precision, "HIGHEST", None),
              ("call_is", torch._C._len_torch_function_stack, 0, None),
              ("call_eq", torch.get_default_dtype, "float32", None))
    for kind, fn, value, _ in leaves:
        check = G.GuardTree(1, {}, ("root", None, ((kind, fn, value),), ()))
        assert check.state_leaves == 0, (kind, fn)
        assert check(0) == ((fn() is value) if kind == "call_is" else (fn() == value))
    # a getter of the table on a value it does return is read in C++
    check = G.GuardTree(1, {}, ("root", None, (("call_eq", torch.get_default_dtype,
                                                  torch.get_default_dtype()),), ()))
    assert check.state_leaves == (1 if G.USING_FAST_TENSOR_CHECK else 0)
    assert check(0)


def test_python_leaf_for_what_no_node_expresses():
    a = Obj()
    check = tree([Guard(IdentitySource(LocalSource("x"), LocalSource("y")),
                        GuardKind.CONSTANT_MATCH, True)], ["x", "y"])
    assert "python: " in check.code
    assert agree(check, a, a)
    assert not agree(check, a, Obj())


def test_attr_tuple_constant_is_one_leaf_per_attribute():
    conv = torch.nn.Conv2d(2, 2, 3)
    src = AttrTupleSource(LocalSource("m"), ("stride", "padding", "groups"))
    check = tree([Guard(src, GuardKind.CONSTANT_MATCH, (conv.stride, conv.padding, conv.groups))],
                 ["m"])
    assert "python:" not in check.code
    for _ in range(3):
        assert agree(check, conv)
    conv.stride = (2, 2)
    assert not agree(check, conv)
    assert "L['m'].{stride, padding, groups}" in check.failure_reason(conv)


def test_exceptions_are_misses_but_base_exceptions_propagate():
    class Boom:
        @property
        def v(self):
            raise self.exc

    b = Boom()
    check = tree([Guard(AttrSource(LocalSource("b"), "v"), GuardKind.CONSTANT_MATCH, 1)], ["b"])
    b.exc = ValueError("no")
    assert check(b) is False
    b.exc = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        check(b)


def test_bad_specs_fail_loudly():
    with pytest.raises(ValueError, match="unknown leaf kind 'bogus'"):
        G.GuardTree(1, {}, ("root", None, (("bogus", None, None),), ()))
    with pytest.raises(ValueError, match="accessor attr at depth 1"):
        G.GuardTree(1, {}, ("root", None, (), (("attr", "x", (), ()),)))
    with pytest.raises(ValueError, match="arg slot 3 out of range"):
        G.GuardTree(1, {}, ("root", None, (), (("arg", 3, (), ()),)))
    with pytest.raises(TypeError, match="exactly 1 positional"):
        G.GuardTree(1, {}, ("root", None, (), ()))(1, 2)


# -- shared walks --------------------------------------------------------------------------


class Counting:
    """Counts reads of ``sub`` (a __getattribute__ of its own: never read from __dict__)."""

    reads = 0

    def __getattribute__(self, name):
        if name == "sub":
            type(self).reads += 1
        return object.__getattribute__(self, name)


def test_a_value_shared_by_many_guards_is_read_once():
    o = Counting()
    o.sub = Obj()
    o.sub.a, o.sub.b, o.sub.c = 1, 2.0, "c"
    sub = AttrSource(LocalSource("o"), "sub")
    check = tree([Guard(sub, GuardKind.TYPE_MATCH, Obj),
                  Guard(AttrSource(sub, "a"), GuardKind.CONSTANT_MATCH, 1),
                  Guard(AttrSource(sub, "b"), GuardKind.CONSTANT_MATCH, 2.0),
                  Guard(AttrSource(sub, "c"), GuardKind.CONSTANT_MATCH, "c")], ["o"])
    Counting.reads = 0
    assert check(o)
    assert Counting.reads == 1
    assert check.code.count(".sub:") == 1


# -- memos: skipping what cannot fail ------------------------------------------------------


def module_guards(m):
    s = LocalSource("m")
    guards = [Guard(s, GuardKind.NN_MODULE, (id(m), m.training)),
              Guard(AttrTupleSource(s, ("in_features", "out_features")), GuardKind.CONSTANT_MATCH,
                    (m.in_features, m.out_features))]
    for name in ("_forward_pre_hooks", "_forward_hooks"):
        guards.append(Guard(AttrSource(s, name), GuardKind.DICT_KEYS,
                            (type(getattr(m, name)), ())))
    return guards


def test_module_memo_sees_a_setting_change():
    m = torch.nn.Linear(2, 2)
    check = tree(module_guards(m), ["m"])
    for _ in range(3):  # the second call on is answered from the memo
        assert agree(check, m)
    assert check.memo_hits == 2
    m.eval()
    assert not agree(check, m)
    m.train()
    assert agree(check, m)
    m.in_features = 3
    assert not agree(check, m)


def test_module_memo_sees_a_hook_added_to_an_unchanged_module():
    m = torch.nn.Linear(2, 2)
    check = tree(module_guards(m), ["m"])
    for _ in range(3):
        assert agree(check, m)
    handle = m.register_forward_hook(lambda *a: None)  # m.__dict__ itself is unchanged
    assert not agree(check, m)
    handle.remove()
    assert agree(check, m)
    assert agree(check, m)


def test_memo_sees_a_class_change():
    class Plain:
        pass

    o = Plain()
    o.x = 1
    check = tree([Guard(AttrSource(LocalSource("o"), "x"), GuardKind.CONSTANT_MATCH, 1)], ["o"])
    for _ in range(3):
        assert agree(check, o)
    Plain.x = property(lambda self: 2)  # a data descriptor now wins over o.__dict__
    assert o.x == 2  # (the lookup gives Plain a new version tag)
    assert not agree(check, o)
    del Plain.x
    assert agree(check, o)

    class Other:
        x = property(lambda self: 3)

    o.__class__ = Other
    assert o.x == 3
    assert not agree(check, o)


def test_memo_does_not_trust_mutable_values():
    o = Obj()
    o.items = [1, 2]
    src = AttrTupleSource(LocalSource("o"), ("items",))
    check = tree([Guard(src, GuardKind.CONSTANT_MATCH, ([1, 2],))], ["o"])
    for _ in range(3):
        assert agree(check, o)
    o.items.append(3)  # o.__dict__ unchanged, the list is not
    assert not agree(check, o)


def test_memo_of_items_of_an_attribute():
    o = Obj()
    o.shape = (3, 4)
    o.sizes = [3, 4]
    check = tree([Guard(GetItemSource(AttrSource(LocalSource("o"), "shape"), 0),
                        GuardKind.CONSTANT_MATCH, 3),
                  Guard(GetItemSource(AttrSource(LocalSource("o"), "sizes"), 1),
                        GuardKind.CONSTANT_MATCH, 4)], ["o"])
    for _ in range(3):
        assert agree(check, o)
    o.shape = (5, 4)
    assert not agree(check, o)
    o.shape = (3, 4)
    for _ in range(3):
        assert agree(check, o)
    o.sizes[1] = 5  # a list: changed in place, o.__dict__ unchanged
    assert not agree(check, o)


def test_memo_answers_on_this_python():
    """The memo answers from the second call on: 3.13 stopped setting
    Py_TPFLAGS_VALID_VERSION_TAG (a zero tag alone means unversioned), and testing the flag
    there made every type look unversioned, so no memo ever answered.  On 3.13 an instance
    __dict__ sharing its object's inline values is written by ``o.v = 2`` with no new tag
    (the tests above would fail if the memo trusted it): such an object's memo holds each
    attribute's value slot instead."""
    hooks = torch.nn.modules.module
    check = tree([Guard(AttrSource(GlobalSource("M"), n), GuardKind.DICT_KEYS,
                        (type(getattr(hooks, n)), ())) for n in G.GLOBAL_MODULE_HOOK_DICTS],
                 [], {"M": hooks})
    for _ in range(4):
        assert agree(check)
    assert check.memo_hits == 3
    o = Obj()
    o.v = 1
    check = tree([Guard(AttrSource(LocalSource("o"), "v"), GuardKind.CONSTANT_MATCH, 1)], ["o"])
    for _ in range(3):
        assert agree(check, o)
    assert check.memo_hits == 2
    o.v = 2
    assert not agree(check, o)
    o.v = 1
    o.__dict__[0] = 0  # a key that is not a str: a combined table, versioned on 3.13 too
    check = tree([Guard(AttrSource(LocalSource("o"), "v"), GuardKind.CONSTANT_MATCH, 1)], ["o"])
    for _ in range(3):
        assert agree(check, o)
    assert check.memo_hits == 2
    o.v = 2
    assert not agree(check, o)


def _store_v(o, value):
    o.v = value  # (run often: the specialized STORE_ATTR)


@pytest.mark.parametrize("how", ["setattr", "object_setattr", "specialized", "dict_item",
                                 "delete_readd", "same_value_new_object", "swap_attrs"])
def test_memo_sees_every_way_an_attribute_changes(how):
    """The memo of an object's attributes (by slot on 3.13, by the __dict__'s tag before)
    misses after each way of changing one between two checks, and then answers again."""
    o = Obj()
    o.v, o.w = 1000.5, 2000.5
    ident = o.w
    check = tree([Guard(AttrSource(LocalSource("o"), "v"), GuardKind.CONSTANT_MATCH, 1000.5),
                  Guard(AttrSource(LocalSource("o"), "w"), GuardKind.ID_MATCH, id(ident))],
                 ["o"])
    for _ in range(3):
        assert agree(check, o)
    assert check.memo_hits == 2
    if how == "setattr":  # (the name in a variable: builtins.setattr, not STORE_ATTR)
        name = "v"
        setattr(o, name, 1.5)
    elif how == "object_setattr":
        object.__setattr__(o, "v", 1.5)
    elif how == "specialized":
        for _ in range(64):
            _store_v(o, 1.5)
    elif how == "dict_item":
        vars(o)["v"] = 1.5
    elif how == "delete_readd":
        del o.v
        assert not agree(check, o)
        o.v = 1.5
    elif how == "same_value_new_object":  # == still holds, identity does not
        o.w = float("2000.5")
        assert o.w == ident and o.w is not ident
        assert not agree(check, o)
        o.w = ident
        assert agree(check, o)
        return
    elif how == "swap_attrs":
        o.v, o.w = o.w, o.v
    assert not agree(check, o)
    o.v, o.w = 1000.5, ident
    hits = check.memo_hits
    for _ in range(3):
        assert agree(check, o)
    assert check.memo_hits >= hits + 2


def test_memo_by_slot_is_not_fooled_by_another_object_of_the_type():
    """Two objects of one class share the keys of their split tables: the memo of one
    answers for the other only where every memoized slot holds the same object."""
    shared = object()
    o, p = Obj(), Obj()
    o.v = p.v = shared
    o.x, p.x = 1, 2
    check = tree([Guard(AttrSource(LocalSource("o"), "v"), GuardKind.ID_MATCH, id(shared)),
                  Guard(AttrSource(LocalSource("o"), "x"), GuardKind.CONSTANT_MATCH, 1)], ["o"])
    for _ in range(3):
        assert agree(check, o)
    assert not agree(check, p)
    p.x = 1
    assert agree(check, p)


def test_memo_of_a_compiled_module_sees_mutation_between_calls():
    """A compiled LeakyReLU module: its settings are answered from the memo (on 3.13 too),
    and a setting changed between calls recompiles and gives eager's result."""
    import kiln_frontend

    kiln_frontend.reset()
    m = torch.nn.LeakyReLU(0.1)
    compiled = kiln_frontend.optimize("eager")(m)
    x = torch.randn(8)
    for _ in range(4):
        torch.testing.assert_close(compiled(x), m(x))
    from kiln_frontend.eval_frame import cache_entries

    entries = cache_entries(type(m).forward.__code__)
    assert entries and sum(e[0].memo_hits for e in entries) > 0
    for slope in (0.3, 0.5, 0.1):
        for _ in range(64):
            _set_slope(m, slope)
        torch.testing.assert_close(compiled(x), torch.nn.functional.leaky_relu(x, slope))
        torch.testing.assert_close(compiled(x), m(x))


def _set_slope(m, slope):
    m.negative_slope = slope


def test_memo_on_replaced_dict():
    o, p = Obj(), Obj()
    o.v, p.v = 1, 2
    check = tree([Guard(AttrSource(LocalSource("o"), "v"), GuardKind.CONSTANT_MATCH, 1)], ["o"])
    for _ in range(3):
        assert agree(check, o)
    assert not agree(check, p)
    o.__dict__ = {"v": 2}
    assert not agree(check, o)


# -- the whole thing, compiled --------------------------------------------------------------


def test_compiled_module_tree_and_recompiles():
    import kiln_frontend
    from kiln_frontend import eval_frame

    kiln_frontend.reset()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

    def run(m, x):
        return m(x)

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = kiln_frontend.compile(run, backend=backend)
    x = torch.randn(3, 4)
    for _ in range(3):
        torch.testing.assert_close(compiled(model, x), run(model, x))
    (entry,) = eval_frame.cache_entries(run.__code__)
    check = entry[0]
    assert isinstance(check, G.GuardTree)
    assert check.code.startswith("def check_run(m, x):  # guard tree checked in C")
    assert "python:" not in check.code  # every guard of a plain module is a C leaf
    assert len(graphs) == 1
    with torch.no_grad():
        model[0].weight.requires_grad_(False)
        torch.testing.assert_close(compiled(model, x), run(model, x))
    assert len(graphs) == 2
    kiln_frontend.reset()
