"""Guards: the conditions under which a compiled frame may be reused.

While the symbolic interpreter runs it records ``Guard`` objects (a ``Source`` and a kind:
``TENSOR_MATCH``, ``TYPE_MATCH``, ``ID_MATCH``, ``CONSTANT_MATCH``, ``FUNCTION_MATCH``,
``NN_MODULE``, ``LIST_LENGTH``, ``DICT_KEYS``, ``HASATTR``, ``GRAD_MODE``, ``GLOBAL_STATE``,
``SHAPE_ENV``; docs/frontend-capture.md "Guard kinds" says what each protects).  When the
frame is done they are compiled into ONE check function per cache entry: Python source for
``def check(<argument slot names>):`` that tests every guard in turn (each source evaluated
once, into a local) is generated and exec'd once.  Tensor checks call ``TensorGuard`` objects (C, from ``kiln_frontend._evalframe``;
a pure-Python stand-in with the same interface is used only while the C extension is not
built).

The check function carries ``.guards`` (the Guard list, printable like TorchDynamo's GUARDS
section), ``.code`` (the generated source) and ``.failure_reason(*args)`` (the first failing
guard, in words, or None).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from .sources import GUARDED_FUNCTION, AttrSource, LocalSource, Source

# --------------------------------------------------------------------------------------
# TensorGuard: C implementation from _evalframe when built, Python stand-in otherwise
# --------------------------------------------------------------------------------------


class PyTensorGuardFallback:
    """Pure-Python stand-in for ``kiln_frontend._evalframe.TensorGuard``.

    Used ONLY while the C extension is not importable.  Same interface:
    ``TensorGuard(expected, dynamic_dims=(), check_strides=True)``, ``guard(value) -> bool``,
    ``guard.reason(value) -> str | None``, ``repr(guard)``.
    """

    def __init__(self, expected: torch.Tensor, dynamic_dims: Sequence[int] = (),
                 check_strides: bool = True):
        self.cls = type(expected)
        self.dtype = expected.dtype
        self.device = expected.device
        self.requires_grad = expected.requires_grad
        self.dispatch_keys = torch._C._dispatch_keys(expected).raw_repr()
        self.ndim = expected.dim()
        self.dynamic_dims = tuple(dynamic_dims)
        self.sizes = tuple(expected.size())
        self.check_strides = check_strides
        self.strides = tuple(expected.stride()) if expected.layout == torch.strided else None

    def __call__(self, value: Any) -> bool:
        return self.reason(value) is None

    def reason(self, value: Any) -> str | None:
        if type(value) is not self.cls:
            return (f"class mismatch: expected {self.cls.__name__}, "
                    f"actual {type(value).__name__}")
        if value.dtype != self.dtype:
            return f"dtype mismatch: expected {self.dtype}, actual {value.dtype}"
        if value.device != self.device:
            return f"device mismatch: expected {self.device}, actual {value.device}"
        if value.requires_grad != self.requires_grad:
            return (f"requires_grad mismatch: expected {self.requires_grad}, "
                    f"actual {value.requires_grad}")
        if torch._C._dispatch_keys(value).raw_repr() != self.dispatch_keys:
            return (f"dispatch key set mismatch: expected "
                    f"{torch._C.DispatchKeySet.from_raw_repr(self.dispatch_keys)}, "
                    f"actual {torch._C._dispatch_keys(value)}")
        if value.dim() != self.ndim:
            return f"ndim mismatch: expected {self.ndim}, actual {value.dim()}"
        sizes = value.size()
        for i, s in enumerate(self.sizes):
            if i not in self.dynamic_dims and sizes[i] != s:
                return f"size mismatch at index {i}: expected {s}, actual {sizes[i]}"
        if self.check_strides and self.strides is not None:
            strides = value.stride()
            for i, s in enumerate(self.strides):
                if i not in self.dynamic_dims and strides[i] != s:
                    return f"stride mismatch at index {i}: expected {s}, actual {strides[i]}"
        return None

    def __repr__(self) -> str:
        sizes = [("*" if i in self.dynamic_dims else s) for i, s in enumerate(self.sizes)]
        return (f"TensorGuard({self.cls.__name__}, {self.dtype}, device={self.device}, "
                f"requires_grad={self.requires_grad}, size={sizes}, stride="
                f"{list(self.strides) if self.strides is not None else None})")


try:  # the function whose frame is being checked (closure-cell guards read its cells)
    from ._evalframe import guarded_function  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build

    def guarded_function() -> Any:
        return None


try:  # the C guard, built by H1's hatch build hook
    from ._evalframe import TensorGuard  # type: ignore[attr-defined]

    USING_C_TENSOR_GUARD = True
except ImportError:  # pragma: no cover - depends on the build
    TensorGuard = PyTensorGuardFallback  # type: ignore[misc,assignment]
    USING_C_TENSOR_GUARD = False

try:  # TensorGuard's C++ fast path (hatch_build.py builds it where torch's headers are)
    from . import _tensorcheck  # type: ignore[attr-defined]  # noqa: F401

    USING_FAST_TENSOR_CHECK = USING_C_TENSOR_GUARD
except ImportError:  # pragma: no cover - depends on the build
    USING_FAST_TENSOR_CHECK = False


# --------------------------------------------------------------------------------------
# Guard objects
# --------------------------------------------------------------------------------------


class GuardKind(enum.Enum):
    TENSOR_MATCH = "TENSOR_MATCH"
    TYPE_MATCH = "TYPE_MATCH"
    ID_MATCH = "ID_MATCH"
    CONSTANT_MATCH = "CONSTANT_MATCH"
    FUNCTION_MATCH = "FUNCTION_MATCH"
    NN_MODULE = "NN_MODULE"
    LIST_LENGTH = "LIST_LENGTH"
    DICT_KEYS = "DICT_KEYS"
    GRAD_MODE = "GRAD_MODE"
    #: the rest of torch's global state a graph depends on (``torch_global_state()``)
    GLOBAL_STATE = "GLOBAL_STATE"
    #: ``hasattr(source, name)`` is what it was; ``expected`` is ``(name, bool)``
    HASATTR = "HASATTR"
    #: a condition on symbolic sizes (dynamic shapes); ``expected`` is a shapes.ShapeCheck
    SHAPE_ENV = "SHAPE_ENV"

    def __str__(self) -> str:
        return self.value


#: order in which kinds are checked within one source depth (cheap and type checks first)
_KIND_ORDER = {
    GuardKind.GRAD_MODE: 0,
    GuardKind.GLOBAL_STATE: 0,
    GuardKind.ID_MATCH: 1,
    GuardKind.FUNCTION_MATCH: 1,
    GuardKind.NN_MODULE: 1,
    GuardKind.TYPE_MATCH: 2,
    GuardKind.HASATTR: 3,
    GuardKind.CONSTANT_MATCH: 3,
    GuardKind.LIST_LENGTH: 3,
    GuardKind.DICT_KEYS: 3,
    GuardKind.TENSOR_MATCH: 4,
    GuardKind.SHAPE_ENV: 5,
}

#: shape guards read sizes of tensors whose TENSOR_MATCH must pass first
_SHAPE_GUARD_DEPTH = 1 << 20
#: where guards without a source sort: grad mode first; torch's other global state last (it
#: rarely fails, and a miss is then found without reading it)
_SOURCELESS_DEPTH = {GuardKind.SHAPE_ENV: _SHAPE_GUARD_DEPTH,
                     GuardKind.GLOBAL_STATE: _SHAPE_GUARD_DEPTH + 1}


#: what ``torch_global_state()`` reads, in order (named in failure messages)
GLOBAL_STATE_FIELDS = (
    "default dtype", "torch function modes (set_default_device, ...)",
    "deterministic algorithms", "inference mode", "float32 matmul precision",
    "autocast (cpu enabled, dtype, cuda enabled, dtype)", "global nn.Module hooks",
)


def torch_global_state(
    _dtype=torch.get_default_dtype,
    _modes=torch._C._len_torch_function_stack,
    _deterministic=torch._C._get_deterministic_algorithms,
    _inference=torch.is_inference_mode_enabled,
    _precision=torch._C._get_float32_matmul_precision,
    _any_autocast=torch._C._is_any_autocast_enabled,
    _module_mod=torch.nn.modules.module,
) -> tuple:
    """torch's global settings (other than grad mode) that change what a graph computes:
    ``torch.get_default_dtype()`` is folded while tracing, factory calls without a dtype use
    the default one and ``set_default_device`` is a torch-function mode, autocast changes op
    dtypes, a backend may pick kernels by the determinism and matmul-precision flags, and
    module calls are inlined only while no global ``nn.Module`` hook is registered.  One
    GLOBAL_STATE guard compares the tuple (about 1 us)."""
    autocast = None
    if _any_autocast():
        autocast = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
                    torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
    hooks = bool(_module_mod._global_forward_hooks or _module_mod._global_forward_pre_hooks
                 or _module_mod._global_backward_hooks
                 or _module_mod._global_backward_pre_hooks)
    return (_dtype(), _modes(), _deterministic(), _inference(), _precision(), autocast, hooks)


class _Namespace:
    """Names for the objects a check function refers to (``___tg0``, ``___type1``...)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self._ids: dict[int, str] = {}
        self._counter = itertools.count()

    def add(self, prefix: str, obj: Any) -> str:
        key = id(obj)
        if key in self._ids:
            return self._ids[key]
        name = f"___{prefix}{next(self._counter)}"
        self.values[name] = obj
        self._ids[key] = name
        return name


@dataclasses.dataclass(eq=False)
class Guard:
    """One condition on one source.

    ``expected`` depends on the kind: the constant (CONSTANT_MATCH), the object id
    (ID_MATCH/FUNCTION_MATCH), ``(id, training)`` (NN_MODULE), the type (TYPE_MATCH),
    ``(type, length)`` (LIST_LENGTH), ``(type, keys)`` (DICT_KEYS), ``(name, bool)``
    (HASATTR), a TensorGuard (TENSOR_MATCH), the flag (GRAD_MODE; source None), the
    ``torch_global_state()`` tuple (GLOBAL_STATE; source None)."""

    source: Source | None
    kind: GuardKind
    expected: Any = None
    #: a readable name of what was seen at compile time (for messages)
    what: str = ""

    @property
    def key(self) -> tuple:
        if self.kind is GuardKind.SHAPE_ENV:
            return (None, self.kind, self.expected.code)
        if self.kind is GuardKind.HASATTR:
            return (self.source, self.kind, self.expected[0])
        return (self.source, self.kind)

    # -- printing ---------------------------------------------------------------------

    def __str__(self) -> str:
        if self.kind is GuardKind.SHAPE_ENV:
            return f" - shape {self.expected.text} {self.kind}"
        if self.source is None:
            return f" - global state {self.kind}"
        return f" - {self.source.scope} {self.source.short_name()!r} {self.kind}"

    def __repr__(self) -> str:
        return f"Guard({self.source.name() if self.source else 'global'}, {self.kind})"

    # -- code -------------------------------------------------------------------------

    def expr(self, ns: _Namespace, x: str | None = None) -> str:
        """The guard as a Python expression in the check function (``x``: an expression
        for the source's value, by default its full ``guard_expr()``)."""
        k = self.kind
        if k is GuardKind.GRAD_MODE:
            fn = ns.add("grad_enabled", torch.is_grad_enabled)
            return f"{fn}() is {self.expected!r}"
        if k is GuardKind.GLOBAL_STATE:
            return f"{ns.add('torch_state', torch_global_state)}() == {ns.add('state', self.expected)}"
        if k is GuardKind.SHAPE_ENV:
            return self.expected.code
        assert self.source is not None
        if x is None:
            x = self.source.guard_expr()
        if k is GuardKind.TENSOR_MATCH:
            return f"{ns.add('tg', self.expected)}({x})"
        if k in (GuardKind.ID_MATCH, GuardKind.FUNCTION_MATCH):
            return f"id({x}) == {self.expected}"
        if k is GuardKind.NN_MODULE:
            obj_id, training = self.expected
            return f"id({x}) == {obj_id} and {x}.training is {training!r}"
        if k is GuardKind.TYPE_MATCH:
            return f"type({x}) is {ns.add('type', self.expected)}"
        if k is GuardKind.CONSTANT_MATCH:
            v = self.expected
            if v is None or v is True or v is False or v is Ellipsis:
                return f"{x} is {v!r}"
            t = ns.add("type", type(v))
            if isinstance(v, float) and v != v:
                return f"type({x}) is {t} and {x} != {x}"
            if type(v) in (int, float, str, bytes, complex):
                return f"type({x}) is {t} and {x} == {v!r}"
            return f"type({x}) is {t} and {x} == {ns.add('const', v)}"
        if k is GuardKind.HASATTR:
            attr, has = self.expected
            return f"{'' if has else 'not '}hasattr({x}, {attr!r})"
        if k is GuardKind.LIST_LENGTH:
            typ, n = self.expected
            return f"type({x}) is {ns.add('type', typ)} and len({x}) == {n}"
        if k is GuardKind.DICT_KEYS:
            typ, keys = self.expected
            if not keys:  # most of a module tree's hook dicts: no list built
                return f"type({x}) is {ns.add('type', typ)} and not {x}"
            return (f"type({x}) is {ns.add('type', typ)} and "
                    f"list({x}.keys()) == {ns.add('keys', list(keys))}")
        raise AssertionError(k)

    def describe_failure(self, value: Any) -> str:
        """Words for why this guard failed on ``value`` (the source's current value)."""
        k = self.kind
        if k is GuardKind.GRAD_MODE:
            return f"grad mode changed: expected {'enabled' if self.expected else 'disabled'}"
        if k is GuardKind.GLOBAL_STATE:
            now = torch_global_state()
            changed = [f"{name} (expected {old!r}, actual {new!r})" for name, old, new in
                       zip(GLOBAL_STATE_FIELDS, self.expected, now, strict=True) if old != new]
            return f"torch global state changed: {', '.join(changed) or '?'}"
        if k is GuardKind.SHAPE_ENV:
            actual = ", ".join(f"{name} = {v!r}" for name, v in (value or {}).items())
            where = f", assumed at {self.expected.where}" if self.expected.where else ""
            return (f"shape guard {self.expected.text} failed"
                    f"{f' ({actual})' if actual else ''}{where}")
        assert self.source is not None
        name = self.source.name()
        if k is GuardKind.TENSOR_MATCH:
            reason = self.expected.reason(value) if isinstance(value, torch.Tensor) else (
                f"expected a tensor, got {type(value).__name__}")
            return f"tensor {name} {reason}"
        if k is GuardKind.CONSTANT_MATCH:
            return f"{name} == {self.expected!r} (actual {_short(value)})"
        if k is GuardKind.TYPE_MATCH:
            return (f"type({name}) is {self.expected.__qualname__} "
                    f"(actual {type(value).__qualname__})")
        if k in (GuardKind.ID_MATCH, GuardKind.FUNCTION_MATCH):
            return f"{name} is not the {self.what or 'object'} seen at compile time ({k})"
        if k is GuardKind.NN_MODULE:
            obj_id, training = self.expected
            if id(value) != obj_id:
                return f"{name} is not the module seen at compile time ({k})"
            return f"{name}.training == {training!r} (actual {value.training!r})"
        if k is GuardKind.HASATTR:
            attr, has = self.expected
            return f"hasattr({name}, {attr!r}) is {has} (actual {not has})"
        if k is GuardKind.LIST_LENGTH:
            typ, n = self.expected
            if type(value) is not typ:
                return f"type({name}) is {typ.__qualname__} (actual {type(value).__qualname__})"
            return f"len({name}) == {n} (actual {len(value)})"
        if k is GuardKind.DICT_KEYS:
            typ, keys = self.expected
            if type(value) is not typ:
                return f"type({name}) is {typ.__qualname__} (actual {type(value).__qualname__})"
            return f"list({name}.keys()) == {list(keys)!r} (actual {list(value.keys())!r})"
        raise AssertionError(k)


#: callables that are a NEW object at every attribute access (``ctxvar.reset``,
#: ``(1).__add__``, ``obj.method``): an identity guard on one of them can never pass again
_FRESH_PER_ACCESS = (types.BuiltinMethodType, types.MethodWrapperType, types.MethodType)


def is_fresh_per_access(value: Any) -> bool:
    """True for a bound method: ``obj.name`` makes a new one at every access, so its
    identity says nothing (a function of a module, whose ``__self__`` is the module, is a
    stored object and keeps its identity)."""
    if not isinstance(value, _FRESH_PER_ACCESS):
        return False
    owner = getattr(value, "__self__", None)
    return owner is not None and not isinstance(owner, types.ModuleType)


def identity_guards(source: Source, value: Any, kind: GuardKind = GuardKind.FUNCTION_MATCH,
                    what: str = "") -> list[Guard]:
    """The guards that ``source`` still gives ``value`` (ID_MATCH / FUNCTION_MATCH).

    A bound method is guarded by what it is, since it is a fresh object at every access:
    its type, the identity of ``__self__``, and ``__func__`` (Python methods) or
    ``__name__`` (builtin methods and method-wrappers, whose ``__self__``'s type fixes the
    code: a C type's methods cannot be replaced)."""
    if not is_fresh_per_access(value):
        return [Guard(source, kind, id(value), what)]
    what = what or "method"
    guards = [Guard(source, GuardKind.TYPE_MATCH, type(value)),
              Guard(AttrSource(source, "__self__"), GuardKind.ID_MATCH, id(value.__self__),
                    f"object a {what} is bound to")]
    if isinstance(value, types.MethodType):
        inner = value.__func__
        if is_fresh_per_access(inner):  # a method bound twice: guard the inner one
            guards += identity_guards(AttrSource(source, "__func__"), inner, kind, what)
        else:
            guards.append(Guard(AttrSource(source, "__func__"), GuardKind.ID_MATCH, id(inner),
                                f"function of a {what}"))
    else:
        guards.append(Guard(AttrSource(source, "__name__"), GuardKind.CONSTANT_MATCH,
                            value.__name__, f"name of a {what}"))
    return guards


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 60 else text[:57] + "..."


class GuardSet:
    """Ordered, de-duplicated collection of guards (one per (source, kind))."""

    def __init__(self) -> None:
        self._guards: dict[tuple, Guard] = {}

    def add(self, guard: Guard) -> Guard:
        if guard.source is not None and not guard.source.guardable:
            return guard
        return self._guards.setdefault(guard.key, guard)

    def __iter__(self):
        return iter(self._guards.values())

    def __len__(self) -> int:
        return len(self._guards)

    def __contains__(self, key: tuple) -> bool:
        return key in self._guards

    def sorted(self) -> list[Guard]:
        """Check order: shallow sources before the attributes/items reached through them."""
        guards = list(self._guards.values())
        return sorted(guards, key=lambda g: (
            g.source.depth() if g.source else _SOURCELESS_DEPTH.get(g.kind, -1),
            _KIND_ORDER[g.kind]))


# --------------------------------------------------------------------------------------
# Building the check function
# --------------------------------------------------------------------------------------

_check_counter = itertools.count()


def build_check_fn(guards: Iterable[Guard], arg_names: Sequence[str],
                   f_globals: dict[str, Any], *, name: str = "check") -> Callable[..., bool]:
    """ONE Python function ``check(<arg names>) -> bool`` that checks every guard in order.

    Each source is evaluated once, into a local, when a guard first needs it, and the
    sources reached through it start from that local (``___v3 = ___v1._modules['fc']``):
    a module tree's guards cost one step per edge, not one walk from the root per guard.
    Any exception while checking (a missing attribute, a changed type) counts as a miss.
    The function gets ``.guards``, ``.code`` and ``.failure_reason(*args)``.
    """
    guard_list = guards.sorted() if isinstance(guards, GuardSet) else list(guards)
    ns = _Namespace()
    exprs = [g.expr(ns) for g in guard_list]  # self-contained (failure_reason)
    params = ", ".join(arg_names)
    lines: list[str] = []
    local_of: dict[Source, str] = {}

    def value_of(source: Source) -> str:
        """A local holding ``source``'s value (assigned now, the first time)."""
        name_ = local_of.get(source)
        if name_ is not None:
            return name_
        base = source.base()
        try:
            expr = source.guard_expr_on(value_of(base)) if base is not None else None
        except NotImplementedError:
            expr = None
        if expr is None:
            expr = source.guard_expr()
        if isinstance(source, LocalSource):  # already a local
            local_of[source] = expr
            return expr
        name_ = local_of[source] = f"___v{len(local_of)}"
        lines.append(f"{name_} = {expr}")
        return name_

    for g in guard_list:
        x = value_of(g.source) if g.source is not None else None
        lines.append(f"if not ({g.expr(ns, x)}): return False")
    body = "".join(f"        {line}\n" for line in lines)
    src = (f"def {name}({params}):\n"
           f"    try:\n"
           f"{body}"
           f"        return True\n"
           f"    except Exception:\n"
           f"        return False\n")
    scope: dict[str, Any] = dict(ns.values)
    scope["G"] = f_globals
    scope[GUARDED_FUNCTION] = guarded_function
    scope["math"] = math  # shape guards may print math.floor(...) / torch.sym_float(...)
    scope["torch"] = torch
    filename = f"<kiln guards {next(_check_counter)}>"
    exec(compile(src, filename, "exec"), scope)
    check = scope[name]

    # failure_reason: each guard on its own, with its value fetched from its source.
    per_guard: list[tuple[Guard, Callable, Callable | None]] = []
    for g, e in zip(guard_list, exprs, strict=True):
        ok_fn = eval(compile(f"lambda {params}: ({e})", filename, "eval"), scope)
        val_fn = None
        if g.source is not None:
            val_fn = eval(compile(f"lambda {params}: ({g.source.guard_expr()})", filename,
                                  "eval"), scope)
        elif g.kind is GuardKind.SHAPE_ENV:  # the sizes it reads, by name
            pairs = ", ".join(f"{text!r}: {code}" for text, code in g.expected.symbols)
            val_fn = eval(compile(f"lambda {params}: {{{pairs}}}", filename, "eval"), scope)
        per_guard.append((g, ok_fn, val_fn))

    def failure_reason(*args: Any) -> str | None:
        for g, ok_fn, val_fn in per_guard:
            try:
                ok = bool(ok_fn(*args))
            except Exception as e:  # noqa: BLE001
                where = g.source.name() if g.source else "global state"
                return f"{where}: {type(e).__name__}: {e} ({g.kind})"
            if not ok:
                try:
                    value = val_fn(*args) if val_fn is not None else None
                except Exception:  # noqa: BLE001
                    value = None
                return g.describe_failure(value)
        return None

    check.guards = guard_list  # type: ignore[attr-defined]
    check.code = src  # type: ignore[attr-defined]
    check.failure_reason = failure_reason  # type: ignore[attr-defined]
    return check


def format_guards(guards: Iterable[Guard]) -> str:
    """The GUARDS section as TorchDynamo prints it (one `` - local 'a' TENSOR_MATCH`` line
    per guard)."""
    return "\n".join(str(g) for g in guards)


__all__ = [
    "Guard",
    "GuardKind",
    "GuardSet",
    "TensorGuard",
    "PyTensorGuardFallback",
    "USING_C_TENSOR_GUARD",
    "USING_FAST_TENSOR_CHECK",
    "build_check_fn",
    "format_guards",
    "identity_guards",
    "is_fresh_per_access",
    "torch_global_state",
]
