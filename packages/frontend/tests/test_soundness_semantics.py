"""Soundness of Python semantics inside a captured frame (issue 25): what the symbolic
interpreter decides while tracing must be what eager Python does.

Each case is a function and a factory of fresh arguments. It runs eagerly, then compiled
with ``kiln_frontend.compile`` (backend ``"eager"`` and a backend that runs the captured
graph, ``gm.forward``); results, the final state of the arguments (containers the frame
mutates) and a raised exception's type must match. Kinds: dict and set views, identity of
in-place results and of containers, exceptions from builtins and attribute lookups caught in
the frame, lazy iteration and generator side effects, iterator exhaustion, ``is``/``==`` of
aliases, mutation during iteration.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import kiln_frontend
import pytest
import torch
from torch.testing import assert_close

pytestmark = pytest.mark.usefixtures("fresh_frontend")


def _graph_backend(gm, example_inputs):
    return gm.forward


BACKENDS = {"eager": "eager", "graph": _graph_backend}

#: name -> (fn, args factory, fullgraph)
CASES: dict[str, tuple[Callable[..., Any], Callable[[], tuple], bool]] = {}


def case(name: str, *, fullgraph: bool = False, args: Callable[[], tuple] | None = None):
    def deco(fn):
        if name in CASES:
            raise ValueError(f"duplicate case {name!r}")
        CASES[name] = (fn, args or (lambda: (torch.ones(3),)), fullgraph)
        return fn

    return deco


def _compare(got: Any, expected: Any, where: str) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: {got!r} is not a tensor"
        assert_close(got, expected, msg=lambda m: f"{where}: {m}")
        return
    assert type(got) is type(expected), f"{where}: {type(got)} != {type(expected)}"
    if isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), f"{where}: {got!r} != {expected!r}"
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            _compare(g, e, f"{where}[{i}]")
    elif isinstance(expected, dict):
        assert list(got) == list(expected), f"{where}: keys {list(got)} != {list(expected)}"
        for k in expected:
            _compare(got[k], expected[k], f"{where}[{k!r}]")
    else:
        assert got == expected, f"{where}: {got!r} != {expected!r}"


def _call(fn, args):
    try:
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 - compared with the compiled run
        return None, type(e)


class _Obj:
    def __init__(self):
        self.a = 1

    def __eq__(self, other):  # the final state of an argument is compared
        return type(other) is _Obj and vars(self) == vars(other)

    __hash__ = None


# -- dict views (item 1) --------------------------------------------------------------------


@case("dict_keys_view_sees_later_insert")
def _(x):
    d = {1: x, 2: x}
    keys = d.keys()
    d[4] = x * 2
    return x + 1, 4 in keys, len(keys), list(keys)


@case("dict_views_live_under_fullgraph", fullgraph=True)
def _(x):
    d = {1: x, 2: x}
    keys, vals, items = d.keys(), d.values(), d.items()
    d[4] = x * 2
    return x + len(vals), 4 in keys, list(vals)[-1], list(items)[-1][0]


@case("dict_values_view_after_pop")
def _(x):
    d = {"a": x, "b": x * 2}
    vals = d.values()
    d.pop("a")
    return len(vals), list(vals)


@case("dict_items_view_membership_and_iteration")
def _(x):
    d = {1: 2, 3: 4}
    items = d.items()
    d[5] = 6
    return x + 1, (5, 6) in items, (1, 3) in items, [k + v for k, v in items]


@case("dict_keys_set_operations")
def _(x):
    d = {1: x, 2: x, 3: x}
    k = d.keys()
    d[7] = x
    return x + 1, k & {1, 7, 9}, k - {1}, k | {10}, k ^ {1, 11}, k == {1, 2, 3, 7}


@case("dict_keys_reversed_and_sorted")
def _(x):
    d = {3: 0, 1: 0}
    k = d.keys()
    d[2] = 0
    return x + 1, list(reversed(k)), sorted(k), tuple(k), bool(k)


@case("dict_view_across_graph_break")
def _(x):
    d = {"a": x}
    k = d.keys()
    print("graph break")
    d["b"] = x
    return x + 1, list(k), len(k)


@case("dict_view_of_argument_dict", args=lambda: (torch.ones(3), {"a": 1}))
def _(x, d):
    k = d.keys()
    d["b"] = 2
    return x + len(k), list(k)


# -- identity of in-place results (item 2) ----------------------------------------------------


@case("inplace_methods_return_self")
def _(x):
    y = x.clone()
    return (y, y.add_(1) is y, y.mul_(2) is y, y.zero_() is y, y.copy_(x) is y,
            y.clamp_(0, 1) is y, y.unsqueeze_(0) is y, y.shape)


@case("inplace_out_kwarg_returns_out", fullgraph=True)
def _(x):
    y = torch.empty(3)
    r = torch.add(x, 1, out=y)
    return r is y, y


@case("inplace_on_input_is_input", args=lambda: (torch.ones(3),))
def _(x):
    r = x.add_(1)
    return r is x, x.mul_(3) is r


@case("out_tuple_returns_the_out_tensors", fullgraph=True,
      args=lambda: (torch.arange(12.0).reshape(3, 4),))
def _(x):
    v, i = torch.empty(4), torch.empty(4, dtype=torch.long)
    r = torch.max(x, 0, out=(v, i))
    return r[0] is v, r[1] is i, r.values is v, v, i


@case("requires_grad_returns_self")
def _(x):
    y = x.clone()
    return y.requires_grad_() is y, y.requires_grad


@case("inplace_identity_across_graph_break")
def _(x):
    y = x.clone()
    z = y.add_(1)
    print("graph break")
    return z is y, y, z


@case("contiguous_of_contiguous_is_self")
def _(x):
    return x.contiguous() is x, x.t().contiguous() is x


# -- identity and equality of containers -----------------------------------------------------


@case("list_alias_identity_and_mutation")
def _(x):
    a = [x]
    b = a
    b.append(x * 2)
    return a is b, a == b, len(a), a


@case("container_equality_compares_identity_first", fullgraph=True)
def _(x):
    a, b = [x, 1], [x, 1]
    return (x + 1, a == b, a is b, a != [x, 2], a == (x, 1), [a] == [b],
            {"k": x} == {"k": x}, {"k": x} == {"j": x})


@case("set_inplace_operators_change_the_set", fullgraph=True)
def _(x):
    s = {1, 2, 3}
    t = s
    t -= {1}
    t &= {2, 9}
    t |= {40, 7}
    u = s | {8}
    return x + 1, sorted(s), t is s, list(s), list(u), u is s


@case("list_inplace_repeat_and_extend_keep_alias", fullgraph=True)
def _(x):
    a = [1]
    b = a
    a *= 3
    a += (5, 6)
    return x + 1, a, b, a is b


@case("dict_inplace_merge_keeps_alias", fullgraph=True)
def _(x):
    d = {"a": 1}
    e = d
    e |= {"b": 2}
    f = d | {"c": 3}
    return x + 1, d, e is d, f, f is d


@case("set_inplace_with_a_list_raises_type_error")
def _(x):
    s = {1}
    try:
        s |= [2]
    except TypeError:
        return x * 2
    return x


@case("list_copy_is_not_alias")
def _(x):
    a = [1, 2]
    b = a.copy()
    b.append(3)
    return x + 1, a is b, a == b, a, b


@case("returned_aliases_stay_one_object")
def _(x):
    a = [x + 1]
    return a, a


@case("dict_alias_sees_mutation", args=lambda: (torch.ones(3), {"k": 1}))
def _(x, d):
    e = d
    e["j"] = 2
    return x + 1, d is e, d == {"k": 1, "j": 2}


# -- exceptions raised in the frame, caught there (items 6, 7) ---------------------------------


@case("zip_strict_unequal_raises_value_error")
def _(x):
    try:
        r = list(zip([1, 2, 3], [1, 2], strict=True))
        return x * len(r)
    except ValueError:
        return x * 10


@case("zip_strict_first_shorter_raises")
def _(x):
    try:
        return x * len(list(zip([1], [1, 2], strict=True)))
    except ValueError:
        return x * 10


@case("zip_not_strict_stops_at_shortest")
def _(x):
    return x * len(list(zip([1, 2, 3], [1, 2], strict=False)))


@case("missing_attribute_caught_in_frame")
def _(x):
    o = _Obj()
    try:
        o.missing  # noqa: B018 - the lookup is the point
        return x * 2
    except AttributeError:
        return x * 3


@case("missing_attribute_of_argument_caught", args=lambda: (torch.ones(3), _Obj()))
def _(x, o):
    try:
        o.missing  # noqa: B018
        return x * 2
    except AttributeError:
        return x * 3


@case("missing_attribute_caught_under_fullgraph", fullgraph=True)
def _(x):
    o = _Obj()
    try:
        return x * o.missing
    except AttributeError:
        return x * getattr(o, "other", 3)


@case("missing_attribute_of_argument_under_fullgraph", fullgraph=True,
      args=lambda: (torch.ones(3), _Obj()))
def _(x, o):
    try:
        return x * o.missing
    except AttributeError:
        return x * 3


def _read_missing(o):
    try:
        return o.nope
    except AttributeError:
        return 4


@case("missing_attribute_caught_in_inlined_function")
def _(x):
    return x * _read_missing(_Obj())


@case("getattr_default_and_hasattr", args=lambda: (torch.ones(3), _Obj()))
def _(x, o):
    return x * getattr(o, "missing", 5), hasattr(o, "a"), hasattr(o, "missing")


@case("index_error_caught")
def _(x):
    lst = [1, 2]
    try:
        return x * lst[5]
    except IndexError:
        return x * 7


@case("key_error_caught")
def _(x):
    d = {"a": 1}
    try:
        return x * d["b"]
    except KeyError:
        return x * 7


@case("dict_pop_missing_key_error_caught")
def _(x):
    d = {"a": 1}
    try:
        d.pop("b")
        return x
    except KeyError:
        return x * 7


@case("zero_division_caught")
def _(x):
    n = 0
    try:
        return x * (1 // n)
    except ZeroDivisionError:
        return x * 7


@case("int_of_bad_string_value_error_caught")
def _(x):
    try:
        int("abc")
    except ValueError:
        return x * 3
    return x


@case("max_of_empty_value_error_caught")
def _(x):
    try:
        return x * max([])
    except ValueError:
        return x * 3


@case("list_pop_empty_index_error_caught")
def _(x):
    lst = []
    try:
        lst.pop()
        return x
    except IndexError:
        return x * 3


@case("list_index_missing_value_error_caught")
def _(x):
    try:
        return x * [1, 2].index(5)
    except ValueError:
        return x * 3


@case("exception_caught_inside_loop")
def _(x):
    d = {"a": 1}
    total = 0
    for k in ("a", "b", "a"):
        try:
            total += d[k]
        except KeyError:
            total += 10
    return x * total


@case("uncaught_key_error_propagates")
def _(x):
    d = {"a": 1}
    return x * d["b"]


# -- lazy iteration and generator side effects (item 8) -----------------------------------------


@case("list_extend_generator_reads_list")
def _(x):
    lst = [1]
    lst.extend(lst[-1] + i for i in range(3))
    return x * lst[-1], lst


@case("list_extend_itself_doubles")
def _(x):
    lst = [1, 2]
    lst.extend(lst)
    return x + 1, lst


@case("dict_update_generator_reads_dict")
def _(x):
    d = {"a": 1}

    def pairs():
        for k in ("b", "c"):
            yield k, len(d)

    d.update(pairs())
    return x + 1, d


@case("any_short_circuits_generator")
def _(x):
    seen = []

    def gen():
        for i in range(5):
            seen.append(i)
            yield i

    return x + 1, any(v == 2 for v in gen()), seen


@case("all_short_circuits_generator")
def _(x):
    seen = []

    def gen():
        for i in range(5):
            seen.append(i)
            yield i

    return x + 1, all(v < 1 for v in gen()), seen


@case("sum_of_generator_with_side_effects")
def _(x):
    seen = []

    def gen():
        for i in range(4):
            seen.append(i)
            yield i

    return x + sum(gen()), seen


@case("generator_body_runs_when_consumed")
def _(x):
    log = []

    def gen():
        log.append("start")
        yield 1
        log.append("after first")
        yield 2

    g = gen()
    log.append("made")
    a = next(g)
    log.append("got")
    return x + a, log


@case("map_is_lazy")
def _(x):
    calls = []

    def f(v):
        calls.append(v)
        return v * 2

    m = map(f, [1, 2, 3])
    first = next(m)
    return x + first, list(calls)


@case("filter_is_lazy")
def _(x):
    calls = []

    def keep(v):
        calls.append(v)
        return v > 1

    f = filter(keep, [1, 2, 3])
    first = next(f)
    return x + first, list(calls)


@case("zip_over_generator_pulls_in_order")
def _(x):
    log = []

    def gen(tag):
        for i in range(3):
            log.append((tag, i))
            yield i

    pairs = list(zip(gen("a"), gen("b"), strict=False))
    return x + len(pairs), log, pairs


@case("next_interleaved_with_for_loop")
def _(x):
    it = iter([1, 2, 3, 4, 5])
    out = []
    for v in it:
        out.append(v)
        out.append(next(it, None))
    return x + 1, out


@case("iterator_exhaustion_is_sticky")
def _(x):
    lst = [1]
    it = iter(lst)
    first = list(it)
    lst.append(2)
    return x + 1, first, list(it)


@case("exhausted_generator_stays_empty")
def _(x):
    g = (i for i in range(2))
    a = list(g)
    return x + 1, a, list(g), next(g, "done")


@case("stop_iteration_caught")
def _(x):
    it = iter([1])
    next(it)
    try:
        next(it)
        return x
    except StopIteration:
        return x * 7


@case("list_iterator_sees_appended_items")
def _(x):
    lst = [1, 2]
    it = iter(lst)
    lst.append(3)
    return x + 1, list(it)


@case("enumerate_over_generator_lazy")
def _(x):
    log = []

    def gen():
        for i in range(3):
            log.append(i)
            yield i

    e = enumerate(gen(), 1)
    first = next(e)
    return x + 1, first, list(log)


@case("generator_expression_reads_free_variable_when_run")
def _(x):
    n = 1
    g = (n * i for i in range(3))
    n = 10
    return x + n, list(g)


@case("stop_iteration_inside_generator_becomes_runtime_error")
def _(x):
    def gen():
        it = iter([1])
        while True:
            yield next(it)

    out = []
    try:
        for v in gen():
            out.append(v)
    except StopIteration:
        return x * 2, out
    except RuntimeError:
        return x * 3, out
    return x, out


@case("generator_unstarted_across_graph_break")
def _(x):
    gen = (i * 2 for i in range(3))
    print("graph break")
    return x + sum(gen)


@case("set_iteration_order_after_discard_and_add")
def _(x):
    s = {1, 2, 3, 100}
    s.discard(2)
    s.add(34)
    return x + 1, list(s), [v * 2 for v in s]


@case("set_update_from_generator_reads_set")
def _(x):
    s = {1}
    s.update(len(s) + i for i in range(3))
    return x + len(s), sorted(s)


@case("tensor_augmented_assignment_keeps_alias")
def _(x):
    y = x.clone()
    z = y
    z += 1
    z *= 2
    return z is y, y


# -- mutation during iteration --------------------------------------------------------------------


@case("list_grown_while_iterated")
def _(x):
    lst = [1, 2]
    out = []
    for v in lst:
        if v < 4:
            lst.append(v + 2)
        out.append(v)
    return x + len(out), out, lst


@case("dict_resized_while_iterated_raises")
def _(x):
    d = {1: 1}
    try:
        for k in d:
            d[k + 1] = 0
    except RuntimeError:
        return x * 2, d
    return x, d


@case("dict_keys_replaced_while_iterated_raises_eagers_error")
def _(x):
    d = {1: 1, 2: 2}
    try:
        for k in d:
            del d[k]
            d[k + 10] = 0
    except RuntimeError as e:
        return x * 2, d, e.args
    return x, d


@case("set_member_replaced_while_iterated")
def _(x):
    s = {1, 2}
    try:
        for v in s:
            s.discard(v)
            s.add(v + 100)
    except RuntimeError as e:
        return x * 2, e.args
    return x, sorted(s)


@case("dict_value_update_while_iterated_is_fine")
def _(x):
    d = {1: 1, 2: 2}
    for k in d:
        d[k] = d[k] * 10
    return x + 1, d


@case("set_resized_while_iterated_raises")
def _(x):
    s = {1, 2}
    try:
        for v in s:
            s.add(v + 10)
    except RuntimeError:
        return x * 2
    return x


@case("dict_items_resized_while_iterated_raises")
def _(x):
    d = {1: 1}
    try:
        for k, _v in d.items():
            d[k + 5] = 0
    except RuntimeError:
        return x * 2
    return x


# -- the test (after every case is registered) ---------------------------------------------------


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("name", list(CASES))
def test_semantics_match_eager(name, backend):
    fn, make_args, fullgraph = CASES[name]
    eager_args = make_args()
    compiled_args = copy.deepcopy(eager_args)
    expected, expected_exc = _call(fn, eager_args)
    compiled = kiln_frontend.compile(fn, backend=BACKENDS[backend], fullgraph=fullgraph)
    got, got_exc = _call(compiled, compiled_args)
    assert got_exc is expected_exc, f"raised {got_exc}, eager raised {expected_exc}"
    _compare(got, expected, "result")
    _compare(list(compiled_args), list(eager_args), "arguments after the call")


def _reads_globals(x):
    g = globals()
    return x * 2, "torch" in g, g is globals()


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_module_namespace_is_opaque_not_a_guarded_dict(backend):
    """globals() held across a graph break: kiln installs its compiled and resume functions
    in that very dict, so a guard on its keys failed at once (an internal error, the frame
    run eagerly); the namespace is an opaque object instead."""
    from kiln_frontend.eval_frame import counters

    compiled = kiln_frontend.compile(_reads_globals, backend=BACKENDS[backend])
    before = counters["internal_errors"]
    for _ in range(3):
        _compare(compiled(torch.ones(3)), _reads_globals(torch.ones(3)), "result")
    assert counters["internal_errors"] == before
