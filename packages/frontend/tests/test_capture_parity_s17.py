"""Parity cases for issue 27, a fresh batch of held-out-style programs over its families:
generators (send/throw/close, endless ones consumed by zip/islice), exceptions (raise from,
finally with return, exception groups, user classes), context managers (@contextmanager,
nested, ExitStack, grad mode and autocast inside), closures (nonlocal, cells across graph
breaks, partial/wraps, lambdas as defaults), classes (dataclasses, NamedTuple, enum,
properties and descriptors, __getattr__, classmethods, super()), comprehensions with
mutation, itertools/functools/operator, and string formatting of shapes. Each is checked
against eager and against torch.compile's graph count (``_reference_cases``)."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import itertools
import operator
from typing import NamedTuple

import pytest
import torch
from _reference_cases import Cases, ScaledLinear
from _reference_cases import randn_input as _x
from torch import nn

pytestmark = pytest.mark.usefixtures("fresh_frontend")


case = Cases(_x)


# -- generators ----------------------------------------------------------------------------

def _count_from(start):
    n = start
    while True:
        yield n
        n += 1


@case.program
def gen_endless_zipped_with_list(x):
    return [x * i for i, _ in zip(_count_from(1), range(3), strict=False)]


@case.program
def gen_endless_islice_step(x):
    return sum(x + k for k in itertools.islice(_count_from(0), 1, 8, 3))


def _cycle_scales():
    while True:
        yield 0.5
        yield 2.0


@case.program
def gen_endless_next_calls(x):
    g = _cycle_scales()
    a = next(g)
    b = next(g)
    c = next(g)
    return x * a + x * b - c


def _accumulate():
    total = None
    while True:
        v = yield total
        total = v if total is None else total + v


@case.program
def gen_send_running_total(x):
    g = _accumulate()
    next(g)
    g.send(x)
    g.send(x * 2)
    return g.send(x + 1)


class _Reset(Exception):
    pass


def _resettable():
    n = 0
    while True:
        try:
            yield n
            n += 1
        except _Reset:
            n = 0


@case.program
def gen_throw_resets_state(x):
    g = _resettable()
    seen = [next(g), next(g), next(g)]
    seen.append(g.throw(_Reset))
    seen.append(next(g))
    return x + sum(seen), seen


def _closing(log):
    try:
        yield 1
        yield 2
    finally:
        log.append("closed")


@case.program
def gen_close_runs_finally(x):
    log = []
    g = _closing(log)
    first = next(g)
    g.close()
    return x * first, log


@case.program
def gen_throw_uncaught_escapes(x):
    g = _closing([])
    next(g)
    try:
        g.throw(ValueError("stop"))
    except ValueError as e:
        return x + len(str(e))
    return x


def _inner_squares(xs):
    for v in xs:
        yield v * v
    return len(xs)


def _outer(xs):
    n = yield from _inner_squares(xs)
    yield n


@case.program
def gen_yield_from_return_value(x):
    out = list(_outer([x, x + 1]))
    return out[0] + out[1], out[2]


@case.program
def gen_expression_into_max_min(x):
    vals = [x.sum(), (x * 2).sum(), (x - 1).sum()]
    return max(v for v in vals), min(v * 2 for v in vals)


@case.program
def gen_expression_any_all_on_constants(x):
    sizes = [2, 4, 6]
    if all(s % 2 == 0 for s in sizes) and not any(s > 10 for s in sizes):
        return x * len(sizes)
    return x


@case.program
def gen_enumerate_filtered(x):
    g = (v for v in (x, x + 1, x + 2, x + 3))
    return [i * v for i, v in enumerate(g, start=1) if i % 2]


def _pairwise_diffs(xs):
    it = iter(xs)
    prev = next(it)
    for v in it:
        yield v - prev
        prev = v


@case.program
def gen_pairwise_manual_iter(x):
    return torch.stack(list(_pairwise_diffs([x, x * 2, x * 4, x * 8])))


# -- exceptions ----------------------------------------------------------------------------

class _ShapeError(ValueError):
    def __init__(self, expected, got):
        super().__init__(f"expected {expected}, got {got}")
        self.expected = expected
        self.got = got


def _require_len(x, n):
    if x.shape[0] != n:
        raise _ShapeError(n, x.shape[0])
    return x


@case.program
def exc_custom_class_with_attrs_caught(x):
    try:
        _require_len(x, 7)
    except _ShapeError as e:
        return x * e.expected + e.got, str(e)
    return x, ""


@case.program
def exc_raise_from_cause_checked(x):
    try:
        try:
            {}["missing"]
        except KeyError as k:
            raise RuntimeError("lookup failed") from k
    except RuntimeError as e:
        return x + (type(e.__cause__) is KeyError), e.__suppress_context__


def _finally_returns(x):
    try:
        return x + 1
    finally:
        x = x * 100  # noqa: F841 - the return value was already taken


@case.program
def exc_finally_after_return_value_kept(x):
    return _finally_returns(x)


def _finally_overrides(x):
    try:
        raise ValueError("lost")
    finally:
        return x * 3  # noqa: B012 - the case: the return swallows the exception


@case.program
def exc_return_in_finally_swallows(x):
    return _finally_overrides(x)


@case.program
def exc_else_branch_runs(x):
    log = []
    try:
        y = x + 1
    except ZeroDivisionError:
        log.append("except")
        y = x
    else:
        log.append("else")
        y = y * 2
    finally:
        log.append("finally")
    return y, log


@case.program
def exc_group_except_star(x):
    hit = []
    try:
        raise ExceptionGroup("many", [ValueError("v"), TypeError("t")])
    except* ValueError as eg:
        hit.append(len(eg.exceptions))
    except* TypeError:
        hit.append("type")
    return x + len(hit), hit


@case.program
def exc_suppress_custom(x):
    with contextlib.suppress(_Reset):
        x = x + 1
        raise _Reset()
    return x * 2


@case.program
def exc_zero_division_caught(x):
    n = 0
    try:
        r = 10 / n
    except ZeroDivisionError as e:
        r = len(str(e))
    return x + r


@case.program
def exc_reraise_bare_in_nested(x):
    def inner(v):
        try:
            raise KeyError("inner")
        except KeyError:
            v = v + 1
            raise
    try:
        inner(x)
    except KeyError as e:
        return x - 1, e.args
    return x, ()


class _Retry(Exception):
    pass


@case.program
def exc_loop_with_retry_counter(x):
    attempts = 0
    while True:
        try:
            attempts += 1
            if attempts < 3:
                raise _Retry(attempts)
            break
        except _Retry:
            x = x * 1.5
    return x, attempts


@case.program
def exc_isinstance_dispatch_on_hierarchy(x):
    out = []
    for err in (_ShapeError(1, 2), ValueError("v"), LookupError("l")):
        try:
            raise err
        except ValueError as e:
            out.append(isinstance(e, _ShapeError))
        except Exception:
            out.append(None)
    return x + out.count(False), out


# -- context managers ----------------------------------------------------------------------

@contextlib.contextmanager
def _tagged(log, tag):
    log.append("enter " + tag)
    try:
        yield tag.upper()
    finally:
        log.append("exit " + tag)


@case.program
def cm_contextmanager_yield_value(x):
    log = []
    with _tagged(log, "a") as t:
        y = x + len(t)
    return y, log


@case.program
def cm_contextmanager_exception_inside(x):
    log = []
    try:
        with _tagged(log, "b"):
            raise KeyError("boom")
    except KeyError:
        x = x - 1
    return x, log


@case.program
def cm_exitstack_enters_several(x):
    log = []
    with contextlib.ExitStack() as stack:
        tags = [stack.enter_context(_tagged(log, t)) for t in ("p", "q")]
        y = x * len(tags)
    return y, log, tags


@case.program
def cm_exitstack_callback(x):
    log = []
    with contextlib.ExitStack() as stack:
        stack.callback(log.append, "cb")
        y = x + 1
    return y, log


@case.program
def cm_no_grad_inside(x):
    w = x.detach().requires_grad_(False) + 1
    with torch.no_grad():
        y = w * 2
        inside = torch.is_grad_enabled()
    return y, inside, torch.is_grad_enabled()


@case.program
def cm_enable_grad_inside_no_grad(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x + 1
            mid = torch.is_grad_enabled()
    return a, b, mid, torch.is_grad_enabled()


@case.program
def cm_set_grad_enabled_false(x):
    with torch.set_grad_enabled(False):
        y = x.sin()
        flag = torch.is_grad_enabled()
    return y, flag


@case.program
def cm_autocast_cpu_bf16(x):
    m = x.reshape(2, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m @ m
    return y.float(), y.dtype == torch.bfloat16


@case.program
def cm_nullcontext_value(x):
    with contextlib.nullcontext(3) as k:
        return x * k


class _Depth:
    def __init__(self):
        self.level = 0

    def __enter__(self):
        self.level += 1
        return self.level

    def __exit__(self, *exc):
        self.level -= 1
        return False


@case.program
def cm_user_class_nested_same_object(x):
    d = _Depth()
    with d as a:
        with d as b:
            x = x * (a + b)
        x = x + d.level
    return x, d.level


@case.program
def cm_no_grad_decorator_function(x):
    @torch.no_grad()
    def scaled(v):
        return v * 3, torch.is_grad_enabled()

    y, flag = scaled(x)
    return y + 1, flag


@case.program
def cm_no_grad_decorator_raises_mode_restored(x):
    @torch.no_grad()
    def failing(v):
        if v.shape[0] == 4:
            raise _Reset("inside")
        return v

    try:
        failing(x)
    except _Reset:
        x = x + 1
    return x, torch.is_grad_enabled()


@case.program
def cm_enable_grad_decorator_under_no_grad(x):
    @torch.enable_grad()
    def inner(v):
        return v * 2, torch.is_grad_enabled()

    with torch.no_grad():
        y, flag = inner(x)
        outside = torch.is_grad_enabled()
    return y, flag, outside


@torch.no_grad()
def _no_grad_check(v):
    if v.shape[0] == 4:
        raise _Reset("no grad inside")
    return v


@case.program
def cm_module_level_no_grad_function_raises(x):
    # (before: the caught exception left grad mode off for the rest of the frame and after)
    try:
        _no_grad_check(x)
    except _Reset:
        x = x * 2
    return x, torch.is_grad_enabled()


@torch.autocast("cpu", dtype=torch.bfloat16)
def _autocast_check(v):
    m = v.reshape(2, 2)
    if (m @ m).dtype == torch.bfloat16:
        raise _Reset("bf16 inside")
    return m


@case.program
def cm_module_level_autocast_function_raises(x):
    try:
        _autocast_check(x)
    except _Reset:
        x = x + 3
    m = x.reshape(2, 2)
    return x, (m @ m).dtype == torch.float32


# -- closures ------------------------------------------------------------------------------

@case.program
def closure_nonlocal_counter(x):
    calls = 0

    def bump(v):
        nonlocal calls
        calls += 1
        return v + calls

    y = bump(bump(x))
    return y, calls


@case.program
def closure_nonlocal_list_rebind(x):
    acc = []

    def push(v):
        nonlocal acc
        acc = acc + [v]

    push(x)
    push(x * 2)
    return torch.stack(acc), len(acc)


@case.program
def closure_cell_across_graph_break(x):
    scale = 2

    def mul(v):
        return v * scale

    y = mul(x)
    print("graph break")
    scale = 5
    return y, mul(x)


@case.program
def closure_returned_closure_called(x):
    def make(k):
        def f(v):
            return v * k
        return f

    fs = [make(k) for k in range(1, 4)]
    return [f(x) for f in fs]


@case.program
def closure_lambda_default_binds_loop_var(x):
    fs = [lambda v, k=k: v + k for k in range(3)]
    return [f(x) for f in fs]


def _add(a, b, *, scale=1.0):
    return (a + b) * scale


@case.program
def closure_partial_with_kwargs(x):
    p = functools.partial(_add, scale=2.0)
    q = functools.partial(p, x)
    return q(1), q(x), p.keywords


def _logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) + 1
    return wrapper


@_logged
def _double(v):
    """Doubles."""
    return v * 2


@case.program
def closure_wraps_keeps_name(x):
    return _double(x), _double.__name__, _double.__doc__


@case.program
def closure_nested_nonlocal_two_levels(x):
    total = x

    def outer():
        def inner():
            nonlocal total
            total = total * 2
        inner()
        inner()

    outer()
    return total


# -- classes -------------------------------------------------------------------------------

@dataclasses.dataclass
class _Cfg:
    scale: float = 2.0
    shift: int = 1
    tags: list = dataclasses.field(default_factory=list)


@case.program
def cls_dataclass_made_and_replaced(x):
    c = _Cfg(shift=3)
    d = dataclasses.replace(c, scale=0.5)
    return x * c.scale + d.shift, d.scale, dataclasses.asdict(d)


@case.program
def cls_dataclass_fields_iteration(x):
    c = _Cfg()
    return [f.name for f in dataclasses.fields(c)], x + len(dataclasses.fields(c))


class _Pair(NamedTuple):
    a: torch.Tensor
    b: int = 2


@case.program
def cls_namedtuple_fields_and_replace(x):
    p = _Pair(x)
    q = p._replace(b=5)
    return p.a * q.b, q._fields, tuple(q)[1]


class _Mode(enum.Enum):
    ADD = 1
    MUL = 2


@case.program
def cls_enum_dispatch(x):
    out = []
    for m in _Mode:
        out.append(x + m.value if m is _Mode.ADD else x * m.value)
    return out, _Mode(2).name


class _Positive:
    """A data descriptor: clamps what is stored."""

    def __set_name__(self, owner, name):
        self.name = "_" + name

    def __get__(self, obj, objtype=None):
        return getattr(obj, self.name)

    def __set__(self, obj, value):
        setattr(obj, self.name, max(value, 0))


class _Holder:
    k = _Positive()

    def __init__(self, k):
        self.k = k


@case.program
def cls_descriptor_set_and_get(x):
    h = _Holder(-3)
    a = h.k
    h.k = 4
    return x * h.k + a


class _Box:
    def __init__(self, v):
        self._v = v

    @property
    def doubled(self):
        return self._v * 2

    @doubled.setter
    def doubled(self, value):
        self._v = value / 2


@case.program
def cls_property_setter(x):
    b = _Box(x)
    b.doubled = x + 4
    return b.doubled, b._v


class _Lazy:
    def __init__(self):
        self.made = []

    def __getattr__(self, name):
        self.made.append(name)
        return len(name)


@case.program
def cls_getattr_fallback(x):
    o = _Lazy()
    return x + o.alpha + o.be, o.made


class _Base:
    def __init__(self, k):
        self.k = k

    def apply(self, v):
        return v + self.k

    @classmethod
    def unit(cls):
        return cls(1)

    @staticmethod
    def twice(v):
        return v * 2


class _Child(_Base):
    def apply(self, v):
        return self.twice(super().apply(v))


@case.program
def cls_classmethod_super_staticmethod(x):
    c = _Child.unit()
    return c.apply(x), type(c).__name__




class _Shifted(ScaledLinear):
    def forward(self, x):
        return super().forward(x) + 1


@case
def cls_module_super_forward(C):
    m = _Shifted()
    return C(m)(_x())


@case
def cls_module_hook_added_then_removed(C):
    m = nn.Linear(4, 4)
    g = C(m)
    a = g(_x())
    handle = m.register_forward_hook(lambda mod, args, out: out * 2)
    b = g(_x())
    handle.remove()
    return a, b, g(_x())


@case
def cls_module_pre_hook_and_hook_of_compiled_module(C):
    m = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
    m.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))
    m.register_forward_hook(lambda mod, args, out: out - args[0])
    return C(m)(_x())


@dataclasses.dataclass(frozen=True)
class _Key:
    name: str
    idx: int


@case.program
def cls_frozen_dataclass_as_dict_key(x):
    table = {_Key("a", 0): 1.0, _Key("b", 1): 2.0}
    return x * table[_Key("b", 1)], _Key("a", 0) in table


# -- comprehensions with mutation ----------------------------------------------------------

@case.program
def comp_list_appends_inside(x):
    log = []
    ys = [log.append(i) or x * i for i in range(3)]
    return ys, log


@case.program
def comp_dict_with_counter(x):
    counts = {}
    for k in "abcab":
        counts[k] = counts.get(k, 0) + 1
    return {k: x * v for k, v in counts.items()}


@case.program
def comp_set_of_sizes(x):
    shapes = {t.shape[0] for t in (x, x[:2], x[:2], x[1:])}
    return x + len(shapes), sorted(shapes)


@case.program
def comp_nested_with_condition(x):
    return [x * i + j for i in range(3) for j in range(i) if (i + j) % 2]


@case.program
def comp_dict_pop_during_loop(x):
    d = {i: x + i for i in range(4)}
    for k in list(d):
        if k % 2:
            d.pop(k)
    return d


# -- itertools / functools / operator ------------------------------------------------------

@case.program
def it_accumulate_and_chain(x):
    parts = list(itertools.accumulate([x, x, x]))
    return list(itertools.chain(parts, [x * 0]))


@case.program
def it_product_and_combinations(x):
    p = [a * b for a, b in itertools.product([1, 2], [3, 4])]
    c = list(itertools.combinations(range(4), 2))
    return x + sum(p), c


@case.program
def it_groupby_on_keys(x):
    keys = [1, 1, 2, 3, 3, 3]
    groups = [(k, len(list(g))) for k, g in itertools.groupby(keys)]
    return x * len(groups), groups


@case.program
def it_starmap_and_repeat(x):
    return list(itertools.starmap(operator.mul, zip([x, x + 1], itertools.repeat(3))))


@case.program
def ft_reduce_with_operator(x):
    return functools.reduce(operator.add, [x, x * 2, x * 3]), functools.reduce(
        operator.mul, [1, 2, 3, 4], 1)


@case.program
def op_itemgetter_attrgetter(x):
    rows = [(x, 1), (x * 2, 0)]
    firsts = list(map(operator.itemgetter(0), rows))
    shape = operator.attrgetter("shape")(x)
    return firsts, tuple(shape)


@case.program
def op_sorted_with_key_lambda(x):
    items = [("b", 2), ("a", 3), ("c", 1)]
    order = sorted(items, key=lambda kv: kv[1])
    return x * order[0][1], [k for k, _ in order]


@case.program
def ft_lru_cache_local_function(x):
    @functools.lru_cache(maxsize=None)  # noqa: UP033 - the case: lru_cache itself
    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    return x + fib(10)


# -- requires_grad_() of intermediates -----------------------------------------------------

@case.program
def grad_leaf_made_in_frame_returned(x):
    w = torch.ones(4).requires_grad_()
    y = (x * w).sum()
    return y, w, y.requires_grad, w.is_leaf


def _as_leaf(v):
    return v.detach().requires_grad_()


@case.program
def grad_leaf_made_in_inlined_call(x):
    w = _as_leaf(x * 2)
    out = w * 3
    return out, out.requires_grad, out.grad_fn is not None


# -- string formatting of shapes -----------------------------------------------------------

@case.program
def str_fstring_of_shape(x):
    m = x.reshape(2, 2)
    return m * 2, f"{tuple(m.shape)}|{m.dim()}d|{m.dtype}"


@case.program
def str_format_spec_and_join(x):
    dims = list(x.shape) + [3]
    fmt = "{:>5}".format(dims[0])  # noqa: UP032 - the case: str.format
    pct = "%d-%s" % (dims[0], "end")  # noqa: UP031 - the case: %-formatting
    return x + 1, "x".join(str(d) for d in dims), fmt, pct


@case.program
def str_size_repr_in_message(x):
    msg = f"got {x.size()} with {x.numel()} elements"
    return x * len(msg), msg


test_matches_torch_compile, test_gives_eagers_answer = case.tests(__file__)
