"""Lists, tuples, dicts, sets and the collections module in captured frames, in the style
of TorchDynamo's test_list.py, test_dicts.py and test_sets.py (issue 27). Each case is
checked against eager and against torch.compile's graph count (``_reference_cases``)."""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from _reference_cases import Cases
from _reference_cases import randn_input as _x

pytestmark = pytest.mark.usefixtures("fresh_frontend")


case = Cases(_x)


# -- lists -------------------------------------------------------------------------------

@case.program
def list_methods(x):
    lst = [x, x + 1]
    lst.append(x * 2)
    lst.extend([x * 3, x * 4])
    lst.insert(0, x - 1)
    last = lst.pop()
    first = lst.pop(0)
    lst.remove(lst[0])
    lst.reverse()
    return lst, last + first, len(lst)


@case.program
def list_index_count_of_ints(x):
    lst = [3, 1, 4, 1, 5]
    lst.sort()
    return x * lst.index(4) + lst.count(1), lst


@case.program
def list_slicing_assign_and_delete(x):
    lst = [x * i for i in range(6)]
    lst[1:3] = [x, x]
    del lst[::2]
    lst[-1] = lst[-1] + 100
    return lst


@case
def list_argument_mutated(C):
    def f(xs, x):
        xs.append(x.sin())
        xs[0] = xs[0] + 1
        return len(xs)

    xs = [_x(), _x()]
    r = C(f)(xs, _x())
    return r, xs


@case.program
def list_copy_and_multiply(x):
    a = [x, x + 1]
    b = a.copy()
    b.append(x)
    c = a * 2
    d = [0] * 3
    return len(a), len(b), c, d


@case.program
def list_comparison_and_contains(x):
    a = [1, 2, 3]
    return x + (a == [1, 2, 3]) + (a < [1, 2, 4]) + (2 in a) + (5 not in a)


@case.program
def list_of_lists_nested_mutation(x):
    grid = [[x * (i + j) for j in range(2)] for i in range(2)]
    grid[1][0] = grid[1][0] + 10
    return [sum(row) for row in grid]


@case
def list_sort_with_key_on_tensors_shapes(C):
    def f(a, b, c):
        ts = [a, b, c]
        ts.sort(key=lambda t: t.shape[0], reverse=True)
        return [t.sum() for t in ts]

    return C(f)(_x(3), _x(5), _x(1))


@case
def list_argument_sorted_in_place(C):
    def f(ns, x):
        ns.sort(reverse=True)
        return x * ns[0]

    ns = [3, 1, 2]
    return C(f)(ns, _x()), ns


@case.program
def list_remove_missing_raises(x):
    lst = [1, 2]
    try:
        lst.remove(5)
    except ValueError as e:
        return x + len(lst), str(e)
    return x


@case.program
def dict_popitem_order_and_empty(x):
    d = {"a": x, "b": x + 1}
    k1, _ = d.popitem()
    k2, v2 = d.popitem()
    try:
        d.popitem()
    except KeyError:
        return v2 * 2, k1 + k2
    return x, ""


@case.program
def list_clear_and_reuse(x):
    buf = [x]
    buf.clear()
    buf += [x + 1, x + 2]
    return buf


@case.program
def tuple_methods_and_concat(x):
    t = (1, 2, 2, 3)
    u = t + (4,)
    return x * t.count(2) + u.index(3), u[1:3], tuple(reversed(u))


@case
def list_enumerate_in_place_assignment(C):
    def f(xs):
        for i, t in enumerate(xs):
            xs[i] = t * i
        return xs

    return C(f)([_x(), _x(), _x()])


# -- dicts -------------------------------------------------------------------------------

@case
def dict_methods(C):
    def f(x):
        d = {"a": x, "b": x + 1}
        d.update({"c": x * 2}, e=x - 1)
        d.setdefault("a", x * 100)
        d.setdefault("f", x * 3)
        v = d.pop("b")
        g = d.get("zzz", x * 0)
        k, last = d.popitem()
        return list(d.keys()), v + g, k, last

    return C(f)(_x())


@case.program
def dict_iteration_forms(x):
    d = {"a": 1, "b": 2, "c": 3}
    out = x
    for k in d:
        out = out + d[k]
    for _k, v in d.items():
        out = out * v
    return out + sum(d.values()), len(d)


@case
def dict_argument_mutated(C):
    def f(d, x):
        d["new"] = x * 2
        d["a"] = d["a"] + 1
        del d["b"]
        return len(d)

    d = {"a": _x(), "b": _x()}
    r = C(f)(d, _x())
    return r, d


@case
def dict_comprehension_and_merge(C):
    def f(x):
        a = {f"k{i}": x * i for i in range(3)}
        b = {"z": x}
        c = a | b
        a |= {"k0": x + 5}
        return c, a

    return C(f)(_x())


@case.program
def dict_fromkeys_and_copy(x):
    d = dict.fromkeys(["a", "b"], 0)
    e = d.copy()
    e["a"] = 5
    return x + d["a"] + e["a"], sorted(e)


@case.program
def dict_int_and_tuple_keys(x):
    d = {0: x, (1, 2): x + 1, 2.5: x * 2}
    return d[0] + d[(1, 2)] + d[2.5], (1, 2) in d, 3 in d


@case.program
def dict_keys_view_set_ops(x):
    a = {"a": 1, "b": 2}
    b = {"b": 3, "c": 4}
    common = a.keys() & b.keys()
    both = a.keys() | b.keys()
    return x * len(common) + len(both), sorted(both)


@case.program
def dict_of_tensors_returned(x):
    return {"sin": x.sin(), "cos": x.cos(), "n": x.shape[0]}


@case
def dict_kwargs_passthrough(C):
    def g(**kw):
        return {k: v * 2 for k, v in kw.items()}

    def f(x):
        kw = dict(a=x, b=x + 1)
        return g(**kw)

    return C(f)(_x())


@case.program
def dict_equality(x):
    a = {"a": 1, "b": 2}
    return x + (a == {"b": 2, "a": 1}) + (a != {"a": 1})


@case
def dict_module_keys(C):
    lin = torch.nn.Linear(4, 4)
    relu = torch.nn.ReLU()

    def f(x):
        d = {lin: 2, relu: 3}
        return d[lin] * lin(x) + d[relu]

    return C(f)(_x())


@case
def set_of_modules_add_discard_and_iterate(C):
    # (a set of modules iterates in the order of their ids, which differ between the eager
    # and the compiled run's modules: the result does not depend on it)
    mods = [torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4)]

    def f(x):
        s = {mods[2], mods[0]}
        s.add(mods[1])
        s.discard(mods[2])
        total = sum(m(x) for m in s)
        return total, len(s), sorted(type(m).__name__ for m in s), mods[2] in s, 1 in s

    return C(f)(_x())


def test_set_of_modules_iterates_in_eagers_order():
    """The same modules in a set iterate in the same order compiled as eagerly."""
    import kiln_frontend
    from _counting_backend import CountingBackend

    mods = [torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.ReLU(), torch.nn.Linear(4, 4)]

    def f(x):
        s = set()
        for m in mods[::-1] + mods:
            s.add(m)
        s.discard(mods[1])
        return list(s), x + 1

    expected = f(_x())
    backend = CountingBackend()
    actual = kiln_frontend.compile(f, backend=backend, fullgraph=True)(_x())
    assert actual[0] == expected[0]
    assert len(backend.graphs) == 1


# -- sets --------------------------------------------------------------------------------

@case.program
def set_operations(x):
    a = {1, 2, 3}
    b = {2, 3, 4}
    u, i, d, s = a | b, a & b, a - b, a ^ b
    return x * len(u) + sum(i) + sum(d) + sum(s), sorted(u)


@case.program
def set_methods(x):
    s = set()
    s.add(1)
    s.add(1)
    s.update([2, 3])
    s.discard(5)
    s.remove(2)
    t = s.union({9}).intersection({1, 9})
    return x + len(s) + len(t), 1 in s, s.issubset({1, 3, 4}), s.isdisjoint({7})


@case.program
def set_inplace_operators(x):
    s = {1, 2}
    s |= {3}
    s &= {1, 3}
    s -= {1}
    return x * sum(s), sorted(s)


@case
def set_of_strings_membership(C):
    allowed = {"relu", "gelu"}

    def f(x, name):
        if name in allowed:
            return getattr(torch.nn.functional, name)(x)
        return x

    g = C(f)
    return g(_x(), "relu"), g(_x(), "gelu")


@case.program
def frozenset_operations(x):
    a = frozenset([1, 2, 3])
    b = a | {4}
    return x * len(b) + (3 in a), type(b) is frozenset, sorted(b)


@case.program
def set_comprehension(x):
    s = {i % 3 for i in range(10)}
    return x * len(s), sorted(s)


@case.program
def set_pop_and_len(x):
    s = {7}
    v = s.pop()
    return x * v + len(s)


@case.program
def set_pop_of_two_items_gives_eagers_item(x):
    s = {7, 3}
    v = s.pop()
    return x * v + len(s), s


@case.program
def set_pops_after_growth_and_removals(x):
    # strings hash per process, many items resize the table, removals leave dummies: every
    # pop must be the item the real set gives (its table and its pop position)
    s = {f"k{i}" for i in range(23)}
    s.discard("k5")
    s.add("z")
    got = [s.pop() for _ in range(6)]
    s.update(["k5", "q"])
    got += [s.pop() for _ in range(4)]
    c = s.copy()  # a copy and a union pop by their own tables
    u = s | {"w", "k1"}
    got += [c.pop(), c.pop(), u.pop(), u.pop()]
    return x * len(got), got, sorted(s)


def test_set_pops_after_growth_are_one_graph():
    """torch.compile pops the wrong items here (skipped as a reference above); kiln pops
    eager's, in one graph."""
    from _counting_backend import CountingBackend
    from kiln_frontend import compile as kiln_compile

    x = _x()
    backend = CountingBackend()
    out, got, rest = kiln_compile(set_pops_after_growth_and_removals, backend=backend,
                                  fullgraph=True)(x)
    eager_out, eager_got, eager_rest = set_pops_after_growth_and_removals(x)
    torch.testing.assert_close(out, eager_out)
    assert (got, rest) == (eager_got, eager_rest)
    assert len(backend.graphs) == 1


def test_set_pop_of_an_argument_set_is_right():
    """A set from the frame has a pop position kiln cannot see: its pop runs in Python
    (a graph break), and the item and the set after are eager's."""
    from kiln_frontend import compile as kiln_compile

    def f(x, s):
        v = s.pop()
        return x * len(v), v

    real, mine = {"a", "bb", "ccc"}, {"a", "bb", "ccc"}
    real.pop()  # moves the pop position of both the same way
    mine.pop()
    x = _x()
    out, v = kiln_compile(f, backend="eager")(x, mine)
    eager_out, eager_v = f(x, real)
    assert v == eager_v and mine == real
    torch.testing.assert_close(out, eager_out)


@case
def set_of_tensors_identity(C):
    def f(x, y):
        s = {x, y}
        s.add(x)
        return len(s), x in s

    return C(f)(_x(), _x())


@case
def set_of_modules(C):
    mods = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)]

    def f(x):
        seen = set()
        for m in mods + mods:
            if m not in seen:
                seen.add(m)
                x = m(x)
        return x

    return C(f)(_x())


# -- collections -------------------------------------------------------------------------

@case.program
def deque_rotate_and_maxlen(x):
    d = collections.deque([x, x + 1, x + 2], maxlen=3)
    d.append(x * 10)
    d.rotate(1)
    d.appendleft(x - 5)
    return list(d)


@case.program
def deque_popleft_loop(x):
    q = collections.deque([1, 2, 3])
    out = x
    while q:
        out = out * q.popleft()
    return out


@case.program
def ordered_dict_move_to_end(x):
    od = collections.OrderedDict(a=x, b=x + 1, c=x + 2)
    od.move_to_end("a")
    od.popitem(last=False)
    return list(od.keys()), od["a"]


@case.program
def defaultdict_list_grouping(x):
    groups = collections.defaultdict(list)
    for i in range(5):
        groups[i % 2].append(x * i)
    return [sum(groups[k]) for k in sorted(groups)]


@case.program
def defaultdict_int_counting(x):
    counts = collections.defaultdict(int)
    for w in "abracadabra":
        counts[w] += 1
    return x * counts["a"], dict(counts)


@case.program
def counter_most_common(x):
    c = collections.Counter("hello world")
    top = c.most_common(1)[0]
    return x * top[1], top[0], c["z"]


@case
def namedtuple_defaults_and_asdict(C):
    P = collections.namedtuple("P", ["a", "b", "c"], defaults=[0, 1])

    def f(x):
        p = P(x)
        d = p._asdict()
        return p.a + p.b + p.c, list(d)

    return C(f)(_x())


@case
def namedtuple_argument_and_unpack(C):
    P = collections.namedtuple("P", ["w", "b"])

    def f(p, x):
        w, b = p
        return x * w + b, p.w * 2

    return C(f)(P(_x(), _x()), _x())


Span = collections.namedtuple("Span", ["lo", "hi"])


@case.program
def namedtuple_returned_from_frame(x):
    return Span(x.min(), x.max())


@case.program
def chainmap_lookup(x):
    cm = collections.ChainMap({"a": 1}, {"a": 2, "b": 3})
    return x * cm["a"] + cm["b"]


# -- dataclasses -------------------------------------------------------------------------

@dataclasses.dataclass
class Config:
    scale: float = 2.0
    shift: int = 1
    names: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Frozen:
    k: int
    t: torch.Tensor


@case
def dataclass_argument(C):
    def f(x, cfg):
        return x * cfg.scale + cfg.shift + len(cfg.names)

    return C(f)(_x(), Config(3.0, 2, ["a"]))


@case.program
def dataclass_made_in_frame(x):
    cfg = Config(scale=0.5)
    cfg.shift = 4
    return x * cfg.scale + cfg.shift


@case.program
def dataclass_frozen_with_tensor(x):
    fz = Frozen(3, x.sin())
    return fz.t * fz.k


@case.program
def dataclass_equality(x):
    return x + (Config(1.0) == Config(1.0)) + (Config(1.0) == Config(2.0))


@case.program
def dataclass_returned(x):
    return Config(scale=x.sum().item() * 0 + 1.5, shift=2)


@case
def dataclass_mutated_argument(C):
    def f(cfg, x):
        cfg.names.append("seen")
        cfg.scale = cfg.scale * 2
        return x * cfg.scale

    cfg = Config()
    r = C(f)(cfg, _x())
    return r, cfg.scale, cfg.names


test_matches_torch_compile, test_gives_eagers_answer = case.tests(__file__)
