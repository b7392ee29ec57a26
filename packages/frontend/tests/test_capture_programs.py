"""Small programs in the style of PyTorch's test/dynamo tests, written to be held out from
kiln's development (issue 27): closures with ``nonlocal``, generators consumed in the frame,
``try``/``except``/``finally`` with re-raise, context managers, ``functools.partial``,
dataclasses, namedtuples, comprehensions over tensors, ``**kwargs``, ``super()`` chains,
properties, class and static methods, global mutation, ``isinstance`` on user classes; and
frames whose first call makes no graph (kept under guards under ``fullgraph``, as
torch.compile does, so a later call that does tensor work is captured).

Each case is checked against eager and against torch.compile's graph count over all its
calls (``_reference_cases``: ``fullgraph=True`` when torch.compile manages it)."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import operator
import types

import pytest
import torch
from _reference_cases import Cases
from torch import nn

pytestmark = pytest.mark.usefixtures("fresh_frontend")


def _x(*size):
    return torch.arange(float(torch.Size(size or (4,)).numel())).reshape(size or (4,)) / 5 - 0.3


case = Cases(_x)


# -- a first call that makes no graph ----------------------------------------------------

@case
def identity_then_tensor_work(C):
    def f(x, flag):
        if flag:
            return x
        return x.sin()

    g = C(f)
    x = _x()
    return [g(x, True), g(x, False), g(x, True), g(x, False)]


@case
def python_value_first_call(C):
    def f(x, n):
        if n == 0:
            return n
        return x * n

    g = C(f)
    x = _x()
    return [g(x, 0), g(x, 2), g(x, 0)]


@case
def int_argument_then_tensor(C):
    def f(a):
        if isinstance(a, int):
            return a + 1
        return a.cos()

    g = C(f)
    return [g(3), g(_x()), g(_x(2, 3))]


@case
def list_mutation_first_call(C):
    def f(x, acc, work):
        acc.append(len(acc))
        if work:
            return x + len(acc)
        return None

    g = C(f)
    acc = []
    return [g(_x(), acc, False), g(_x(), acc, True), g(_x(), acc, False)], acc


@case
def returns_none_then_work(C):
    def f(x, cfg):
        if cfg is None:
            return None
        return x * cfg["scale"]

    g = C(f)
    return [g(_x(), None), g(_x(), {"scale": 2.0}), g(_x(), None)]


@case
def method_of_module_no_op_first(C):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.active = False

        def forward(self, x):
            if not self.active:
                return x
            return self.lin(x)

    torch.manual_seed(0)
    m = M()
    g = C(m)
    out = [g(_x(2, 4))]
    m.active = True
    out.append(g(_x(2, 4)))
    return out


# -- closures -------------------------------------------------------------------------------

@case.program
def nonlocal_counter_in_frame(x):
    count = 0

    def bump(t):
        nonlocal count
        count += 1
        return t * count

    y = bump(x) + bump(x)
    return y, count


@case
def closure_returned_and_called_later(C):
    def f(x):
        scale = x.sum()

        def apply(t):
            return t * scale

        return apply

    apply = C(f)(_x())
    return apply(_x())


@case
def nonlocal_written_by_inlined_helper_of_outer(C):
    total = [0]

    def make():
        acc = 0

        def add(t):
            nonlocal acc
            acc += 1
            total[0] += 1
            return t + acc

        return add

    add = make()

    def f(x):
        return add(add(x))

    out = C(f)(_x())
    return out, total[0]


@case.program
def closure_over_loop_variable(x):
    fns = [lambda t, i=i: t + i for i in range(3)]
    return [fn(x) for fn in fns]


# -- generators --------------------------------------------------------------------------

@case
def generator_consumed_by_sum(C):
    def squares(t, n):
        for i in range(n):
            yield t * i

    def f(x):
        return sum(squares(x, 4))

    return C(f)(_x())


@case
def generator_with_zip_and_enumerate(C):
    def gen(t):
        yield t
        yield t + 1
        yield t * 2

    def f(x):
        out = []
        for i, (a, b) in enumerate(zip(gen(x), [1, 2, 3], strict=True)):
            out.append(a * b + i)
        return out

    return C(f)(_x())


@case
def yield_from_chain(C):
    def inner(t):
        yield t.sin()
        yield t.cos()

    def outer(t):
        yield from inner(t)
        yield t.tanh()

    def f(x):
        return list(outer(x))

    return C(f)(_x())


@case
def generator_expression_into_torch_stack(C):
    def f(xs):
        return torch.stack(tuple(x * 2 for x in xs))

    return C(f)([_x(), _x() + 1])


# -- exceptions ---------------------------------------------------------------------------

class _CaseError(Exception):
    pass


@case
def try_except_user_error(C):
    def check(t, ok):
        if not ok:
            raise _CaseError("bad")
        return t + 1

    def f(x):
        try:
            y = check(x, False)
        except _CaseError:
            y = x - 1
        return y

    return C(f)(_x())


@case
def try_finally_runs_on_return(C):
    log = []

    def f(x):
        try:
            return x * 2
        finally:
            log.append("done")

    return C(f)(_x()), log


@case
def except_reraise_caught_outside(C):
    def inner(t):
        try:
            raise ValueError("inner")
        except ValueError:
            raise

    def f(x):
        try:
            inner(x)
        except ValueError as e:
            return x + len(str(e))
        return x

    return C(f)(_x())


@case.program
def try_else_branch(x):
    try:
        y = x + 1
    except RuntimeError:
        y = x
    else:
        y = y * 3
    return y


@case.program
def raise_from_and_catch_base(x):
    try:
        try:
            raise KeyError("k")
        except KeyError as e:
            raise _CaseError("wrapped") from e
    except Exception as e:
        return x * 2 if isinstance(e.__cause__, KeyError) else x


# -- context managers ---------------------------------------------------------------------

class _Tracked:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, *exc):
        self.log.append("exit")
        return False


@case.program
def user_context_manager_in_frame(x):
    log = []
    with _Tracked(log):
        y = x + 1
    return y, log


@case
def contextmanager_decorator_with_finally(C):
    @contextlib.contextmanager
    def scaled(log):
        log.append("in")
        try:
            yield 3
        finally:
            log.append("out")

    def f(x):
        log = []
        with scaled(log) as k:
            y = x * k
        return y, log

    return C(f)(_x())


@case
def no_grad_then_enable_grad_nested(C):
    def f(x):
        with torch.no_grad():
            a = x * 2
            with torch.enable_grad():
                b = x * 3
        return a, b, a.requires_grad, b.requires_grad

    return C(f)(_x().requires_grad_())


@case
def set_grad_enabled_from_argument(C):
    def f(x, flag):
        with torch.set_grad_enabled(flag):
            y = x * 2
        return y, y.requires_grad

    g = C(f)
    x = _x().requires_grad_()
    return [g(x, False), g(x, True)]


# -- functools, dataclasses, namedtuples --------------------------------------------------

def _affine(t, scale, shift=0.0):
    return t * scale + shift


@case
def functools_partial_with_keywords(C):
    p = functools.partial(_affine, scale=2.0, shift=1.0)

    def f(x):
        return p(x), functools.partial(_affine, shift=-1.0)(x, 3.0)

    return C(f)(_x())


@case
def functools_reduce_over_tensors(C):
    def f(xs):
        return functools.reduce(operator.add, xs), functools.reduce(lambda a, b: a * b, xs, 1)

    return C(f)([_x(), _x() + 1, _x() + 2])


@dataclasses.dataclass
class _Params:
    scale: float
    bias: torch.Tensor
    names: list = dataclasses.field(default_factory=list)


@case
def dataclass_argument_and_replace(C):
    def f(p, x):
        q = dataclasses.replace(p, scale=p.scale * 2)
        return x * q.scale + q.bias, q.scale

    return C(f)(_Params(1.5, _x()), _x())


@case.program
def dataclass_built_in_frame(x):
    p = _Params(scale=2.0, bias=x + 1)
    p.names.append("a")
    return p.bias * p.scale, len(p.names)


_Point = collections.namedtuple("_Point", ["x", "y"])


@case
def namedtuple_fields_and_replace(C):
    def f(p):
        q = p._replace(y=p.y * 2)
        return q.x + q.y, q._fields, p[0] * 2

    return C(f)(_Point(_x(), _x() + 1))


@case.program
def namedtuple_made_and_unpacked(x):
    p = _Point(x, x.sum())
    a, b = p
    return a * b


# -- comprehensions and containers --------------------------------------------------------

@case
def dict_comprehension_over_tensors(C):
    def f(d):
        return {k: v * 2 for k, v in d.items() if k != "skip"}

    return C(f)({"a": _x(), "skip": _x(), "b": _x() + 1})


@case
def nested_list_comprehension(C):
    def f(xs):
        return [[a * b for b in (1, 2)] for a in xs]

    return C(f)([_x(), _x() + 1])


@case
def sorted_with_key_over_tensors(C):
    def f(xs):
        return sorted(xs, key=lambda t: t.shape[0])

    return C(f)([_x(5), _x(2), _x(3)])


@case.program
def itertools_product_and_chain(x):
    out = [x * a + b for a, b in itertools.product((1, 2), (0, 1))]
    return list(itertools.chain(out, [x]))


# -- kwargs, classes, methods --------------------------------------------------------------

@case
def kwargs_inspected(C):
    def f(x, **kwargs):
        y = x
        if "scale" in kwargs:
            y = y * kwargs["scale"]
        for k in sorted(kwargs):
            if k.startswith("add"):
                y = y + kwargs[k]
        return y, len(kwargs)

    return C(lambda x: f(x, scale=2, add_a=1, add_b=3))(_x())


class _Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 2.0

    def forward(self, x):
        return x * self.scale


class _Mid(_Base):
    def forward(self, x):
        return super().forward(x) + 1


class _Top(_Mid):
    def forward(self, x):
        return super().forward(x).relu()


@case
def super_chain_three_levels(C):
    return C(_Top())(_x())


class _Shape:
    unit = 2

    def __init__(self, t):
        self._t = t

    @property
    def doubled(self):
        return self._t * 2

    @classmethod
    def make(cls, t):
        return cls(t + cls.unit)

    @staticmethod
    def combine(a, b):
        return a - b


@case.program
def property_classmethod_staticmethod(x):
    s = _Shape.make(x)
    return _Shape.combine(s.doubled, x)


class _Animal:
    def sound(self, t):
        return t


class _Dog(_Animal):
    def sound(self, t):
        return t * 2


@case
def isinstance_on_user_classes(C):
    def f(objs, x):
        out = x
        for o in objs:
            if isinstance(o, _Dog):
                out = out + o.sound(x)
            elif isinstance(o, _Animal):
                out = out - o.sound(x)
        return out

    return C(f)([_Dog(), _Animal(), _Dog()], _x())


_COUNTER = {"calls": 0}
_SCALE = 3


@case
def global_dict_mutation(C):
    def f(x):
        _COUNTER["calls"] += 1
        return x * _SCALE

    out = C(f)(_x())
    value = _COUNTER["calls"]
    _COUNTER["calls"] = 0
    return out, value


@case
def user_object_attribute_mutation(C):
    class Acc:
        def __init__(self):
            self.total = None
            self.n = 0

    def f(acc, x):
        acc.total = x if acc.total is None else acc.total + x
        acc.n += 1
        return acc.total * 2

    acc = Acc()
    g = C(f)
    return [g(acc, _x()), g(acc, _x())], acc.n


class _Scaler:
    def __init__(self, k):
        self.k = k


def _scale_by(self, t):
    return t * self.k


@case.program
def method_type_binds_a_function(x):
    bound = types.MethodType(_scale_by, _Scaler(3))
    return bound(x) + 1


# -- shapes --------------------------------------------------------------------------------

def _add_if_same_shape(a, b):
    if a.shape == b.shape:
        return a + b
    return a.sum() + b.sum()


@case
def shape_equality_branch(C):
    g = C(_add_if_same_shape)
    return [g(_x(3), _x(3)), g(_x(2, 3), _x(2, 3))]


@case
def size_comparison_with_tuple(C):
    def f(a):
        if a.size() == (2, 3):
            return a * 2
        return a - 1

    g = C(f)
    return [g(_x(2, 3)), g(_x(3, 2))]


@case
def dynamic_shape_equality(C):
    g = C(_add_if_same_shape)
    return [g(_x(3), _x(3)), g(_x(5), _x(5)), g(_x(6), _x(6)), g(_x(6), _x(2))]


def test_method_type_is_captured_in_one_graph():
    """``types.MethodType(fn, obj)`` binds like ``obj.fn`` (``contextlib.ExitStack`` binds
    each manager's ``__exit__`` so): one graph under fullgraph."""
    from _counting_backend import one_graph

    def f(x):
        return types.MethodType(_scale_by, _Scaler(3))(x) + 1

    one_graph(f, _x())


test_matches_torch_compile, test_gives_eagers_answer = case.tests(__file__)
