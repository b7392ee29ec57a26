"""Random ops as counter-based random numbers (``ops.rand`` / ``ops.randn`` / ``ops.randint64``):
rand, randn (and ``_like``), randint (spans up to 2**31), bernoulli, native_dropout, uniform,
normal and exponential.

Each graph call draws one int64 seed from the device's default torch generator (an extern
``aten.randint`` of shape [1], the graph's ``seed buffer``), so ``torch.manual_seed(s)`` makes
compiled runs reproducible, two calls draw different numbers, and a CUDA-graph replay draws a
fresh seed (torch's CUDA generator is graph-safe). Element ``e`` (row-major linear index) of the
``k``-th random op of the graph takes the number at ``offset = base_k + e``, where ``base_k`` is
the sum of the sizes of the random ops lowered before it: no two ops of a graph share numbers,
and a value recomputed in another kernel (an inlined producer, a recompile) is bit-identical.

Where these lowerings apply (``random_numbers(policy)``, default ``"auto"``): ``"philox"``
always; ``"eager"`` never (every random op is the declared aten call: eager's generator, so
results match eager's random stream); ``"auto"``: where the default codegen of the op's device
declares philox random ops (``CodegenEntry.philox``: Triton on CUDA), eager's generator
elsewhere (the C++ codegen on CPU: CPU results keep matching eager's). A lowering that does not
apply raises ``LoweringError``: the node takes the aten call.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import sympy
import torch

from ..codegen_registry import CodegenUnavailable, codegen_for_device_type
from ..counters import counters
from ..ir.values import Buffer, ExternKernel, IRNode, Layout, Pointwise, compute_dtype
from ..lowering import (
    LoweringError,
    aten_ops,
    broadcast_loader,
    constant_value,
    current,
    lowering,
    meta_val,
    to_dtype,
)
from ..sizevars import contiguous_strides
from ..virtualized import ops

aten = torch.ops.aten
log = logging.getLogger("kiln.loopir")

__all__ = ["RANDOM_POLICIES", "random_numbers", "philox_applies", "PhiloxState", "SEED_OP"]

#: see the module docstring
RANDOM_POLICIES = ("auto", "philox", "eager")
_policy: contextvars.ContextVar[str] = contextvars.ContextVar("kiln_random_numbers", default="auto")

#: the op drawing a graph call's seed: ``randint(-2**63, 2**63 - 1, [1])`` on the device
SEED_OP = aten.randint.low
_SEED_RANGE = (-(2**63), 2**63 - 1)
#: ``ops.randint64`` draws uniformly only for spans up to this (larger: eager's generator)
_MAX_RANDINT_SPAN = 2**31


@contextlib.contextmanager
def random_numbers(policy: str) -> Iterator[None]:
    """Lower random ops with ``policy`` (one of ``RANDOM_POLICIES``) inside the block."""
    if policy not in RANDOM_POLICIES:
        raise ValueError(f"unknown random-number policy {policy!r}; known: {', '.join(RANDOM_POLICIES)}")
    token = _policy.set(policy)
    try:
        yield
    finally:
        _policy.reset(token)


def philox_applies(device: torch.device) -> bool:
    """Whether random ops on ``device`` become philox ops under the current policy."""
    policy = _policy.get()
    if policy != "auto":
        return policy == "philox"
    try:
        return bool(getattr(codegen_for_device_type(device.type), "philox", False))
    except CodegenUnavailable:
        return False


@dataclass
class PhiloxState:
    """One graph's random numbers: the buffer holding this call's seed, and the first offset
    no random op of the graph has taken yet."""

    seed: Buffer
    next_offset: sympy.Expr

    def __str__(self) -> str:
        return f"PhiloxState(seed {self.seed.name}, next offset {self.next_offset})"

    def take(self, numel: sympy.Expr) -> sympy.Expr:
        """The base offset of an op drawing ``numel`` numbers (reserved for it)."""
        base = self.next_offset
        self.next_offset = sympy.expand(base + numel)
        return base


def _state(device: torch.device) -> PhiloxState:
    """The current graph's PhiloxState; its first call adds the seed extern."""
    g = current()
    if g.random_state is None:
        layout = Layout(device, torch.int64, [sympy.Integer(1)], [sympy.Integer(1)])
        seed = ExternKernel(g.graph.new_name(), layout, SEED_OP, [*_SEED_RANGE, [1]],
                            {"dtype": torch.int64, "device": device})
        g.graph.register_buffer(seed)
        counters["externs"] += 1
        g.random_state = PhiloxState(seed, sympy.Integer(0))
    return g.random_state


def _target() -> tuple[torch.device, torch.dtype, list[sympy.Expr]]:
    """(device, dtype, size) of the random tensor being lowered (its traced value), after
    checking that philox applies to it."""
    meta = meta_val()
    if isinstance(meta, (tuple, list)):
        meta = meta[0]
    if not isinstance(meta, torch.Tensor):
        raise LoweringError("random op without a tensor meta value")
    if not philox_applies(meta.device):
        raise LoweringError(f"random numbers on {meta.device.type}: eager's generator "
                            "(random_numbers policy / the device's codegen has no philox ops)")
    g = current()
    return meta.device, meta.dtype, [g.expr(s) for s in meta.shape]


def _random_pointwise(kind: str, device, size, finish: Callable) -> Callable:
    """A body factory: ``finish(index, number)`` builds an element from its random ``number``
    (``ops.<kind>`` of the seed and the element's offset). The base offset is taken now, once:
    every body built from the result reads the same numbers."""
    state = _state(device)
    numel = sympy.Mul(*size) if size else sympy.Integer(1)
    base = state.take(numel)
    seed_name = state.seed.name
    strides = contiguous_strides(size)

    def number(index, *extra):
        linear = sum((i * s for i, s in zip(index, strides, strict=True)), sympy.Integer(0))
        seed = ops.load(seed_name, sympy.Integer(0))
        offset = ops.index_expr(base + linear, torch.int64)
        return getattr(ops, kind)(seed, offset, *extra)

    return lambda index: finish(index, number)


def _distribution(kind: str):
    src = torch.int64 if kind == "randint64" else torch.float32

    def lower(*args, **kwargs):
        device, dtype, size = _target()
        if dtype.is_complex or (kind != "randint64" and not dtype.is_floating_point):
            raise LoweringError(f"{kind} of dtype {dtype}")
        body = _random_pointwise(kind, device, size, lambda index, number: to_dtype(number(index), src, dtype))
        return Pointwise(device, dtype, size, body)

    return lower


lowering(*aten_ops("rand.default", "rand_like.default"))(_distribution("rand"))
lowering(*aten_ops("randn.default", "randn_like.default"))(_distribution("randn"))


def _int_bound(v) -> int:
    if isinstance(v, sympy.Basic):
        if not v.is_Integer:
            raise LoweringError(f"randint bound {v} is symbolic")
        return int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise LoweringError(f"randint bound {v!r} is not an int")
    return v


def _randint(low, high):
    low, high = _int_bound(low), _int_bound(high)
    if not 0 < high - low <= _MAX_RANDINT_SPAN:
        raise LoweringError(f"randint over [{low}, {high}): span outside [1, 2**31]")
    device, dtype, size = _target()
    if dtype == torch.bool or dtype.is_complex:
        raise LoweringError(f"randint of dtype {dtype}")

    def finish(index, number):
        r = number(index, ops.constant(low, torch.int64), ops.constant(high, torch.int64))
        return to_dtype(r, torch.int64, dtype)

    return Pointwise(device, dtype, size, _random_pointwise("randint64", device, size, finish))


@lowering(*aten_ops("randint.low"))
def _randint_low(low, high, size, **kwargs):
    return _randint(low, high)


@lowering(*aten_ops("randint.default"))
def _randint_high(high, size, **kwargs):
    return _randint(0, high)


@lowering(*aten_ops("randint_like.default"))
def _randint_like_high(x, high, **kwargs):
    return _randint(0, high)


@lowering(*aten_ops("randint_like.low_dtype"))
def _randint_like_low(x, low, high, **kwargs):
    return _randint(low, high)


def _no_generator(kwargs) -> None:
    if kwargs.get("generator") is not None:
        raise LoweringError("an explicit torch.Generator: eager's generator")


@lowering(*aten_ops("bernoulli.p"))
def _bernoulli_p(x: IRNode, p=0.5, **kwargs):
    """1 with probability ``p`` (``rand < p``), in x's dtype."""
    _no_generator(kwargs)
    if not isinstance(p, (int, float)) or isinstance(p, bool):
        raise LoweringError(f"bernoulli probability {p!r} is not a number")
    device, dtype, size = _target()
    if dtype.is_complex:
        raise LoweringError(f"bernoulli of dtype {dtype}")

    def finish(index, number):
        hit = ops.lt(number(index), ops.constant(float(p), torch.float32))
        return to_dtype(hit, torch.bool, dtype)

    return Pointwise(device, dtype, size, _random_pointwise("rand", device, size, finish))


@lowering(*aten_ops("bernoulli.default"))
def _bernoulli(x: IRNode, **kwargs):
    """1 with probability ``x[e]`` at each element ``e`` (``rand < x``), in x's dtype."""
    _no_generator(kwargs)
    device, dtype, size = _target()
    if not x.get_dtype().is_floating_point or dtype.is_complex:
        raise LoweringError(f"bernoulli of probabilities of dtype {x.get_dtype()}")
    load = x.make_loader()
    src = x.get_dtype()

    def finish(index, number):
        prob = to_dtype(load(index), src, torch.float32)
        return to_dtype(ops.lt(number(index), prob), torch.bool, dtype)

    return Pointwise(device, dtype, size, _random_pointwise("rand", device, size, finish))


@lowering(*aten_ops("native_dropout.default"))
def _native_dropout(x: IRNode, p, train=None):
    """``(x * mask * scale, mask)``: an element is kept (mask True) with probability ``1 - p``,
    ``scale = 1 / (1 - p)`` (0 when p == 1). Both outputs read the same numbers, so the
    scheduler fuses them into one kernel computing the mask once."""
    if train is False:
        raise LoweringError("native_dropout in eval mode")
    if not isinstance(p, (int, float)) or isinstance(p, bool):
        raise LoweringError(f"dropout probability {p!r} is not a number")
    device, dtype, size = _target()
    if not dtype.is_floating_point:
        raise LoweringError(f"native_dropout of dtype {dtype}")
    cd = compute_dtype(dtype)
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    load = x.make_loader()
    keep_p = float(1.0 - p)
    body = _random_pointwise(
        "rand", device, size,
        lambda index, number: ops.lt(number(index), ops.constant(keep_p, torch.float32)))

    def output(index):
        kept = ops.to_dtype(body(index), cd)
        scaled = ops.mul(ops.mul(load(index), kept), constant_value(scale, dtype))
        return to_dtype(scaled, cd, dtype)

    return (Pointwise(device, dtype, size, output), Pointwise(device, torch.bool, size, body))


def _scalar(v, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise LoweringError(f"{what} {v!r} is not a number")
    return float(v)


def _affine(kind: str, shift, scale, **kwargs) -> Pointwise:
    """``shift + scale * ops.<kind>`` per element; ``shift``/``scale``: Python numbers or
    tensors broadcast to the result."""
    _no_generator(kwargs)
    device, dtype, size = _target()
    if not dtype.is_floating_point:
        raise LoweringError(f"{kind} of dtype {dtype}")
    cd = compute_dtype(dtype)

    def operand(v):
        if isinstance(v, IRNode):
            load, src = broadcast_loader(v, size), v.get_dtype()
            return lambda index: to_dtype(load(index), src, cd)
        return lambda index: constant_value(v, dtype)

    shift_of, scale_of = operand(shift), operand(scale)

    def finish(index, number):
        value = ops.add(shift_of(index), ops.mul(scale_of(index), to_dtype(number(index), torch.float32, cd)))
        return to_dtype(value, cd, dtype)

    return Pointwise(device, dtype, size, _random_pointwise(kind, device, size, finish))


@lowering(*aten_ops("uniform.default"))
def _uniform(x: IRNode, low=0.0, high=1.0, **kwargs):
    """``low + (high - low) * rand``."""
    low, high = _scalar(low, "uniform bound"), _scalar(high, "uniform bound")
    return _affine("rand", low, high - low, **kwargs)


@lowering(*aten_ops("normal.Tensor_float", "normal.float_Tensor", "normal.Tensor_Tensor"))
def _normal_tensors(mean, std=1.0, **kwargs):
    """``mean + std * randn`` (either may be a tensor)."""
    return _affine("randn", mean, std, **kwargs)


@lowering(*aten_ops("normal.float_float"))
def _normal_numbers(mean, std, size, **kwargs):
    return _affine("randn", _scalar(mean, "normal mean"), _scalar(std, "normal std"), **kwargs)


@lowering(*aten_ops("exponential.default"))
def _exponential(x: IRNode, lambd=1.0, **kwargs):
    """``-log1p(-rand) / lambd`` (rand < 1: finite)."""
    _no_generator(kwargs)
    lambd = _scalar(lambd, "exponential rate")
    device, dtype, size = _target()
    if not dtype.is_floating_point or lambd <= 0:
        raise LoweringError(f"exponential of dtype {dtype}, rate {lambd}")
    cd = compute_dtype(dtype)

    def finish(index, number):
        u = to_dtype(number(index), torch.float32, cd)
        value = ops.truediv(ops.neg(ops.log1p(ops.neg(u))), constant_value(lambd, dtype))
        return to_dtype(value, cd, dtype)

    return Pointwise(device, dtype, size, _random_pointwise("rand", device, size, finish))
