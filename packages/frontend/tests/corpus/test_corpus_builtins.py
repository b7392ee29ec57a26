"""Corpus: builtins, constants, strings, dataclasses, namedtuples, containers and
comprehensions, tensor attributes, in-place tensor ops."""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import operator

import torch
import torch.nn.functional as F
from _harness import Case as _Case
from _harness import case_params, check_case

#: every case here also runs a second time on new tensor values
Case = functools.partial(_Case, fresh_inputs=True)


def _t(*shape):
    return torch.randn(*shape)


# -- builtins on constants and tensors -----------------------------------------------------


def builtins_len_range_enumerate(x, xs):
    out = x
    for i in range(len(xs)):
        out = out + xs[i] * i
    for i, t in enumerate(xs, start=1):
        out = out - t / i
    return out, len(xs), len(x)


def builtins_zip_min_max(x, xs):
    n = min(len(xs), 3)
    m = max(x.shape)
    out = x * n + m
    for a, b in zip(xs, reversed(xs), strict=True):
        out = out + a * b
    return out, max(2, 7, 5), min([4, 1, 9])


def builtins_sum_abs(x, xs):
    return sum(xs), sum([t * 2 for t in xs], x), abs(x), abs(-3.5)


def builtins_isinstance_type(x, xs):
    out = x
    if isinstance(x, torch.Tensor):
        out = out + 1
    if isinstance(xs, (list, tuple)) and not isinstance(xs, dict):
        out = out * 2
    if type(x) is torch.Tensor and int is int:
        out = out - 1
    return out, isinstance(1.0, float), type(xs) is list


def builtins_numeric_casts(x):
    n = x.shape[0]
    half = int(n / 2)
    scale = float(n) ** 0.5
    flag = bool(n > 3)
    return x[:half] * scale if flag else x, round(2.567, 2), divmod(17, 5)


def builtins_math(x):
    d = x.shape[-1]
    return x / math.sqrt(d) + math.pi * math.floor(2.7) + math.log(math.e), math.ceil(d / 3)


def builtins_any_all_callable(x, xs):
    flags = [t.dim() == 1 for t in xs]
    out = x
    if all(flags) and not any(f is False for f in flags):
        out = out + 1
    if callable(torch.sin):
        out = out * 3
    return out


def builtins_getattr_hasattr(x):
    fn = torch.cos
    missing = getattr(x, "does_not_exist", None)
    has = hasattr(x, "shape") and not hasattr(3, "shape")
    return fn(x) if has and missing is None else x


def builtins_operator_module(x, y):
    return operator.add(x, y), operator.mul(x, 2), operator.getitem(x, 0), operator.neg(y)


# -- strings ---------------------------------------------------------------------------------


def strings_fstring_format(x):
    d = {}
    for i in range(3):
        d[f"layer{i}"] = x * i
    key = f"layer{2}"
    name = f"{x.dtype}-{x.shape[0]:03d}-{'ok'!r}"
    return d[key] + d["layer1"], name, "a,b,c".split(","), "-".join(["x", "y"])


def strings_methods(x):
    s = "Hello"
    out = x
    if s.lower().startswith("he") and s.upper() == "HELLO":
        out = out * 2
    return out, s.replace("l", "L"), len(s), "ell" in s, s[1:3]


# -- dataclasses, namedtuples ----------------------------------------------------------------


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor
    scale: float = 1.0

    def total(self):
        return (self.a + self.b) * self.scale


@dataclasses.dataclass(frozen=True)
class Config:
    depth: int = 2
    width: int = 4


Point = collections.namedtuple("Point", ["x", "y"])


class TypedPoint(tuple):
    pass


def dataclass_from_input(p):
    return p.total() + p.a * p.scale


def dataclass_made_in_frame(x, y):
    p = Pair(x, y, scale=2.0)
    q = Pair(a=y, b=x)
    return p.total() - q.total(), p.scale + q.scale


def dataclass_returned(x, y):
    return Pair(x.sin(), y.cos(), 3.0)


def dataclass_config_constant(x, cfg):
    for _ in range(cfg.depth):
        x = x * cfg.width
    return x, dataclasses.replace(cfg, depth=5).depth


def dataclass_fields_and_asdict(x, y):
    p = Pair(x, y)
    names = [f.name for f in dataclasses.fields(p)]
    return names, p.b + 1


def namedtuple_made_and_returned(x, y):
    p = Point(x + 1, y=y * 2)
    q = p._replace(x=p.x * 3)
    return q, p.x + p[1], len(p)


def namedtuple_from_input(pt):
    a, b = pt
    return pt.x * pt.y + a - b


def torch_return_types(x):
    r = torch.max(x, dim=0)
    vals, idx = x.min(dim=1)
    return r.values + r[0], r.indices, vals, idx


# -- containers ------------------------------------------------------------------------------


def list_ops(x, y):
    lst = [x, y]
    lst.append(x * y)
    lst.extend([y, x])
    lst.insert(0, x - y)
    last = lst.pop()
    first = lst.pop(0)
    lst.reverse()
    lst2 = lst + [last] * 2
    lst2[1] = first
    return lst2[::-1], lst[-2:], len(lst2), lst2.index(lst2[2]) if False else 0


def tuple_ops(x, y):
    t = (x, y) + (x * 2,)
    a, *rest = t
    u = t[1:] * 2
    return a + sum(rest), len(u), u[-1], t.index(y) if False else (1, 2).index(2)


def dict_ops(x, y):
    d = {"a": x, "b": y}
    d["c"] = x + y
    d.update({"d": x * 2}, e=y * 3)
    e = d.pop("e")
    v = d.get("zz", x) + d.get("a")
    d.setdefault("f", y)
    items = [(k, val * 2) for k, val in d.items()]
    keys = list(d.keys())
    total = sum(d.values())
    return dict(items), keys, total, e, v, "a" in d, "zz" not in d


def dict_comprehension_and_copy(x):
    d = {f"k{i}": x * i for i in range(3)}
    d2 = d.copy()
    d2["k0"] = x - 1
    merged = {**d, **d2, "extra": x}
    return d, d2, merged


def set_ops(x):
    s = {1, 2, 3}
    s.add(4)
    s2 = {i % 3 for i in range(10)}
    out = x
    if 4 in s and len(s2) == 3 and s2 <= s | {0}:
        out = out + 1
    return out, sorted(s | s2), frozenset([1, 2]) == frozenset({2, 1})


def nested_comprehensions(x, xs):
    grid = [[a * b for b in xs] for a in xs]
    flat = [v for row in grid for v in row if v.dim() == 1]
    gen_sum = sum(t.sum() for t in xs)
    return torch.stack(flat), gen_sum + x.sum()


def slicing_and_unpacking(x, xs):
    a, b, *c = xs
    (p, q), r = (a, b), c[0]
    return p + q * r, xs[1:][0], xs[::-1][0], x[1:, :2], x[..., 0]


def list_from_input_read_only(x, xs):
    ys = list(xs)
    ys.append(x)
    return torch.cat(ys), xs[0] is xs[0], len(xs)


def sorted_and_reversed(x, d):
    keys = sorted(d)
    out = x
    for k in reversed(keys):
        out = out * d[k]
    return out, sorted(d.items(), key=lambda kv: kv[0])[0][0]


# -- tensor attributes as constants -----------------------------------------------------------


def tensor_attrs(x):
    b, c = x.shape
    out = x.reshape(c, b) if x.ndim == 2 else x
    info = (x.size(), x.size(-1), x.dtype, x.device, x.ndim, x.dim(), x.numel(), x.is_cuda,
            x.requires_grad, x.is_floating_point(), x.shape[-1], x.device.type)
    return out.T, info, x.new_zeros(x.shape[0]), x.is_contiguous()


def tensor_dtype_logic(x, y):
    if x.dtype == torch.float32 and y.dtype in (torch.int64, torch.int32):
        return x + y.to(x.dtype)
    return x


def tensor_methods_and_torch_fns(x):
    y = x.view(-1).unsqueeze(0).expand(3, -1).contiguous()
    z = torch.where(x > 0, x, torch.zeros_like(x))
    return y.sum(dim=1, keepdim=True), z, F.softmax(x, dim=-1), x.chunk(2, dim=0)[1], \
        torch.cat([x, x], dim=1).split([1, 7], dim=1)


# -- in-place and mutation of inputs ----------------------------------------------------------


def inplace_add_input(x):
    x.add_(1)
    x.mul_(2)
    return x


def setitem_input(x, v):
    x[0] = 5
    x[1, :2] = v
    x[:, -1] += 1
    return x.sum()


def inplace_on_view_of_input(x):
    v = x[0]
    v.zero_()
    x.t_() if False else None
    return x * 2


def inplace_intermediate(x):
    y = x * 2
    y.add_(1).relu_()
    y[0] = 0
    return y


def inplace_list_of_inputs(xs):
    for t in xs:
        t.sub_(1)
    return xs[0] + xs[1]


def out_variant_and_copy(x, y):
    torch.add(x, 1, out=y)
    x.copy_(y * 3)
    return x + y


_x44 = _t(4, 4)

CASES = [
    Case(builtins_len_range_enumerate, (_t(3), [_t(3), _t(3), _t(3)]), 1, fullgraph=True),
    Case(builtins_zip_min_max, (_t(3, 3), [_t(3, 3), _t(3, 3)]), 1, fullgraph=True),
    Case(builtins_sum_abs, (_t(3), [_t(3), _t(3)]), 1, fullgraph=True),
    Case(builtins_isinstance_type, (_t(3), [_t(3)]), 1, fullgraph=True),
    Case(builtins_numeric_casts, (_t(6, 2),), 1, fullgraph=True),
    Case(builtins_math, (_t(3, 9),), 1, fullgraph=True),
    Case(builtins_any_all_callable, (_t(3), [_t(2), _t(5)]), 1, fullgraph=True),
    Case(builtins_getattr_hasattr, (_t(3),), 1, fullgraph=True),
    Case(builtins_operator_module, (_t(3), _t(3)), 1, fullgraph=True),
    Case(strings_fstring_format, (_t(3),), 1, fullgraph=True),
    Case(strings_methods, (_t(3),), 1, fullgraph=True),
    Case(dataclass_from_input, (Pair(_t(3), _t(3), 0.5),), 1, fullgraph=True),
    Case(dataclass_made_in_frame, (_t(3), _t(3)), 1, fullgraph=True),
    Case(dataclass_returned, (_t(3), _t(3)), 1, fullgraph=True),
    Case(dataclass_config_constant, (_t(3), Config()), 1, fullgraph=True),
    Case(dataclass_fields_and_asdict, (_t(3), _t(3)), 1, fullgraph=True),
    Case(namedtuple_made_and_returned, (_t(3), _t(3)), 1, fullgraph=True),
    Case(namedtuple_from_input, (Point(_t(3), _t(3)),), 1, fullgraph=True),
    Case(torch_return_types, (_t(3, 4),), 1, fullgraph=True),
    Case(list_ops, (_t(3), _t(3)), 1, fullgraph=True),
    Case(tuple_ops, (_t(3), _t(3)), 1, fullgraph=True),
    Case(dict_ops, (_t(3), _t(3)), 1, fullgraph=True),
    Case(dict_comprehension_and_copy, (_t(3),), 1, fullgraph=True),
    Case(set_ops, (_t(3),), 1, fullgraph=True),
    Case(nested_comprehensions, (_t(3), [_t(3), _t(3)]), 1, fullgraph=True),
    Case(slicing_and_unpacking, (_t(3, 4), [_t(2), _t(2), _t(2)]), 1, fullgraph=True),
    Case(list_from_input_read_only, (_t(3), [_t(2), _t(2)]), 1, fullgraph=True),
    Case(sorted_and_reversed, (_t(3), {"b": 2.0, "a": 3.0, "c": 0.5}), 1, fullgraph=True),
    Case(tensor_attrs, (_t(3, 5),), 1, fullgraph=True),
    Case(tensor_dtype_logic, (_t(3), torch.arange(3)), 1, fullgraph=True),
    Case(tensor_methods_and_torch_fns, (_t(2, 4),), 1, fullgraph=True),
    Case(inplace_add_input, (_t(3),), 1, fullgraph=True),
    Case(setitem_input, (_t(4, 3), _t(2)), 1, fullgraph=True),
    Case(inplace_on_view_of_input, (_t(3, 3),), 1, fullgraph=True),
    Case(inplace_intermediate, (_t(3),), 1, fullgraph=True),
    Case(inplace_list_of_inputs, ([_t(3), _t(3)],), 1, fullgraph=True),
    Case(out_variant_and_copy, (_t(3), _t(3)), 1, fullgraph=True),
]


@case_params(CASES)
def test_builtins_case(case):
    case.check()


def test_input_mutation_visible_to_caller():
    x = torch.zeros(3)
    res = check_case(inplace_add_input, (x,), 1, fullgraph=True)
    # the harness compared the mutated inputs; check the returned tensor is the input itself
    assert res.result.data_ptr() != 0
