"""Parity cases for issue 27, a third batch of held-out-style programs, in forms the earlier
modules do not hold: generators paused across a graph break (next, send, throw, close
after it), exception chaining read back (``__cause__``, ``__context__``,
``__suppress_context__``), managers whose ``__exit__`` swallows, ``closing``,
``ExitStack.callback`` order, ``no_grad`` on an inlined method, closures sharing one cell,
int and float arguments that change between calls, ``unittest`` assertions not covered
before (``assertAlmostEqual``, ``assertRaises`` as a manager, ``assertCountEqual``...) and
builtins/stdlib (``itertools.chain.from_iterable``, ``accumulate`` with a function,
``groupby`` over modules, ``dataclasses.replace``/``asdict``, ``methodcaller``, dict views
and set algebra, frozen dataclasses as keys). Each is checked against eager and against
torch.compile's graph count (``_reference_cases``)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import operator
import unittest

import pytest
import torch
from _reference_cases import Cases
from _reference_cases import randn_input as _x
from torch import nn

pytestmark = pytest.mark.usefixtures("fresh_frontend")


case = Cases(_x)


# -- generators ----------------------------------------------------------------------------

def _ramp(x, n):
    for i in range(n):
        yield x * i


@case.program
def gen_paused_in_loop_across_break(x):
    g = _ramp(x, 4)
    first = next(g)
    print("break")
    return first, list(g)


def _guarded(x, log):
    try:
        yield x + 1
        yield x + 2
    finally:
        log.append("closed")


@case.program
def gen_paused_closed_after_break(x):
    log = []
    g = _guarded(x, log)
    a = next(g)
    print("break")
    g.close()
    return a, log


def _retrying(x):
    while True:
        try:
            yield x * 2
        except ValueError:
            yield x - 100


@case.program
def gen_paused_thrown_into_after_break(x):
    g = _retrying(x)
    a = next(g)
    print("break")
    b = g.throw(ValueError("again"))
    return a, b


def _averager():
    total, count = 0.0, 0
    avg = None
    while True:
        v = yield avg
        total, count = total + v, count + 1
        avg = total / count


@case.program
def gen_paused_sent_after_break(x):
    g = _averager()
    next(g)
    g.send(2.0)
    print("break")
    return x * g.send(4.0)


def _sub_total(xs):
    acc = 0
    for v in xs:
        acc = acc + v
        yield v
    return acc


def _delegating(xs):
    total = yield from _sub_total(xs)
    yield total * 10


@case.program
def gen_yield_from_sum_returned(x):
    return list(_delegating([x, x * 2]))


@case.program
def gen_round_robin_over_generators(x):
    gens = [_ramp(x, 2), _ramp(x + 1, 2)]
    out = []
    for _ in range(2):
        for g in gens:
            out.append(next(g))
    return out


def _reads_table(table):
    yield table["k"]
    yield table["k"]


@case.program
def gen_reads_dict_mutated_between_nexts(x):
    table = {"k": x}
    g = _reads_table(table)
    a = next(g)
    table["k"] = x * 3
    b = next(g)
    return a, b


@case.program
def gen_throw_into_unstarted_caught_in_frame(x):
    g = _ramp(x, 3)
    try:
        g.throw(KeyError("early"))
    except KeyError as e:
        return x + 1, e.args[0]
    return x


@case.program
def gen_next_default_after_exhausted(x):
    g = _ramp(x, 1)
    a = next(g)
    b = next(g, None)
    return a, b is None


@case.program
def gen_sum_with_tensor_start(x):
    return sum((x * i for i in range(1, 4)), x)


# -- exceptions ----------------------------------------------------------------------------

@case.program
def exc_cause_type_and_args_read(x):
    try:
        try:
            {}["missing"]
        except KeyError as inner:
            raise ValueError("wrapped") from inner
    except ValueError as e:
        return x * 2, type(e.__cause__).__name__, e.__cause__.args, e.__suppress_context__


@case.program
def exc_context_implicit_read(x):
    try:
        try:
            raise TypeError("first")
        except TypeError:
            raise RuntimeError("second")  # noqa: B904 - the case: implicit __context__
    except RuntimeError as e:
        return x + 1, type(e.__context__).__name__, str(e.__context__), e.__cause__ is None


@case.program
def exc_from_none_suppresses_context(x):
    try:
        try:
            raise TypeError("hidden")
        except TypeError:
            raise ValueError("shown") from None
    except ValueError as e:
        return x - 1, e.__cause__ is None, e.__suppress_context__


@case.program
def exc_message_formats_shape(x):
    try:
        if x.dim() != 2:
            raise ValueError(f"expected 2-d input, got shape {tuple(x.shape)} ({x.dim()}-d)")
    except ValueError as e:
        return x * 3, str(e)
    return x


class _CodedError(Exception):
    def __init__(self, code, where):
        super().__init__(f"code {code} at {where}")
        self.code = code


@case.program
def exc_user_class_super_init_message(x):
    try:
        raise _CodedError(7, "layer1")
    except _CodedError as e:
        return x * e.code, str(e), e.args


@case.program
def exc_try_except_else_finally_order(x):
    log = []
    for i in range(3):
        try:
            log.append(f"try{i}")
            if i == 1:
                raise IndexError(i)
        except IndexError:
            log.append("except")
        else:
            log.append("else")
        finally:
            log.append("finally")
    return x + len(log), log


def _nested_finally(x, log):
    try:
        try:
            return x + 1
        finally:
            log.append("inner")
    finally:
        log.append("outer")


@case.program
def exc_nested_finally_after_return(x):
    log = []
    return _nested_finally(x, log), log


@case
def exc_escapes_with_shape_message(C):
    def f(x):
        y = x * 2
        if y.shape[0] != 3:
            raise RuntimeError("size mismatch: {} vs {}".format(y.shape[0], 3))  # noqa: UP032
        return y

    try:
        C(f)(_x())
    except RuntimeError as e:
        return str(e)
    return "no error"


@case.program
def exc_notes_added_then_reraised(x):
    try:
        try:
            raise ValueError("v")
        except ValueError as e:
            e.add_note("while scaling")
            raise
    except ValueError as e:
        return x * 2, e.__notes__


@case.program
def exc_args_tuple_and_repr(x):
    try:
        raise ValueError("a", 1)
    except ValueError as e:
        return x + 1, e.args, repr(e)


@case.program
def exc_assert_statement_passes(x):
    assert x.dim() == 1, f"bad dim {x.dim()}"
    assert x.shape[0] % 2 == 0
    return x.relu()


# -- context managers ----------------------------------------------------------------------

class _Swallow:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, typ, val, tb):
        self.log.append(typ.__name__ if typ is not None else "ok")
        return typ is not None and issubclass(typ, ArithmeticError)


@case.program
def cm_user_exit_swallows_error(x):
    log = []
    with _Swallow(log):
        y = x * 2
        raise ZeroDivisionError("swallowed")
    with _Swallow(log):
        y = y + 1
    return y, log


@case.program
def cm_nullcontext_enter_result(x):
    with contextlib.nullcontext(3) as k:
        return x * k


class _Resource:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


@case.program
def cm_closing_calls_close(x):
    r = _Resource()
    with contextlib.closing(r) as same:
        y = x + 1
        inside = same is r and not r.closed
    return y, inside, r.closed


@case.program
def cm_exitstack_callbacks_lifo(x):
    log = []
    with contextlib.ExitStack() as stack:
        stack.callback(log.append, "first")
        stack.callback(log.append, "second")
        y = x * 2
    return y, log


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    @torch.no_grad()
    def _stats(self, y):
        return y.mean(), torch.is_grad_enabled()

    def forward(self, x):
        y = self.lin(x)
        m, inside = self._stats(y)
        return y - m, inside, m.requires_grad, torch.is_grad_enabled()


@case
def cm_no_grad_decorated_method_inlined(C):
    return C(_Block())(_x())


@case.program
def cm_set_grad_enabled_called_then_restored(x):
    before = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    y = x * 2
    inside = torch.is_grad_enabled()
    torch.set_grad_enabled(before)
    return y, inside, torch.is_grad_enabled()


@case.program
def cm_same_user_manager_entered_twice(x):
    log = []
    m = _Swallow(log)
    with m:
        x = x + 1
    with m:
        x = x * 2
    return x, log


@case.program
def cm_suppress_tuple_of_types(x):
    hit = []
    with contextlib.suppress(KeyError, IndexError):
        hit.append(1)
        [][3]
    return x * len(hit), hit


@case.program
def cm_exitstack_enter_context_user(x):
    log = []
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(_Swallow(log))
        b = stack.enter_context(_Swallow(log))
        y = x + (a is not b)
    return y, log


@case.program
def cm_break_inside_nested_grad_modes(x):
    with torch.no_grad():
        with torch.enable_grad():
            y = x * 2
            print("break")
            y = y + 1
    return y


@case.program
def cm_inference_mode_result_flag(x):
    with torch.inference_mode():
        y = x * 2
    return y + 0, y.is_inference()


@contextlib.contextmanager
def _handles_value_error():
    try:
        yield
    except ValueError:
        pass


@case.program
def cm_contextmanager_handles_error_raised_in_block(x):
    with _handles_value_error():
        y = x * 2
        raise ValueError()
    return y


# -- closures ------------------------------------------------------------------------------

@case.program
def closure_two_closures_share_counter(x):
    count = 0

    def bump():
        nonlocal count
        count += 1

    def read():
        return count

    bump()
    bump()
    return x * read(), count


@case.program
def closure_made_in_loop_late_binding_lambdas(x):
    fns = [lambda: x * i for i in range(3)]  # noqa: B023 - the case: late binding
    return [fn() for fn in fns]


@case.program
def closure_default_arg_binds_each(x):
    fns = [lambda k=i: x + k for i in range(3)]
    return [fn() for fn in fns]


@case.program
def closure_accumulates_tensor_nonlocal(x):
    acc = torch.zeros(4)

    def add(v):
        nonlocal acc
        acc = acc + v

    for k in range(3):
        add(x * k)
    return acc


@case.program
def closure_three_levels_nonlocal(x):
    depth = 0

    def outer():
        def inner():
            nonlocal depth
            depth += 10
            return depth

        return inner() + 1

    return x + outer(), depth


@case
def closure_returned_counter_keeps_cell(C):
    def make(x):
        n = 0

        def step():
            nonlocal n
            n += 1
            return x * n

        step()
        return step

    step = C(make)(_x())
    return step(), step()


@case.program
def closure_cell_contents_read(x):
    k = 5

    def f():
        return k

    return x * f.__closure__[0].cell_contents, f()


# -- graph and recompile counts -----------------------------------------------------------

def _scale_by(x, n):
    return x * n + 1


@case
def rc_int_argument_three_values(C):
    f = C(_scale_by)
    return [f(_x(), n) for n in (2, 3, 4)]


@case
def rc_float_argument_three_values(C):
    f = C(_scale_by)
    return [f(_x(), s) for s in (0.5, 1.5, 2.5)]


@case
def rc_int_same_value_repeated(C):
    f = C(_scale_by)
    return [f(_x(), 3) for _ in range(3)]


def _branch_on_flag(x, flag):
    return x + 1 if flag else x - 1


@case
def rc_bool_argument_toggles(C):
    f = C(_branch_on_flag)
    return [f(_x(), b) for b in (True, False, True)]


def _reshape_rows(x, rows):
    return x.reshape(rows, -1).sum(0)


@case
def rc_int_used_as_view_size(C):
    f = C(_reshape_rows)
    x = torch.randn(12)
    return [f(x, r) for r in (2, 3, 4)]


def _sum_list(xs):
    return sum(xs)


@case
def rc_list_length_changes(C):
    f = C(_sum_list)
    return [f([_x()] * n) for n in (2, 3)]


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = 2

    def forward(self, x):
        return x * self.k


@case
def rc_module_int_attribute_changes(C):
    m = _Scaled()
    f = C(m)
    out = [f(_x())]
    m.k = 3
    out.append(f(_x()))
    m.k = 4
    out.append(f(_x()))
    return out


# -- self.assert* helpers ------------------------------------------------------------------

class _TC(unittest.TestCase):
    def runTest(self):
        pass


_tc = _TC()


@case.program
def assert_almost_equal_and_less(x):
    _tc.assertAlmostEqual(0.1 + 0.2, 0.3)
    _tc.assertLess(x.dim(), 2)
    _tc.assertGreaterEqual(x.numel(), 4)
    return x * 2


@case.program
def assert_sequence_and_dict_equal(x):
    _tc.assertSequenceEqual(list(x.shape), [4])
    _tc.assertDictEqual({"n": x.shape[0]}, {"n": 4})
    _tc.assertTupleEqual(tuple(x.shape), (4,))
    return x + 1


@case.program
def assert_not_in_and_is_not(x):
    _tc.assertNotIn(x.shape[0], (1, 2))
    _tc.assertIsNot(x.dtype, torch.int64)
    _tc.assertIsNotNone(x.dtype)
    return x - 1


@case.program
def assert_count_equal_on_ints(x):
    _tc.assertCountEqual([3, 1, 2], [1, 2, 3])
    return x * 3


@case.program
def assert_raises_as_manager(x):
    with _tc.assertRaises(ValueError):
        raise ValueError("expected")
    return x.sin()


class _Checked(nn.Module):
    def _require(self, cond, msg):
        if not cond:
            raise AssertionError(msg)

    def forward(self, x):
        self._require(x.dim() == 1, "1-d only")
        self._require(x.dtype is torch.float32, f"dtype {x.dtype}")
        return x.cos()


@case
def assert_user_require_helper_on_module(C):
    return C(_Checked())(_x())


# -- builtins and stdlib -------------------------------------------------------------------

@case.program
def it_chain_from_iterable_of_tensor_lists(x):
    rows = [[x, x + 1], [x * 2]]
    return list(itertools.chain.from_iterable(rows))


@case.program
def it_pairwise_zip_longest_compress(x):
    diffs = [b - a for a, b in itertools.pairwise([x, x * 2, x * 4])]
    padded = list(itertools.zip_longest([x, x], [1], fillvalue=0))
    kept = list(itertools.compress([x, x + 1, x + 2], [1, 0, 1]))
    return diffs, padded, kept


@case.program
def it_tee_both_consumed(x):
    a, b = itertools.tee(iter([x, x + 1]))
    return list(a), list(b)


@case.program
def col_counter_defaultdict_deque(x):
    c = collections.Counter("abca")
    d = collections.defaultdict(list)
    for k in "xyx":
        d[k].append(1)
    q = collections.deque([1, 2, 3], maxlen=3)
    q.append(4)
    q.rotate(1)
    return x * c["a"], dict(d), list(q), c.most_common(1)


@case.program
def assert_raises_regex_as_manager(x):
    with _tc.assertRaisesRegex(ValueError, "bad.*"):
        raise ValueError("bad thing")
    return x * 2


@case.program
def it_accumulate_with_mul_and_initial(x):
    return list(itertools.accumulate([x, x + 1, x + 2], operator.mul, initial=x * 0 + 1))


@case.program
def it_product_tensors_by_scalars(x):
    return [t * s for t, s in itertools.product([x, x.neg()], [1, 3])]


@case
def it_groupby_modules_by_type(C):
    mods = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)])

    def f(x):
        out = []
        for kind, group in itertools.groupby(mods, key=type):
            for m in group:
                x = m(x)
            out.append(kind.__name__)
        return x, out

    return C(f)(_x())


@case
def it_sorted_modules_by_key_lambda(C):
    mods = [nn.Linear(4, 3), nn.Linear(4, 1), nn.Linear(4, 2)]

    def f(x):
        order = sorted(mods, key=lambda m: m.out_features)
        return [m(x) for m in order]

    return C(f)(_x())


@case.program
def ft_reduce_lambda_with_initial_tensor(x):
    return functools.reduce(lambda acc, k: acc * 0.5 + k, [1, 2, 3], x)


@dataclasses.dataclass
class _Config:
    width: int = 4
    scale: float = 1.0
    tags: list = dataclasses.field(default_factory=list)


@case.program
def dc_replace_asdict_default_factory(x):
    c = _Config(scale=2.0)
    c.tags.append("a")
    d = dataclasses.replace(c, width=8)
    return x * d.scale + d.width, dataclasses.asdict(d), c.tags is not d.tags or d.tags


_Pair = collections.namedtuple("_Pair", ["left", "right"])


@case.program
def nt_replace_asdict_make(x):
    p = _Pair(x, 2)
    q = p._replace(right=5)
    r = _Pair._make([x + 1, 3])
    return q.left * q.right, dict(q._asdict()), r.right, _Pair._fields


@case.program
def op_methodcaller_and_multi_itemgetter(x):
    summed = operator.methodcaller("sum", 0)(x.reshape(2, 2))
    first, third = operator.itemgetter(0, 2)([x, x + 1, x + 2])
    return summed, first + third


@case.program
def str_format_shapes_and_floats(x):
    msg = "shape={} dims={:d} scale={:.2f}".format(tuple(x.shape), x.dim(), 0.125)  # noqa: UP032
    return x * len(msg), msg


@case.program
def builtin_enumerate_start_zip_strict(x):
    out = []
    for i, (a, b) in enumerate(zip([x, x + 1], [2, 3], strict=True), start=5):
        out.append(a * b + i)
    return out


@case.program
def builtin_dict_views_set_ops(x):
    d = {"a": 1, "b": 2, "c": 3}
    common = d.keys() & {"a", "c", "z"}
    items = sorted(d.items(), key=lambda kv: -kv[1])
    return x * sum(d.values()), sorted(common), items, list(reversed(d))


@case.program
def builtin_set_algebra_on_ints(x):
    a, b = {1, 2, 3, 4}, {3, 4, 5}
    return (x + len(a | b), sorted(a & b), sorted(a - b), sorted(a ^ b), a.isdisjoint({9}),
            {1, 2} <= a)


@case.program
def builtin_map_two_iterables_filter_none(x):
    scaled = list(map(lambda t, k: t * k, [x, x], [2, 3]))  # noqa: C417 - the case: map
    flags = list(filter(None, [0, 1, "", "s", None, 2]))
    return scaled, flags


@case.program
def builtin_min_max_with_key_and_default(x):
    words = ["ccc", "a", "bb"]
    longest = max(words, key=len)
    shortest = min(words, key=len)
    none = max([], default=-1)
    return x * len(longest), shortest, none


@case.program
def builtin_divmod_round_abs_of_sizes(x):
    q, r = divmod(x.numel() + 3, 2)
    return x * q + r, round(2.675, 2), abs(-x.shape[0]), pow(2, x.dim(), 5)


@dataclasses.dataclass(frozen=True)
class _Slot:
    layer: int
    kind: str


@case.program
def dc_frozen_instances_as_set_items(x):
    seen = {_Slot(0, "attn"), _Slot(1, "mlp"), _Slot(0, "attn")}
    return x * len(seen), _Slot(1, "mlp") in seen, sorted(s.layer for s in seen)


@case.program
def dc_frozen_key_dict_updated_and_iterated(x):
    table = {}
    for i in range(3):
        table[_Slot(i % 2, "w")] = x * i
    return [(k.layer, v) for k, v in table.items()]


test_matches_torch_compile, test_gives_eagers_answer = case.tests(__file__)
