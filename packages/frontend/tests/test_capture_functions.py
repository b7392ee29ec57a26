"""Plain Python in captured frames, in the style of TorchDynamo's test_functions.py and
test_misc.py (issue 27): calls with every argument form, closures and decorators,
functools, operator, math, string formatting, enum, isinstance checks and small user
classes made inside the frame. Each case is checked against eager and against
torch.compile's graph count (``_reference_cases``)."""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import itertools
import math
import operator

import pytest
import torch
from _reference_cases import Cases
from _reference_cases import randn_input as _x

pytestmark = pytest.mark.usefixtures("fresh_frontend")


case = Cases(_x)


# -- calls --------------------------------------------------------------------------------

@case
def call_star_args_and_kwargs(C):
    def g(a, *args, scale=1.0, **kw):
        out = a * scale
        for t in args:
            out = out + t
        for k in sorted(kw):
            out = out + kw[k]
        return out

    def f(x, y):
        args = (y, y + 1)
        kw = {"p": x, "q": y}
        return g(x, *args, scale=2.0, **kw)

    return C(f)(_x(), _x())


@case
def call_keyword_only_defaults(C):
    def g(x, *, k=3, mode="add"):
        return x + k if mode == "add" else x * k

    def f(x):
        return g(x), g(x, k=2, mode="mul"), g(x, mode="mul")

    return C(f)(_x())


@case
def call_positional_only(C):
    def g(a, b, /, c=1):
        return a * b + c

    def f(x):
        return g(x, 2), g(x, 3, c=x)

    return C(f)(_x())


@case
def call_default_mutable_list(C):
    def g(x, acc=[]):  # noqa: B006 - the point of the case
        return x + len(acc)

    def f(x):
        return g(x)

    return C(f)(_x())


@case
def call_recursive_function(C):
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)

    def f(x):
        return x * fact(5)

    return C(f)(_x())


@case
def call_recursive_tensor(C):
    def apply(x, n):
        if n == 0:
            return x
        return apply(x.sin() + 1, n - 1)

    def f(x):
        return apply(x, 3)

    return C(f)(_x())


@case
def call_lambda_in_dict_dispatch(C):
    ops = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b}

    def f(x, y):
        return [ops[k](x, y) for k in ("add", "mul")]

    return C(f)(_x(), _x())


@case
def call_function_returned_by_function(C):
    def make(k):
        def g(x):
            return x * k
        return g

    def f(x):
        return make(3)(x) + make(x)(2)

    return C(f)(_x())


@case
def call_decorator_with_arguments(C):
    def scaled(k):
        def deco(fn):
            @functools.wraps(fn)
            def wrapper(*a, **kw):
                return fn(*a, **kw) * k
            return wrapper
        return deco

    @scaled(2)
    def g(x, y=1):
        return x + y

    def f(x):
        return g(x), g(x, y=x), g.__name__ == "g"

    return C(f)(_x())


@case.program
def call_unpack_nested_tuple(x):
    (a, b), c = (x, x + 1), x * 2
    first, *rest = [a, b, c]
    *init, last = (a, b, c)
    return first + sum(rest) + len(init) * last


@case
def call_builtin_callable_checks(C):
    def f(x):
        n = 0
        for obj in (len, f, 3, "s", torch.sin, x):
            n = n * 2 + int(callable(obj))
        return x + n

    return C(f)(_x())


@case
def call_getattr_default_and_hasattr(C):
    class Box:
        a = 2

    def f(x):
        b = Box()
        return x * getattr(b, "a", 0) + getattr(b, "missing", 5) + hasattr(b, "a") \
            + hasattr(b, "zzz")

    return C(f)(_x())


@case
def call_setattr_delattr_on_object(C):
    class Box:
        pass

    def f(x):
        b = Box()
        setattr(b, "v", x + 1)  # noqa: B010 - the builtin is the point
        b.w = 3
        delattr(b, "w")
        return b.v * 2, hasattr(b, "w")

    return C(f)(_x())


# -- functools ---------------------------------------------------------------------------

@case
def functools_partial_keywords(C):
    def g(x, a, *, b=1):
        return x * a + b

    p = functools.partial(g, a=2, b=3)

    def f(x):
        q = functools.partial(g, b=x)
        return p(x), q(x, 4), p.keywords["a"]

    return C(f)(_x())


@case
def functools_partial_nested(C):
    def g(a, b, c):
        return a * b + c

    def f(x):
        p = functools.partial(functools.partial(g, x), 2)
        return p(1), p(c=x)

    return C(f)(_x())


@case.program
def functools_reduce_operator_mul(x):
    n = functools.reduce(operator.mul, [1, 2, 3, 4])
    return functools.reduce(operator.add, [x, x * 2, x * 3], x) * n


@case.program
def functools_lru_cache_global(x):
    return x * _squares(4)


@functools.lru_cache(maxsize=None)  # noqa: UP033 - lru_cache is the point
def _squares(n):
    return sum(i * i for i in range(n))


@case
def functools_cmp_to_key(C):
    def cmp(a, b):
        return (a > b) - (a < b)

    def f(x):
        order = sorted([3, 1, 2], key=functools.cmp_to_key(cmp))
        return x + order[0] * 10 + order[2]

    return C(f)(_x())


# -- operator ----------------------------------------------------------------------------

@case
def operator_functions_on_tensors(C):
    def f(x, y):
        return (operator.add(x, y), operator.sub(x, y), operator.mul(x, y),
                operator.truediv(x, y + 3), operator.neg(x), operator.pow(x, 2),
                operator.matmul(x, y))

    return C(f)(_x(), _x())


@case
def operator_inplace_functions(C):
    def f(x, y):
        z = x.clone()
        z = operator.iadd(z, y)
        z = operator.imul(z, 2)
        return z

    return C(f)(_x(), _x())


@case.program
def operator_getitem_setitem(x):
    lst = [x, x + 1, x + 2]
    operator.setitem(lst, 1, x * 5)
    operator.delitem(lst, 0)
    return operator.getitem(lst, 0) + operator.getitem(x, 1)


@case.program
def operator_comparisons_on_ints(x):
    n = sum(op(2, 3) for op in (operator.lt, operator.le, operator.eq, operator.ne,
                                operator.gt, operator.ge))
    return x + n + operator.index(3) + operator.truth([1])


@case.program
def operator_itemgetter_multiple(x):
    items = [x, x * 2, x * 3, x * 4]
    a, c = operator.itemgetter(0, 2)(items)
    return a + c


@case.program
def operator_attrgetter_dotted(x):
    m = torch.nn.Linear(4, 4)
    get = operator.attrgetter("weight.shape")
    return x * get(m)[0]


# -- math --------------------------------------------------------------------------------

@case.program
def math_constants_and_functions(x):
    return x * math.pi + math.sqrt(16) + math.log(math.e) + math.floor(2.7) \
        + math.exp(0) + math.cos(0) + math.hypot(3, 4)


@case.program
def math_isclose_inf_nan(x):
    a = math.isclose(0.1 + 0.2, 0.3)
    b = math.isinf(float("inf"))
    c = math.isnan(float("nan"))
    return x + a + b + c


@case.program
def math_prod_comb_factorial(x):
    return x * math.prod([1, 2, 3]) + math.comb(5, 2) + math.factorial(4) + math.perm(4, 2)


@case
def math_on_tensor_size(C):
    def f(x):
        n = math.prod(x.shape)
        d = int(math.sqrt(x.shape[-1]))
        return x.reshape(-1) * n + d

    return C(f)(_x(2, 16))


# -- strings -----------------------------------------------------------------------------

@case.program
def str_methods_constant(x):
    s = "Hello_World"
    n = len(s.lower()) + s.count("o") + s.find("W") + len(s.split("_"))
    ok = s.startswith("He") and s.endswith("ld") and s.upper().isupper()
    return x * n + ok


@case
def str_format_spec(C):
    def f(x):
        tag = "{:>6}|{:.2f}|{:03d}".format("ab", 3.14159, 7)
        name = f"{'layer'}_{2:02d}"
        return x + len(tag), tag, name

    return C(f)(_x())


@case
def str_of_shape_and_dtype(C):
    def f(x):
        return x + 1, str(x.dtype), f"{tuple(x.shape)}", repr(x.shape[0])

    return C(f)(_x(2, 3))


@case
def str_key_building_in_loop(C):
    def f(x):
        d = {}
        for i in range(3):
            d[f"k{i}"] = x * i
        return d["k1"] + d["k2"], sorted(d)

    return C(f)(_x())


@case.program
def str_join_of_generated_names(x):
    names = "-".join(str(i) for i in range(4))
    return x * len(names), names


# -- enum --------------------------------------------------------------------------------

class Mode(enum.Enum):
    ADD = 1
    MUL = 2


class Flag(enum.IntEnum):
    A = 1
    B = 2


@case
def enum_branch(C):
    def f(x, mode):
        if mode is Mode.ADD:
            return x + 1
        return x * 2

    g = C(f)
    return g(_x(), Mode.ADD), g(_x(), Mode.MUL)


@case.program
def enum_value_and_name(x):
    return x * Mode.MUL.value, Mode.ADD.name, Mode(2) is Mode.MUL


@case.program
def intenum_arithmetic(x):
    return x * (Flag.A + Flag.B), int(Flag.B)


@case
def enum_in_dict_key(C):
    table = {Mode.ADD: 10, Mode.MUL: 20}

    def f(x):
        return x + table[Mode.MUL]

    return C(f)(_x())


class Act(enum.Enum):
    RELU = "relu"
    TANH = "tanh"

    def apply(self, x):
        return x.relu() if self is Act.RELU else x.tanh()

    @property
    def is_relu(self):
        return self is Act.RELU


@case
def enum_method_and_property(C):
    def f(x, act):
        return act.apply(x) + act.is_relu, Act("tanh").apply(x)

    g = C(f)
    return g(_x(), Act.RELU), g(_x(), Act.TANH)


@case.program
def enum_iteration_and_membership(x):
    names = [m.name for m in Mode]
    return x * len(names) + (Mode.ADD in Mode), names


# -- isinstance and types ----------------------------------------------------------------

@case
def isinstance_on_arguments(C):
    def f(x, y):
        out = x
        for v in (y, 3, 2.5, "s", None, [1], (1,)):
            if isinstance(v, torch.Tensor):
                out = out + v
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                out = out * v
            elif v is None:
                out = out - 1
        return out

    return C(f)(_x(), _x())


@case.program
def type_checks_and_names(x):
    t = type(x)
    return x + (t is torch.Tensor), type(3).__name__, type(x).__name__  # noqa: UP003


@case
def issubclass_checks(C):
    class A:
        pass

    class B(A):
        pass

    def f(x):
        return x + issubclass(B, A) + issubclass(A, B) * 2 + issubclass(bool, int) * 4

    return C(f)(_x())


@case
def isinstance_nn_module_types(C):
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

    def f(x):
        for layer in m:
            if isinstance(layer, torch.nn.Linear):
                x = layer(x)
            else:
                x = x * 2
        return x

    return C(f)(_x())


# -- user classes ------------------------------------------------------------------------

@case.program
def class_made_in_frame(x):
    class Acc:
        def __init__(self):
            self.total = 0

        def add(self, v):
            self.total = self.total + v
            return self

    a = Acc()
    a.add(x).add(x * 2)
    return a.total


class Vec:
    def __init__(self, t):
        self.t = t

    def __add__(self, other):
        return Vec(self.t + other.t)

    def __mul__(self, k):
        return Vec(self.t * k)

    def __rmul__(self, k):
        return Vec(self.t * k)

    def __len__(self):
        return self.t.shape[0]

    def __getitem__(self, i):
        return self.t[i]

    def __iter__(self):
        return iter(self.t.unbind(0))

    def __neg__(self):
        return Vec(-self.t)


@case
def class_dunder_operators(C):
    def f(x, y):
        v = Vec(x) + Vec(y) * 2
        w = 3 * -v
        return w.t, len(w), w[1]

    return C(f)(_x(), _x())


@case
def class_dunder_iter(C):
    def f(x):
        return sum(Vec(x)) + sum(v * 2 for v in Vec(x))

    return C(f)(_x(3, 2))


class Celsius:
    def __init__(self, t):
        self._t = t

    @property
    def fahrenheit(self):
        return self._t * 9 / 5 + 32

    @fahrenheit.setter
    def fahrenheit(self, v):
        self._t = (v - 32) * 5 / 9

    @staticmethod
    def zero():
        return 0.0

    @classmethod
    def make(cls, t):
        return cls(t)


@case.program
def class_property_setter(x):
    c = Celsius.make(x)
    a = c.fahrenheit
    c.fahrenheit = a + 9
    return c._t + Celsius.zero(), a


class Base:
    scale = 2

    def __init__(self, t):
        self.t = t

    def run(self, x):
        return x * self.scale + self.t


class Child(Base):
    scale = 3

    def __init__(self, t):
        super().__init__(t * 2)

    def run(self, x):
        return super().run(x) + 1


@case.program
def class_super_chain(x):
    return Child(x).run(x), Base(x).run(x)


class Lazy:
    def __init__(self, t):
        self.t = t

    def __getattr__(self, name):
        if name.startswith("times"):
            return self.t * int(name[len("times"):])
        raise AttributeError(name)


@case.program
def class_getattr_fallback(x):
    lz = Lazy(x)
    return lz.times3 + lz.t, hasattr(lz, "other")


class Positive:
    """A data descriptor."""

    def __set_name__(self, owner, name):
        self.name = "_" + name

    def __get__(self, obj, objtype=None):
        return getattr(obj, self.name)

    def __set__(self, obj, value):
        setattr(obj, self.name, value.abs())


class HasDescriptor:
    v = Positive()

    def __init__(self, t):
        self.v = t


@case.program
def class_data_descriptor(x):
    h = HasDescriptor(x)
    return h.v + 1


@case
def class_data_descriptor_object_returned(C):
    def f(x):
        h = HasDescriptor(x - 10)
        h.v = h.v + x
        return h

    h = C(f)(_x())
    return h.v, sorted(vars(h))


@case
def class_reflected_and_inplace_operators(C):
    class Acc:
        def __init__(self, t):
            self.t = t

        def __radd__(self, other):
            return Acc(self.t + other)

        def __iadd__(self, other):
            self.t = self.t + other
            return self

        def __add__(self, other):
            return Acc(self.t + other.t) if isinstance(other, Acc) else NotImplemented

    def f(x):
        a = 1 + Acc(x)
        a += x
        total = sum([Acc(x), Acc(x * 2)], 0)  # 0 + Acc: __radd__, then Acc.__add__
        return a.t, total.t

    return C(f)(_x())


@case
def class_comparison_reflected(C):
    class W:
        def __init__(self, n):
            self.n = n

        def __lt__(self, other):
            return self.n < other.n

    def f(x):
        a, b = W(1), W(2)
        return x + (a < b) + (b > a) * 2 + (a > b) * 4

    return C(f)(_x())


@case
def class_instance_counter_attribute(C):
    class Counter:
        count = 0

        def __init__(self):
            Counter.count += 1

    def f(x):
        Counter()
        Counter()
        return x + Counter.count

    return C(f)(_x())


@case
def class_attribute_store_seen_through_instances(C):
    class Base:
        scale = 1

    class Child(Base):
        pass

    outside = Child()

    def f(x):
        made = Child()
        before = made.scale
        Base.scale = 3
        return x * made.scale + before + Child.scale + outside.scale, Base.scale

    out = C(f)(_x())
    return out, Base.scale, Child.scale, outside.scale


@case
def class_attribute_store_then_shadowed_by_instance(C):
    class Cfg:
        depth = 2

    def f(x, cfg):
        Cfg.depth += 1
        cfg.depth = 10
        return x * cfg.depth + Cfg.depth

    cfg = Cfg()
    out = C(f)(_x(), cfg)
    return out, Cfg.depth, cfg.depth


@case
def class_callable_object(C):
    class Scale:
        def __init__(self, k):
            self.k = k

        def __call__(self, x):
            return x * self.k

    s = Scale(3)

    def f(x):
        return s(x) + Scale(2)(x)

    return C(f)(_x())


@case
def class_eq_and_hash(C):
    class Key:
        def __init__(self, n):
            self.n = n

        def __eq__(self, other):
            return isinstance(other, Key) and self.n == other.n

        def __hash__(self):
            return hash(self.n)

    def f(x):
        return x * (Key(1) == Key(1)) + (Key(1) == Key(2)) + (Key(3) != Key(3))

    return C(f)(_x())


@case
def class_slots(C):
    class P:
        __slots__ = ("a", "b")

        def __init__(self, a, b):
            self.a = a
            self.b = b

    def f(x):
        p = P(x, 2)
        p.b = 3
        return p.a * p.b

    return C(f)(_x())


class _Slotted:
    __slots__ = ("w", "b")

    def __init__(self, w):
        self.w = w


class _SlottedWithDict(_Slotted):
    def __init__(self, w, tag):
        super().__init__(w)
        self.tag = tag


@case
def class_slots_returned_and_unset(C):
    def f(x):
        p = _Slotted(x * 2)
        has_b = hasattr(p, "b")
        p.b = 1
        q = _SlottedWithDict(x, "t")
        q.extra = 3
        return p, has_b, getattr(q, "b", 5), q

    p, has_b, b, q = C(f)(_x())
    return p.w, p.b, has_b, b, q.w, q.tag, q.extra, q.__dict__, type(q).__name__


@case.program
def class_slots_reject_unknown_attribute(x):
    p = _Slotted(x)
    try:
        p.other = 1
    except AttributeError:
        return x - 1
    return x + 1


@case
def class_bool_and_len(C):
    class Bag:
        def __init__(self, items):
            self.items = items

        def __len__(self):
            return len(self.items)

    def f(x):
        b = Bag([x, x])
        e = Bag([])
        return (x + len(b)) if b else x, bool(e)

    return C(f)(_x())


@case
def class_contains(C):
    class Range:
        def __init__(self, lo, hi):
            self.lo, self.hi = lo, hi

        def __contains__(self, v):
            return self.lo <= v < self.hi

    def f(x):
        r = Range(0, 5)
        return x + (3 in r) + (7 in r) * 2 + (9 not in r) * 4

    return C(f)(_x())


@case
def class_namedtuple_subclass_method(C):
    class Pair(collections.namedtuple("Pair", ["a", "b"])):
        def total(self):
            return self.a + self.b

    def f(x):
        p = Pair(x, x * 2)
        q = p._replace(b=x)
        return p.total(), q.total(), p._fields

    return C(f)(_x())


# -- itertools ---------------------------------------------------------------------------

@case.program
def itertools_chain_from_iterable(x):
    parts = [[x, x + 1], [x + 2]]
    return sum(itertools.chain.from_iterable(parts))


@case.program
def itertools_product_repeat(x):
    out = x
    for a, b in itertools.product(range(2), repeat=2):
        out = out + a * b
    return out


@case.program
def itertools_compress_and_filterfalse(x):
    items = [x, x * 2, x * 3, x * 4]
    kept = list(itertools.compress(items, [1, 0, 1, 0]))
    odd = list(itertools.filterfalse(lambda i: i % 2 == 0, range(6)))
    return sum(kept) * len(odd)


@case.program
def itertools_tee(x):
    a, b = itertools.tee(iter([x, x + 1, x + 2]))
    return sum(a) - sum(b) + x


@case.program
def itertools_islice_of_count_step(x):
    return [x * i for i in itertools.islice(itertools.count(1, 2), 3)]


# -- control flow and misc builtins ------------------------------------------------------

@case.program
def while_else_and_for_else(x):
    i = 0
    while i < 3:
        x = x + 1
        i += 1
    else:
        x = x * 2
    for j in range(3):
        if j == 5:
            break
    else:
        x = x - 1
    return x


@case.program
def walrus_in_comprehension(x):
    vals = [y for i in range(4) if (y := i * 2) > 2]
    return x * sum(vals), vals


@case
def match_statement(C):
    def f(x, spec):
        match spec:
            case ("scale", k):
                return x * k
            case {"shift": s}:
                return x + s
            case [a, b, *_]:
                return x * a + b
            case _:
                return x

    g = C(f)
    return g(_x(), ("scale", 3)), g(_x(), {"shift": 2})


@dataclasses.dataclass
class _Point:
    x: int
    y: int


class _Shape:
    __match_args__ = ("kind", "size")

    def __init__(self, kind, size):
        self.kind = kind
        self.size = size


@case
def match_class_patterns(C):
    def f(x, obj):
        match obj:
            case _Point(x=0, y=y):
                return x + y
            case _Point(a, b) if a > b:
                return x * a - b
            case _Shape("square", size=s) | _Shape("cube", s):
                return x * s
            case _Shape(kind=k):
                return x - len(k)
            case int(n):
                return x + n
            case _:
                return x * 2

    g = C(f)
    return (g(_x(), _Point(0, 3)), g(_x(), _Point(5, 2)), g(_x(), _Point(1, 2)),
            g(_x(), _Shape("square", 2)), g(_x(), _Shape("cube", 3)),
            g(_x(), _Shape("line", 1)), g(_x(), 7), g(_x(), "s"))


@case
def match_mapping_rest_and_star(C):
    def f(x, spec):
        match spec:
            case {"op": "add", "value": v, **rest}:
                return x + v, sorted(rest)
            case {"op": op}:
                return x - 1, op
            case [first, *middle, last]:
                return x * first + last, len(middle)
            case (1 | 2) as small:
                return x * small, small
            case _:
                return x + 1, None

    g = C(f)
    return (g(_x(), {"op": "add", "value": 2, "k": 1}), g(_x(), {"op": "mul"}),
            g(_x(), [1, 2, 3, 4]), g(_x(), 2), g(_x(), "abc"))


@case
def match_tensors_in_sequence(C):
    def f(pair):
        match pair:
            case (a, b) if a.dim() == b.dim():
                return a + b
            case (a, *_):
                return a * 2
            case _:
                return pair - 1

    g = C(f)
    return g((_x(), _x())), g([_x(3), _x(2, 2)]), g(_x())


@case.program
def ternary_and_chained_compare(x):
    n = x.shape[0]
    y = x * 2 if 1 < n <= 4 else x
    return y if n != 3 else -y


@case
def global_counter_write(C):
    def f(x):
        global _COUNTER
        _COUNTER += 1
        return x + _COUNTER

    g = C(f)
    globals()["_COUNTER"] = 0
    return g(_x()), g(_x()), _COUNTER


_COUNTER = 0


@case.program
def builtins_round_abs_pow_divmod(x):
    q, r = divmod(17, 5)
    return x * round(2.567, 2) + abs(-3) + pow(2, 5) + q + r + pow(3, 2, 5)


@case.program
def builtins_chr_ord_hex_bin(x):
    return x + ord("a") + len(hex(255)) + len(bin(5)) + int("101", 2), chr(65)


@case.program
def builtins_min_max_of_tensors_list(x):
    shapes = [t.shape[0] for t in (x, x[:2], x[:3])]
    return x[: min(shapes)] * max(shapes)


@case.program
def builtins_zip_dict_and_reversed(x):
    keys = ["a", "b", "c"]
    d = dict(zip(keys, (x, x + 1, x + 2)))  # noqa: B905 - plain zip is the point
    return [d[k] for k in reversed(keys)]


@case.program
def builtins_sum_of_ints_then_tensor(x):
    return x * sum(range(5)) + sum([0.5, 1.5])


@case
def builtins_all_any_of_shapes(C):
    def f(x, y):
        if all(a == b for a, b in zip(x.shape, y.shape)):  # noqa: B905 - plain zip is the point
            return x + y
        return x

    return C(f)(_x(2, 3), _x(2, 3))


@case.program
def builtins_id_of_same_object(x):
    a = [x]
    b = a
    return x + (id(a) == id(b)) + (a is b)


@case.program
def builtins_iter_sentinel_loop(x):
    vals = iter([1, 2, 3, 0, 5])
    out = x
    for v in iter(lambda: next(vals), 0):
        out = out + v
    return out


@case.program
def builtins_sorted_dict_items_by_value(x):
    d = {"a": 3, "b": 1, "c": 2}
    order = [k for k, _ in sorted(d.items(), key=lambda kv: kv[1])]
    return x * d[order[0]], order


# -- tensor methods with Python scalars --------------------------------------------------

@case.program
def tensor_python_scalar_ops(x):
    return (2 - x, 3 / (x.abs() + 1), 2 ** x, x // 2, x % 3, x.clamp(min=-0.5, max=0.5),
            x.pow(2).add(1, alpha=2), x.new_full((2,), 3.0), x.new_zeros(3))


@case
def tensor_size_arith(C):
    def f(x):
        b, n = x.size()
        return x.view(b * n).reshape(n, b) + x.numel() + x.dim() + x.size(-1)

    return C(f)(_x(2, 3))


@case.program
def tensor_item_free_dtype_properties(x):
    y = x.to(torch.float64) if x.dtype == torch.float32 else x
    return y * x.is_floating_point() + x.element_size() + x.is_contiguous()


@case
def tensor_inplace_on_list_items(C):
    def f(xs):
        for t in xs:
            t.mul_(2).add_(1)
        xs[0].zero_()
        return xs

    return C(f)([_x(), _x(), _x()])


@case
def tensor_setitem_with_mask_and_slice(C):
    def f(x):
        y = x.clone()
        y[y > 0] = 0.0
        y[:2] = y[:2] + 1
        y[..., -1] = 7
        return y

    return C(f)(_x(3, 4))


@case
def tensor_unbind_split_chunk_loops(C):
    def f(x):
        out = [a + b for a, b in zip(x.unbind(0), x.flip(0).unbind(0))]  # noqa: B905 - plain zip is the point
        parts = x.split(1, dim=1)
        chunks = x.chunk(2, dim=0)
        return torch.stack(out), torch.cat(parts[::-1], 1), chunks[1] - chunks[0]

    return C(f)(_x(4, 3))


@case
def tensor_python_list_index(C):
    def f(x):
        idx = [0, 2]
        return x[idx], x[[1, 1]], x[torch.tensor(idx)]

    return C(f)(_x(4, 3))


@case.program
def tensor_from_python_list_and_scalar(x):
    k = torch.tensor([1.0, 2.0, 3.0, 4.0])
    s = torch.tensor(3.0)
    return x * k + s, torch.as_tensor([1, 2]) + 1


@case.program
def tensor_dtype_promotion_with_python_scalars(x):
    i = x.to(torch.int64)
    return i + 1, i * 2.5, i / 2, (i > 0) + 1, torch.full((2,), 7).dtype == torch.int64


@case
def tensor_requires_grad_branch(C):
    def f(x):
        if x.requires_grad:
            return x * 2
        return x + 1

    g = C(f)
    return g(_x()), g(_x().requires_grad_()).detach()


@case.program
def tensor_backward_inside_frame(x):
    x = x.detach().requires_grad_()
    y = (x * x).sum()
    y.backward()
    return x.grad


test_matches_torch_compile, test_gives_eagers_answer = case.tests(__file__)
