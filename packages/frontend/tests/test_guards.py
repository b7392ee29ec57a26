"""Guards: printing, the generated check function, failure reasons, TensorGuard."""

from __future__ import annotations

import pytest
import torch
from kiln_frontend import guards as G
from kiln_frontend.guards import Guard, GuardKind, GuardSet, build_check_fn
from kiln_frontend.sources import AttrSource, GetItemSource, GlobalSource, LocalSource

TENSOR_GUARDS = [G.PyTensorGuardFallback]
if G.USING_C_TENSOR_GUARD:
    TENSOR_GUARDS.append(G.TensorGuard)


@pytest.mark.parametrize("TG", TENSOR_GUARDS)
def test_tensor_guard(TG):
    t = torch.randn(3, 4)
    g = TG(t)
    assert g(t) and g(torch.randn(3, 4))
    assert not g(torch.randn(4, 4))
    assert g.reason(torch.randn(4, 4)) == "size mismatch at index 0: expected 3, actual 4"
    assert not g(torch.randn(3, 4, dtype=torch.float64))
    assert "dtype" in g.reason(torch.randn(3, 4, dtype=torch.float64))
    assert not g(torch.randn(3, 4, requires_grad=True))
    assert not g(torch.randn(4, 3).t())  # strides differ
    assert "stride" in g.reason(torch.randn(4, 3).t())
    assert not g(torch.randn(3))
    assert g.reason(t) is None
    dyn = TG(t, dynamic_dims=(0,))
    assert dyn(torch.randn(7, 4))
    assert isinstance(repr(g), str)


def test_guard_printing_like_dynamo():
    assert str(Guard(LocalSource("a"), GuardKind.TENSOR_MATCH)) == " - local 'a' TENSOR_MATCH"
    assert str(Guard(GlobalSource("torch"), GuardKind.FUNCTION_MATCH)) == \
        " - global 'torch' FUNCTION_MATCH"
    src = AttrSource(LocalSource("self"), "lin")
    assert str(Guard(src, GuardKind.NN_MODULE)) == " - local 'self.lin' NN_MODULE"
    assert src.name() == "L['self'].lin"
    assert GetItemSource(LocalSource("xs"), 0).name() == "L['xs'][0]"


def _check(guards, names, f_globals=None):
    gs = GuardSet()
    for g in guards:
        gs.add(g)
    return build_check_fn(gs, names, f_globals or {})


def test_check_fn_combines_guards_and_explains_failures():
    t = torch.randn(2)
    glob = {"torch": torch}
    check = _check([
        Guard(LocalSource("x"), GuardKind.TENSOR_MATCH, G.TensorGuard(t)),
        Guard(LocalSource("n"), GuardKind.CONSTANT_MATCH, 3),
        Guard(LocalSource("flag"), GuardKind.CONSTANT_MATCH, None),
        Guard(GlobalSource("torch"), GuardKind.FUNCTION_MATCH, id(torch), "module"),
        Guard(LocalSource("xs"), GuardKind.LIST_LENGTH, (list, 2)),
        Guard(LocalSource("d"), GuardKind.DICT_KEYS, (dict, ("a",))),
        Guard(LocalSource("o"), GuardKind.TYPE_MATCH, int),
    ], ["x", "n", "flag", "xs", "d", "o"], glob)
    good = (t, 3, None, [1, 2], {"a": 1}, 5)
    assert check(*good)
    assert check.failure_reason(*good) is None
    assert len(check.guards) == 7
    assert "def check(x, n, flag, xs, d, o):" in check.code

    assert not check(t, 4, None, [1, 2], {"a": 1}, 5)
    assert check.failure_reason(t, 4, None, [1, 2], {"a": 1}, 5) == "L['n'] == 3 (actual 4)"
    # 3.0 == 3 but the type differs
    assert not check(t, 3.0, None, [1, 2], {"a": 1}, 5)
    assert not check(t, True, None, [1, 2], {"a": 1}, 5)
    assert not check(t, 3, 0, [1, 2], {"a": 1}, 5)
    assert not check(t, 3, None, [1], {"a": 1}, 5)
    assert check.failure_reason(t, 3, None, [1], {"a": 1}, 5) == "len(L['xs']) == 2 (actual 1)"
    assert not check(t, 3, None, [1, 2], {"b": 1}, 5)
    assert not check(t, 3, None, [1, 2], {"a": 1}, "5")
    assert not check(torch.randn(3), *good[1:])
    assert check.failure_reason(torch.randn(3), *good[1:]).startswith("tensor L['x'] size")
    glob["torch"] = object()
    assert not check(*good)
    assert "G['torch'] is not the module seen at compile time" in check.failure_reason(*good)


def test_exceptions_in_guards_are_misses():
    check = _check([Guard(AttrSource(LocalSource("o"), "value"), GuardKind.CONSTANT_MATCH, 1)],
                   ["o"])

    class Obj:
        value = 1

    assert check(Obj())
    assert not check(object())
    assert "AttributeError" in check.failure_reason(object())


def test_grad_mode_guard():
    check = _check([Guard(None, GuardKind.GRAD_MODE, True)], ["x"])
    assert check(1)
    with torch.no_grad():
        assert not check(1)
        assert "grad mode" in check.failure_reason(1)


def test_unguardable_sources_are_dropped():
    from kiln_frontend.sources import ClosureSource

    gs = GuardSet()
    gs.add(Guard(ClosureSource("k"), GuardKind.CONSTANT_MATCH, 1))
    assert len(gs) == 0


def test_guard_set_deduplicates_and_orders():
    gs = GuardSet()
    t = torch.randn(1)
    gs.add(Guard(AttrSource(LocalSource("self"), "w"), GuardKind.TENSOR_MATCH, G.TensorGuard(t)))
    gs.add(Guard(LocalSource("self"), GuardKind.NN_MODULE, (1, True)))
    gs.add(Guard(LocalSource("self"), GuardKind.NN_MODULE, (1, True)))
    ordered = gs.sorted()
    assert len(ordered) == 2
    assert ordered[0].kind is GuardKind.NN_MODULE  # the base is checked before its attributes


def test_a_torch_state_guard_looks_nothing_up_on_disk():
    """A folded ``torch.is_autocast_enabled()`` is guarded at every call; the check reads
    the module from sys.modules (``__import__('torch', fromlist=['_'])`` searched the import
    path for a submodule ``torch._`` each time: a filesystem lookup per call)."""
    import sys

    from kiln_frontend import compile as kiln_compile

    class Spy:
        calls = 0

        def find_spec(self, name, path=None, target=None):
            Spy.calls += 1
            return None

    def f(x):
        return x + 1 if torch.is_autocast_enabled() else x - 1

    compiled = kiln_compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    compiled(x)
    spy = Spy()
    sys.meta_path.insert(0, spy)
    try:
        for _ in range(3):
            torch.testing.assert_close(compiled(x), x - 1)
    finally:
        sys.meta_path.remove(spy)
    assert Spy.calls == 0


class _KeyA:
    pass


class _KeyB:
    pass


def test_a_class_dict_key_guard_imports_nothing_per_call():
    """A dict keyed by a class (``{torch.Tensor: x}``) whose item has a shape guard: the
    check names the key by a name bound in its scope.  It was ``d[__import__('torch',
    fromlist=['_']).Tensor]``, run at every call: importlib's Python, and for a package a
    search of the import path for ``torch._`` (about 0.1 ms per call)."""
    import builtins
    import sys

    from kiln_frontend import compile as kiln_compile
    from kiln_frontend.eval_frame import cache_entries

    class Spy:
        finds = 0
        imports = 0

        def find_spec(self, name, path=None, target=None):
            Spy.finds += 1
            return None

    def f(d):
        x = d[torch.Tensor]
        if x.shape[0] > 2:
            return x * 2 + d["b"]
        return x

    compiled = kiln_compile(f, backend="eager", fullgraph=True)
    for n in (3, 4, 5):  # the third size is dynamic: a python leaf over d[<key>].size()
        d = {torch.Tensor: torch.randn(n), "b": torch.randn(n)}
        torch.testing.assert_close(compiled(d), f(d))
    code = "".join(entry[0].code for entry in cache_entries(f.__code__))
    assert "d[___key_torch_Tensor].size()[0] > 2" in code and "__import__" not in code
    real_import = builtins.__import__

    def counting_import(*args, **kwargs):
        Spy.imports += 1
        return real_import(*args, **kwargs)

    ins = [{torch.Tensor: torch.randn(n), "b": torch.randn(n)} for n in (6, 7)]
    spy = Spy()
    sys.meta_path.insert(0, spy)
    builtins.__import__ = counting_import
    try:
        outs = [compiled(d) for d in ins]
    finally:
        builtins.__import__ = real_import
        sys.meta_path.remove(spy)
    assert (Spy.finds, Spy.imports) == (0, 0)
    for d, out in zip(ins, outs, strict=True):
        torch.testing.assert_close(out, f(d))


def test_class_dict_keys_are_guarded_by_identity():
    """Two key classes: each bound under its own name; a dict with the other key recompiles
    and is right."""
    from kiln_frontend import compile as kiln_compile

    def f(d):
        for k in d:
            return d[k] * (2 if k is _KeyA else 3)

    compiled = kiln_compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    for key in (_KeyA, _KeyB, _KeyA):
        torch.testing.assert_close(compiled({key: x}), f({key: x}))
    from kiln_frontend.sources import guard_constant, index_expr

    assert index_expr(_KeyA) != index_expr(_KeyB)
    assert guard_constant(_KeyA, "x") == index_expr(_KeyA)  # one name per object
