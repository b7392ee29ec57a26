"""The reference executor: runs a Schedule with torch ops, on any device.

Each SchedNode is evaluated vectorized over its whole iteration space: the loop symbols
become broadcastable ``arange`` tensors (outer dims first, then the node's inner dims), index
expressions are evaluated on them, loads are gathers from the flat storage of a buffer, stores
are scatters (``index_put_``) into buffers allocated with ``empty_strided`` per the memory plan,
and reductions are torch reductions over the inner dims. Nodes of a group run one after the
other over all outer points, which is equivalent to the per-point order because fusion only
allows same-outer-point dependencies.

This is the oracle every codegen is compared with.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import sympy
import torch

from .ir.graph import LoopGraph
from .ir.schedule import ExternNode, FusedGroup, Schedule
from .ir.values import ReinterpretView
from .ops_spec import OPS, reduction_identity
from .scheduler import schedule
from .sizevars import IndexEvaluator, index_symbol, reduction_symbol
from .virtualized import set_ops_handler

__all__ = ["interpret", "Interpreter"]


class _Handler:
    """Ops on tensors broadcast over the node's iteration space."""

    def __init__(self, interp: Interpreter, env: dict, full_shape: list[int], n_outer: int):
        self.interp = interp
        self.env = env  # symbol -> int | tensor
        self.full_shape = full_shape
        self.n_outer = n_outer
        self.device = interp.device
        self._ind = 0
        self.ev = IndexEvaluator(env, self.device)

    def _idx(self, index):
        v = self.ev(sympy.sympify(index))
        if not isinstance(v, torch.Tensor):
            v = torch.tensor(v, dtype=torch.int64, device=self.device)
        return v

    def load(self, name, index):
        flat = self.interp.flat(name)
        idx = self._idx(index)
        return flat[idx]

    def store(self, name, index, value, mode=None):
        flat = self.interp.flat(name)
        idx = self._idx(index)
        shape = self.full_shape
        idx = idx.expand(shape) if idx.dim() <= len(shape) else idx
        value = _as_tensor(value, flat.dtype, self.device)
        if value.dtype != flat.dtype:
            value = value.to(flat.dtype)
        value = value.expand(shape)
        if mode == "atomic_add":
            flat.index_put_((idx.reshape(-1),), value.reshape(-1), accumulate=True)
        else:
            flat.index_put_((idx.reshape(-1),), value.reshape(-1))

    def reduction(self, dtype, src_dtype, reduction_type, value):
        shape = self.full_shape
        value = _as_tensor(value, src_dtype, self.device).expand(shape)
        n_inner = len(shape) - self.n_outer
        outer_shape = shape[: self.n_outer]
        v = value.reshape(outer_shape + [-1])
        if reduction_type == "sum":
            r = torch.sum(v.to(dtype), -1)
        elif reduction_type == "prod":
            r = torch.prod(v.to(dtype), -1)
        elif reduction_type == "max":
            r = torch.amax(v, -1) if v.shape[-1] else torch.full(outer_shape, _ident(reduction_type, v.dtype), dtype=v.dtype, device=self.device)
        elif reduction_type == "min":
            r = torch.amin(v, -1) if v.shape[-1] else torch.full(outer_shape, _ident(reduction_type, v.dtype), dtype=v.dtype, device=self.device)
        elif reduction_type == "argmax":
            r = _argext(v, True)
        elif reduction_type == "argmin":
            r = _argext(v, False)
        elif reduction_type == "any":
            r = torch.any(v.to(torch.bool), -1)
        elif reduction_type == "all":
            r = torch.all(v.to(torch.bool), -1)
        elif reduction_type == "welford_mean":
            r = torch.mean(v.to(dtype), -1)
        elif reduction_type == "welford_m2":  # the oracle: exact two-pass
            w = v.to(dtype)
            r = torch.sum((w - torch.mean(w, -1, keepdim=True)) ** 2, -1)
        else:
            raise NotImplementedError(f"reduction {reduction_type}")
        r = r.to(dtype)
        return r.reshape(outer_shape + [1] * n_inner)

    def store_reduction(self, name, index, value):
        flat = self.interp.flat(name)
        shape = self.full_shape[: self.n_outer] + [1] * (len(self.full_shape) - self.n_outer)
        idx = self._idx(index).expand(shape)
        value = value.to(flat.dtype).expand(shape)
        flat.index_put_((idx.reshape(-1),), value.reshape(-1))

    def index_expr(self, expr, dtype):
        return self._idx(expr).to(dtype)

    def constant(self, value, dtype):
        return torch.tensor(value, dtype=dtype, device=self.device)

    def to_dtype(self, x, dtype):
        return _as_tensor(x, None, self.device).to(dtype)

    def indirect_indexing(self, x, size, check=True):
        x = _as_tensor(x, None, self.device).to(torch.int64)
        size_v = self.ev(sympy.sympify(size))
        x = torch.where(x < 0, x + size_v, x)
        if check and x.numel():
            lo, hi = int(x.min()), int(x.max())
            if lo < 0 or hi >= int(size_v):
                raise IndexError(f"index {hi if hi >= int(size_v) else lo} is out of bounds for size {int(size_v)}")
        sym = sympy.Symbol(f"ind{self._ind}", integer=True, nonnegative=True)
        self._ind += 1
        self.env[sym] = x
        return sym

    def __getattr__(self, name):
        spec = OPS.get(name)
        if spec is None or spec.ref is None:
            raise AttributeError(name)
        ref = spec.ref
        device = self.device

        def op(*args):
            return ref(*[_as_tensor(a, None, device) if not isinstance(a, torch.dtype) else a for a in args])

        return op


def _ident(rtype, dtype):
    return reduction_identity(rtype, dtype)


def _argext(v, is_max):
    if v.shape[-1] == 0:
        raise IndexError("argmax/argmin of an empty reduction")
    if v.dtype == torch.bool:
        v = v.to(torch.int64)
    return torch.argmax(v, -1) if is_max else torch.argmin(v, -1)


def _as_tensor(x, dtype, device):
    if isinstance(x, torch.Tensor):
        return x
    return torch.tensor(x, dtype=dtype, device=device)


class Interpreter:
    def __init__(self, sched: Schedule, check_bounds: bool = True):
        self.sched = sched
        self.graph = sched.graph
        self.device = sched.graph.device
        self.check_bounds = check_bounds

    def flat(self, name: str) -> torch.Tensor:
        t = self.env[name]
        n = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
        return torch.as_strided(t, (max(n, 0),), (1,), t.storage_offset())

    def __call__(self, *args):
        g = self.graph
        self.env: dict[str, torch.Tensor] = {}
        self.sym_env: dict = {}
        for b in g.inputs:
            self.env[b.name] = args[b.position]
        for name, t in g.constants.items():
            self.env[name] = t
        for s, src in g.sizevars.items():
            if src.buffer is not None:
                continue
            a = args[src.input]
            if src.dim is None:
                self.sym_env[s] = int(a)
            elif src.stride:
                self.sym_env[s] = int(a.stride(src.dim))
            else:
                self.sym_env[s] = int(a.size(src.dim))
        freed: dict[str, torch.Tensor] = {}
        lent = {a.reuses for s in self.sched.steps for a in s.allocations if a.reuses and not a.in_place}
        for step in self.sched.steps:
            if isinstance(step, FusedGroup):
                for a in step.allocations:
                    if a.reuses is not None:
                        t = self.env[a.reuses] if a.in_place else freed.pop(a.reuses)
                        if tuple(t.shape) != tuple(self.size(x) for x in a.layout.size) or \
                                tuple(t.stride()) != tuple(self.size(x) for x in a.layout.stride):
                            t = torch.as_strided(t, [self.size(x) for x in a.layout.size],
                                                 [self.size(x) for x in a.layout.stride], 0)
                        self.env[a.name] = t
                    else:
                        self.env[a.name] = torch.empty_strided(
                            [self.size(x) for x in a.layout.size],
                            [self.size(x) for x in a.layout.stride],
                            dtype=a.layout.dtype, device=a.layout.device)
                self.run_group(step)
            else:
                self.run_extern(step)
            for nm in step.frees:
                t = self.env.pop(nm, None)
                if nm in lent and t is not None:
                    freed[nm] = t
        outs = []
        for o in g.outputs:
            if isinstance(o, ReinterpretView):
                t = self.env[o.data.name]
                if o.is_whole():
                    outs.append(t)
                else:
                    outs.append(torch.as_strided(t, [self.size(x) for x in o.layout.size],
                                                 [self.size(x) for x in o.layout.stride],
                                                 t.storage_offset() + self.size(o.layout.offset)))
            elif isinstance(o, sympy.Basic):
                outs.append(self.size(o))
            else:
                outs.append(o)
        return outs

    def size(self, e) -> int:
        v = IndexEvaluator(self.sym_env, None)(sympy.sympify(e))
        return int(v)

    def run_group(self, group: FusedGroup):
        outer = [self.size(x) for x in group.outer]
        for node in group.nodes:
            inner = [self.size(x) for x in node.inner]
            shape = outer + inner
            env = dict(self.sym_env)
            nd = len(shape)
            osyms = [index_symbol(k) for k in range(len(outer))]
            isyms = [reduction_symbol(k) for k in range(len(inner))]
            for k, (s, n) in enumerate(zip(osyms + isyms, shape, strict=False)):
                view = [1] * nd
                view[k] = n
                env[s] = torch.arange(n, device=self.device, dtype=torch.int64).view(view)
            h = _Handler(self, env, shape, len(outer))
            if math.prod(shape) == 0 and node.kind == "pointwise":
                continue
            with set_ops_handler(h):
                node.body(osyms, isyms)

    def _arg(self, a):
        if isinstance(a, ReinterpretView):
            t = self.env[a.data.name]
            return torch.as_strided(t, [self.size(x) for x in a.layout.size],
                                    [self.size(x) for x in a.layout.stride],
                                    t.storage_offset() + self.size(a.layout.offset))
        if hasattr(a, "name") and hasattr(a, "layout") and not isinstance(a, torch.Tensor):
            return self.env[a.name]
        if isinstance(a, sympy.Basic):
            return self.size(a)
        if isinstance(a, list):
            return [self._arg(x) for x in a]
        if isinstance(a, tuple):
            return tuple(self._arg(x) for x in a)
        if isinstance(a, dict):
            return {k: self._arg(v) for k, v in a.items()}
        return a

    def _check_layout(self, t, layout, name: str):
        """An extern's result must have the layout its buffer declares: kernels index it with
        those strides (a mismatch is a lowering bug; copying it away here would hide from the
        oracle what the generated code gets wrong)."""
        if not isinstance(t, torch.Tensor) or layout is None:
            return t
        size = [self.size(x) for x in layout.size]
        stride = [self.size(x) for x in layout.stride]
        if list(t.shape) != size:
            raise RuntimeError(f"extern result {name} has size {list(t.shape)}, the IR says {size}")
        if t.numel() and any(sz > 1 and a != b for sz, a, b in zip(size, t.stride(), stride, strict=True)):
            raise RuntimeError(f"extern result {name} has strides {list(t.stride())}, the IR says "
                               f"{stride} (size {size})")
        return t

    def run_extern(self, node: ExternNode):
        k = node.kernel
        args = self._arg(k.inputs)
        kwargs = self._arg(k.kwargs)
        res = k.op(*args, **kwargs)
        raw = {k.name: res} if k.layout is not None else {mo.name: res[mo.index] for mo in k.outputs}
        for s, src in self.graph.sizevars.items():
            if src.buffer is not None and src.buffer in raw:
                t = raw[src.buffer]
                self.sym_env[s] = int(t.stride(src.dim) if src.stride else t.size(src.dim))
        if k.layout is not None:
            self.env[k.name] = self._check_layout(res, k.layout, k.name)
        else:
            self.env[k.name] = res
            for mo in k.outputs:
                self.env[mo.name] = self._check_layout(res[mo.index], mo.layout, mo.name)


def interpret(sched: Schedule | LoopGraph) -> Callable[..., list[torch.Tensor]]:
    """A callable running ``sched`` (a Schedule, or a LoopGraph which is scheduled first)."""
    if isinstance(sched, LoopGraph):
        sched = schedule(sched)
    interp = Interpreter(sched)

    def run(*args):
        return interp(*args)

    run.schedule = sched
    return run
