"""Guards on a dict keyed by modules do not keep the modules alive (issue 30's leak).

A compiled frame's cache entry (its guard tree, its Guard list, the check expressions'
constants) used to hold such keys strongly, and the tracker pinned each one as a global of
the frame's module: a model used as a dict key lived as long as the process.  Now the key is
reached from its dict (``DictKeySource``) and held weakly (``WeakKey``); a guard that reads a
key that died fails, and the check's scope holds only the constants its expressions use.
"""

from __future__ import annotations

import gc
import weakref

import torch
from kiln_frontend import compile as kiln_compile
from kiln_frontend.eval_frame import cache_entries
from kiln_frontend.guards import Guard, GuardKind, build_check_fn
from kiln_frontend.sources import (
    GUARD_CONSTANTS,
    GetItemSource,
    LocalSource,
    WeakKey,
    guard_constant,
)


def _scale_by_values(d, x):
    for _key, value in d.items():
        x = x * value
    return x


def _scale_by_key(d, m, x):
    return x * d[m]


def _entries(fn):
    return [entry[0] for entry in cache_entries(fn.__code__)]


def test_module_keys_of_a_guarded_dict_are_freed():
    """Iterating a module-keyed dict: once the caller drops the module, nothing kiln holds
    keeps it; the compiled function then recompiles for a new dict and gives eager's
    result."""
    compiled = kiln_compile(_scale_by_values, backend="eager")
    m = torch.nn.Linear(2, 2)
    d = {m: 3.0}
    x = torch.randn(3)
    torch.testing.assert_close(compiled(d, x), _scale_by_values(d, x))
    ref = weakref.ref(m)
    del d, m
    gc.collect()
    assert ref() is None
    d = {torch.nn.Linear(2, 2): 5.0}
    torch.testing.assert_close(compiled(d, x), _scale_by_values(d, x))


def test_module_key_looked_up_by_argument_is_freed():
    """``d[m]`` with the module passed in: the item node, the keys leaf and the Guard list
    hold the key weakly."""
    compiled = kiln_compile(_scale_by_key, backend="eager")
    m = torch.nn.Linear(2, 2)
    d = {m: 3.0}
    x = torch.randn(3)
    torch.testing.assert_close(compiled(d, m, x), _scale_by_key(d, m, x))
    assert _entries(_scale_by_key)
    ref = weakref.ref(m)
    del d, m
    gc.collect()
    assert ref() is None
    m2 = torch.nn.Linear(2, 2)
    d = {m2: 7.0}
    torch.testing.assert_close(compiled(d, m2, x), _scale_by_key(d, m2, x))


def test_guard_on_a_dead_key_fails():
    """A check whose key died answers no (an object reusing the address cannot pass), and
    failure_reason says why instead of raising."""
    m = torch.nn.Linear(2, 2)
    src = GetItemSource(LocalSource("d"), m)
    assert type(src.index) is WeakKey
    guards = [Guard(LocalSource("d"), GuardKind.DICT_KEYS, (dict, (m,))),
              Guard(src, GuardKind.CONSTANT_MATCH, 3.0)]
    check = build_check_fn(guards, ["d"], {})
    assert check({m: 3.0}) and not check({m: 4.0})
    other = torch.nn.Linear(2, 2)
    assert not check({other: 3.0})
    del m
    gc.collect()
    assert not check({other: 3.0})
    assert "no longer exists" in check.failure_reason({other: 3.0}) or \
        "keys" in check.failure_reason({other: 3.0})


def test_guard_constants_hold_modules_weakly_and_drop_them():
    """A module registered as a guard constant (a python leaf's ``d[___key_Linear()]``) is
    held weakly; its entry goes when it dies."""
    m = torch.nn.Linear(2, 2)
    expr = guard_constant(m, "key_Linear")
    name = expr.removesuffix("()")
    assert expr.endswith("()") and GUARD_CONSTANTS[name]() is m
    ref = weakref.ref(m)
    del m
    gc.collect()
    assert ref() is None and name not in GUARD_CONSTANTS


def test_dynamic_size_of_a_module_keyed_value_is_freed():
    """A shape guard (a python leaf) reading ``d[<module>].size()``: its scope holds the key
    weakly, and holds none of the other registered guard constants."""

    def f(d, m):
        v = d[m]
        if v.shape[0] > 2:
            return v * 2
        return v

    compiled = kiln_compile(f, backend="eager")
    unrelated = torch.nn.Linear(1, 1)
    guard_constant(unrelated, "key_unrelated")
    m = torch.nn.Linear(2, 2)
    for n in (3, 4, 5):  # the third size is dynamic
        d = {m: torch.randn(n)}
        torch.testing.assert_close(compiled(d, m), f(d, m))
    code = "".join(entry.code for entry in _entries(f))
    assert "___key_Linear" in code
    scopes = [s for entry in _entries(f) for s in _check_scopes(entry)]
    assert any("___key_Linear" in k for s in scopes for k in s)
    assert not any("unrelated" in k for s in scopes for k in s)
    ref = weakref.ref(m)
    del d, m
    gc.collect()
    assert ref() is None
    m = torch.nn.Linear(2, 2)
    d = {m: torch.randn(6)}
    torch.testing.assert_close(compiled(d, m), f(d, m))


def _check_scopes(check):
    """The scope a check's python leaves run in (the failure-reason closures keep it)."""
    todo, seen = [check.failure_reason], set()
    while todo:
        fn = todo.pop()
        for cell in fn.__closure__ or ():
            value = cell.cell_contents
            if isinstance(value, dict) and "G" in value and id(value) not in seen:
                seen.add(id(value))
                yield value
            elif callable(value) and getattr(value, "__closure__", None):
                todo.append(value)
