"""Guards: the conditions under which a compiled frame may be reused.

While the symbolic interpreter runs it records ``Guard`` objects (a ``Source`` and a kind:
``TENSOR_MATCH``, ``TYPE_MATCH``, ``ID_MATCH``, ``CONSTANT_MATCH``, ``FUNCTION_MATCH``,
``NN_MODULE``, ``LIST_LENGTH``, ``DICT_KEYS``, ``HASATTR``, ``GRAD_MODE``, ``GLOBAL_STATE``,
``SHAPE_ENV``; docs/frontend-capture.md "Guard kinds" says what each protects).  When the
frame is done they are compiled into ONE check per cache entry, a ``GuardTree`` checked in C
(``_guardtree.c``): a node per value read (an argument slot, a global, a closure cell, an
attribute, an item), fetched once and shared by every guard below it, with leaf checks
(type, id, constant, len, dict keys, hasattr, ``TensorGuard``, global state) on it.  Rules:
``_SOURCE_NODES`` (Source type -> node) and ``GUARD_KINDS``, one row per kind carrying its C
leaf checks, its Python expression, its failure text and its tree rule; a guard the tree
rules do not express becomes a ``python`` leaf that evaluates its Python expression.
``TensorGuard`` is C (``kiln_frontend._evalframe``); a pure-Python stand-in with the same
interface is used only while the C extension is not built.

The check carries ``.guards`` (the Guard list, printable like TorchDynamo's GUARDS
section), ``.code`` (the printed tree) and ``.failure_reason(*args)`` (the first failing
guard, in words, or None: evaluated guard by guard in Python, only once the tree said no).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import math
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from .sources import (
    GUARDED_FUNCTION,
    AttrSource,
    AttrTupleSource,
    ClosureSource,
    DictKeySource,
    GetItemSource,
    GlobalSource,
    LocalSource,
    ModuleSource,
    NNModuleMemberSource,
    Source,
    WeakKey,
    bind_guard_constants,
    strong_key,
    weak_key,
)

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


#: shape guards read sizes of tensors whose TENSOR_MATCH must pass first
_SHAPE_GUARD_DEPTH = 1 << 20
#: where guards without a source sort: grad mode first; torch's other global state last (it
#: rarely fails, and a miss is then found without reading it)
_SOURCELESS_DEPTH = {GuardKind.SHAPE_ENV: _SHAPE_GUARD_DEPTH,
                     GuardKind.GLOBAL_STATE: _SHAPE_GUARD_DEPTH + 1}


def _autocast_state(_any_autocast=torch._C._is_any_autocast_enabled) -> tuple | None:
    """None unless autocast is on somewhere (the common case costs one C call)."""
    if not _any_autocast():
        return None
    return (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
            torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))


#: the dicts of global ``nn.Module`` hooks (attributes of ``torch.nn.modules.module``)
GLOBAL_MODULE_HOOK_DICTS = ("_global_forward_hooks", "_global_forward_pre_hooks",
                            "_global_backward_hooks", "_global_backward_pre_hooks")


def _global_module_hooks(_module_mod=torch.nn.modules.module) -> bool:
    return any(getattr(_module_mod, name) for name in GLOBAL_MODULE_HOOK_DICTS)


#: torch's global settings (other than grad mode) that change what a graph computes, as
#: (name for failure messages, reader): ``torch.get_default_dtype()`` is folded while tracing,
#: factory calls without a dtype use the default one and ``set_default_device`` is a
#: torch-function mode, autocast changes op dtypes, a backend may pick kernels by the
#: determinism and matmul-precision flags, and module calls are inlined only while no global
#: ``nn.Module`` hook is registered.
GLOBAL_STATE_READERS: tuple[tuple[str, Callable[[], Any]], ...] = (
    ("default dtype", torch.get_default_dtype),
    ("torch function modes (set_default_device, ...)", torch._C._len_torch_function_stack),
    ("deterministic algorithms", torch._C._get_deterministic_algorithms),
    ("inference mode", torch.is_inference_mode_enabled),
    ("float32 matmul precision", torch._C._get_float32_matmul_precision),
    ("autocast (cpu enabled, dtype, cuda enabled, dtype)", _autocast_state),
    ("global nn.Module hooks", _global_module_hooks),
)
GLOBAL_STATE_FIELDS = tuple(name for name, _ in GLOBAL_STATE_READERS)


def torch_global_state() -> tuple:
    """The values of ``GLOBAL_STATE_READERS``; one GLOBAL_STATE guard compares them (in the
    guard tree: one C call per field, the hook dicts read directly)."""
    return tuple(read() for _, read in GLOBAL_STATE_READERS)


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

    def __post_init__(self) -> None:
        if self.kind is GuardKind.DICT_KEYS:  # identity keys (modules) held weakly
            typ, keys = self.expected
            self.expected = (typ, tuple(weak_key(k) for k in keys))

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
        row = guard_kind_row(self.kind)
        if row.sourced and x is None:
            assert self.source is not None
            x = self.source.guard_expr()
        return row.expr(self, ns, x)

    def describe_failure(self, value: Any) -> str:
        """Words for why this guard failed on ``value`` (the source's current value)."""
        row = guard_kind_row(self.kind)
        if row.sourced:
            assert self.source is not None
        return row.failure(self, self.source.name() if row.sourced else None, value)


# --------------------------------------------------------------------------------------
# The longer Python expressions (``expr(guard, ns, x)``) and failure texts
# (``failure(guard, name, value)``) of GUARD_KINDS rows; a row holds its one-liners itself
# --------------------------------------------------------------------------------------


def _global_state_failure(g: Guard, name: str | None, value: Any) -> str:
    changed = [f"{field} (expected {old!r}, actual {new!r})" for field, old, new in
               zip(GLOBAL_STATE_FIELDS, g.expected, torch_global_state(), strict=True)
               if old != new]
    return f"torch global state changed: {', '.join(changed) or '?'}"


def _shape_failure(g: Guard, name: str | None, value: Any) -> str:
    actual = ", ".join(f"{sym} = {v!r}" for sym, v in (value or {}).items())
    where = f", assumed at {g.expected.where}" if g.expected.where else ""
    return f"shape guard {g.expected.text} failed{f' ({actual})' if actual else ''}{where}"


def _tensor_failure(g: Guard, name: str, value: Any) -> str:
    reason = g.expected.reason(value) if isinstance(value, torch.Tensor) else (
        f"expected a tensor, got {type(value).__name__}")
    return f"tensor {name} {reason}"


def _module_failure(g: Guard, name: str, value: Any) -> str:
    obj_id, training = g.expected
    if id(value) != obj_id:
        return f"{name} is not the module seen at compile time ({g.kind})"
    return f"{name}.training == {training!r} (actual {value.training!r})"


def _constant_expr(g: Guard, ns: _Namespace, x: str) -> str:
    v = g.expected
    if v is None or v is True or v is False or v is Ellipsis:
        return f"{x} is {v!r}"
    t = ns.add("type", type(v))
    if isinstance(v, float) and v != v:
        return f"type({x}) is {t} and {x} != {x}"
    if type(v) in (int, float, str, bytes, complex):
        return f"type({x}) is {t} and {x} == {v!r}"
    return f"type({x}) is {t} and {x} == {ns.add('const', v)}"


def _typed_container_failure(g: Guard, name: str, value: Any) -> str | None:
    """The type half of LIST_LENGTH and DICT_KEYS (``expected`` is ``(type, ...)``)."""
    typ = g.expected[0]
    if type(value) is not typ:
        return f"type({name}) is {typ.__qualname__} (actual {type(value).__qualname__})"
    return None


def _length_failure(g: Guard, name: str, value: Any) -> str:
    return _typed_container_failure(g, name, value) or \
        f"len({name}) == {g.expected[1]} (actual {len(value)})"


class _LiveKeys:
    """A DICT_KEYS guard's keys as a list, made when the check runs: a weakly held key
    (``WeakKey``) that died raises ``ReferenceError`` (the check fails)."""

    def __init__(self, keys: Sequence[Any]):
        self.keys = tuple(keys)

    def __call__(self) -> list[Any]:
        return [strong_key(k) for k in self.keys]


def _keys_expr(g: Guard, ns: _Namespace, x: str) -> str:
    typ, keys = g.expected
    t = ns.add("type", typ)
    if not keys:  # most of a module tree's hook dicts: no list built
        return f"type({x}) is {t} and not {x}"
    if any(type(k) is WeakKey for k in keys):
        return f"type({x}) is {t} and list({x}.keys()) == {ns.add('keys', _LiveKeys(keys))}()"
    return f"type({x}) is {t} and list({x}.keys()) == {ns.add('keys', list(keys))}"


def _keys_failure(g: Guard, name: str, value: Any) -> str:
    return _typed_container_failure(g, name, value) or \
        f"list({name}.keys()) == {list(g.expected[1])!r} (actual {list(value.keys())!r})"


def _weak_key_leaf_args(keys: Sequence[Any]) -> tuple[list[Any], tuple[bool, ...] | None]:
    """A ``keys`` leaf's (a, b): the keys, a ``WeakKey``'s as its weak reference, flagged
    in b (None: no weak key)."""
    flags = tuple(type(k) is WeakKey for k in keys)
    if not any(flags):
        return list(keys), None
    return [k.ref if type(k) is WeakKey else k for k in keys], flags


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
            guard_kind_row(g.kind).order))


# --------------------------------------------------------------------------------------
# The guard tree: the check function, in C
# --------------------------------------------------------------------------------------

try:  # _guardtree.c, compiled into the _evalframe module
    from ._evalframe import GuardTree  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    GuardTree = None  # type: ignore[assignment,misc]


@dataclasses.dataclass(eq=False)
class TreeLeaf:
    """One check of its node's value; ``kind`` is a leaf kind of ``_guardtree.c``."""

    kind: str
    a: Any = None
    b: Any = None
    #: what it checks, in words (the printed tree)
    text: str = ""

    def spec(self) -> tuple:
        return (self.kind, self.a, self.b)

    def __str__(self) -> str:
        return self.text or f"{self.kind} {self.a!r}"


@dataclasses.dataclass(eq=False)
class TreeNode:
    """One value read ONCE per check (``accessor`` + ``key`` applied to the parent's value;
    the root reads nothing), its leaf checks, then the nodes reached from it: every guard
    whose source passes through this value shares the read."""

    accessor: str
    key: Any = None
    #: how the value is read, for the printed tree (``model``, ``._modules``, ``['0']``)
    text: str = ""
    leaves: list[TreeLeaf] = dataclasses.field(default_factory=list)
    children: dict[tuple, TreeNode] = dataclasses.field(default_factory=dict)

    def child(self, accessor: str, key: Any, text: str) -> TreeNode:
        """The node reading ``key`` from this one (made once, then shared)."""
        try:
            ident: Any = (type(key), key)
            hash(ident)
        except TypeError:
            ident = ("id", id(key))
        node = self.children.get((accessor, ident))
        if node is None:
            node = self.children[(accessor, ident)] = TreeNode(accessor, key, text)
        return node

    def add(self, kind: str, a: Any = None, b: Any = None, text: str = "") -> None:
        self.leaves.append(TreeLeaf(kind, a, b, text))

    def spec(self) -> tuple:
        """The nested tuples ``GuardTree`` is built from."""
        return (self.accessor, self.key, tuple(leaf.spec() for leaf in self.leaves),
                tuple(c.spec() for c in self.children.values()))

    def lines(self, indent: str = "") -> list[str]:
        out = [f"{indent}{leaf}" for leaf in self.leaves]
        for c in self.children.values():
            out.append(f"{indent}{c.text}:")
            out += c.lines(indent + "    ")
        return out

    def count(self) -> tuple[int, int]:
        """(nodes, leaves) of this subtree."""
        nodes, leaves = 1, len(self.leaves)
        for c in self.children.values():
            n, lv = c.count()
            nodes, leaves = nodes + n, leaves + lv
        return nodes, leaves


class _TreeBuilder:
    """Turns guards into tree nodes and leaves (``_SOURCE_NODES``, each kind's ``leaves``
    in ``GUARD_KINDS``); a guard they do not express becomes a ``python`` leaf running its
    expression."""

    def __init__(self, arg_names: Sequence[str], scope: dict[str, Any], filename: str):
        self.root = TreeNode("root")
        self.slots = {n: i for i, n in enumerate(arg_names)}
        self.params = ", ".join(arg_names)
        self.scope = scope
        self.filename = filename
        self.ns = _Namespace()
        #: leaves checked after everything else (Python leaves, slow global state)
        self.late: list[TreeLeaf] = []
        self._nodes: dict[Source, TreeNode | None] = {}

    def node_of(self, source: Source) -> TreeNode | None:
        if source not in self._nodes:
            rule = _SOURCE_NODES.get(type(source))
            self._nodes[source] = rule(self, source) if rule is not None else None
        return self._nodes[source]

    def add(self, guard: Guard) -> None:
        if not guard_kind_row(guard.kind).leaves(self, guard):
            self.python_leaf(guard)

    def python_leaf(self, guard: Guard) -> None:
        expr = guard.expr(self.ns)
        self.scope.update(self.ns.values)
        code = compile(f"lambda {self.params}: ({expr})", self.filename, "eval")
        bind_guard_constants(code, self.scope)
        fn = eval(code, self.scope)
        self.late.append(TreeLeaf("python", fn, None, f"python: {expr}  [{guard.kind}]"))

    def finish(self) -> TreeNode:
        if self.late:  # a last child of the root whose value (None) the leaves ignore
            self.root.child("const", None, "(checked last)").leaves.extend(self.late)
        return self.root


#: Source type -> the tree node holding its value (None: not expressible as a node)
_SOURCE_NODES: dict[type, Callable[[_TreeBuilder, Any], TreeNode | None]] = {}
def _register(table: dict, *keys: Any) -> Callable:
    def register(fn: Callable) -> Callable:
        for key in keys:
            if key in table:
                raise ValueError(f"guard tree: a rule for {key} is already registered")
            table[key] = fn
        return fn

    return register


@_register(_SOURCE_NODES, LocalSource)
def _local_node(b: _TreeBuilder, src: LocalSource) -> TreeNode | None:
    slot = b.slots.get(src.local_name)
    return None if slot is None else b.root.child("arg", slot, src.local_name)


@_register(_SOURCE_NODES, ClosureSource)
def _closure_node(b: _TreeBuilder, src: ClosureSource) -> TreeNode | None:
    if src.index < 0:
        return None
    return b.root.child("closure", src.index, f"{src.local_name} (cell {src.index})")


@_register(_SOURCE_NODES, GlobalSource, ModuleSource)
def _global_node(b: _TreeBuilder, src: GlobalSource | ModuleSource) -> TreeNode:
    return b.root.child("global", src.global_name, f"G[{src.global_name!r}]")


@_register(_SOURCE_NODES, AttrSource)
def _attr_node(b: _TreeBuilder, src: AttrSource) -> TreeNode | None:
    base = b.node_of(src.base_source)
    if base is None or type(src.member) is not str:
        return None
    return base.child("attr", sys.intern(src.member), f".{src.member}")


@_register(_SOURCE_NODES, GetItemSource)
def _item_node(b: _TreeBuilder, src: GetItemSource) -> TreeNode | None:
    base = b.node_of(src.base_source)
    if base is None:
        return None
    if type(src.index) is WeakKey:  # a module key: held weakly, a miss once it died
        return base.child("weak_item", src.index.ref, f"[{src.index!r}]")
    return base.child("item", src.index, f"[{src.index!r}]")


@_register(_SOURCE_NODES, DictKeySource)
def _dict_key_node(b: _TreeBuilder, src: DictKeySource) -> TreeNode | None:
    base = b.node_of(src.base_source)
    if base is None:
        return None
    return base.child("dict_key", src.index, f"key {src.index}")


@_register(_SOURCE_NODES, NNModuleMemberSource)
def _module_member_node(b: _TreeBuilder, src: NNModuleMemberSource) -> TreeNode | None:
    base = b.node_of(src.base_source)  # base._modules[member]: shares base._modules
    if base is None:
        return None
    table = base.child("attr", sys.intern(src.table), f".{src.table}")
    return table.child("item", src.member, f"[{src.member!r}]")


def _sourced(fn: Callable[[TreeNode, Guard], bool | None]) -> Callable[[_TreeBuilder, Guard],
                                                                      bool]:
    """A leaf rule for a guard on a source that is a node."""

    def rule(b: _TreeBuilder, guard: Guard) -> bool:
        node = b.node_of(guard.source) if guard.source is not None else None
        return node is not None and fn(node, guard) is not False

    return rule


@_sourced
def _tensor_leaves(node: TreeNode, g: Guard) -> bool:
    if not (USING_C_TENSOR_GUARD and type(g.expected) is TensorGuard):
        return False  # the Python stand-in: a python leaf
    node.add("tensor", g.expected, None, f"TENSOR_MATCH {g.expected!r}")
    return True


@_sourced
def _id_leaves(node: TreeNode, g: Guard) -> None:
    node.add("id", g.expected, None, f"id == {g.expected}  [{g.kind} {g.what}]".rstrip())


@_sourced
def _module_leaves(node: TreeNode, g: Guard) -> None:
    obj_id, training = g.expected
    node.add("id", obj_id, None, f"id == {obj_id}  [{g.kind}]")
    node.child("attr", sys.intern("training"), ".training").add(
        "is", training, None, f"is {training!r}")


@_sourced
def _type_leaves(node: TreeNode, g: Guard) -> None:
    node.add("type", g.expected, None, f"type is {g.expected.__qualname__}")


def _add_type(node: TreeNode, typ: type) -> None:
    if not any(leaf.kind == "type" and leaf.a is typ for leaf in node.leaves):
        node.add("type", typ, None, f"type is {typ.__qualname__}")


def _constant_leaves(b: _TreeBuilder, g: Guard) -> bool:
    v = g.expected
    if isinstance(g.source, AttrTupleSource):
        # (base.a, base.b) == v compares item by item, as `is or ==`: one leaf per attribute
        base = b.node_of(g.source.base_source)
        if base is None or type(v) is not tuple or len(v) != len(g.source.members):
            return False
        for member, item in zip(g.source.members, v, strict=True):
            base.child("attr", sys.intern(member), f".{member}").add(
                "same", item, None, f"== {_short(item)}  [{g.kind}]")
        return True
    node = b.node_of(g.source) if g.source is not None else None
    if node is None:
        return False
    if v is None or v is True or v is False or v is Ellipsis:
        node.add("is", v, None, f"is {v!r}")
        return True
    _add_type(node, type(v))
    if isinstance(v, float) and v != v:
        node.add("nan", None, None, "is nan")
    else:
        node.add("eq", v, None, f"== {_short(v)}")
    return True


@_sourced
def _hasattr_leaves(node: TreeNode, g: Guard) -> bool:
    attr, has = g.expected
    if type(attr) is not str:
        return False
    node.add("hasattr", sys.intern(attr), bool(has), f"hasattr {attr!r} is {bool(has)}")
    return True


@_sourced
def _length_leaves(node: TreeNode, g: Guard) -> None:
    typ, n = g.expected
    _add_type(node, typ)
    node.add("len", n, None, f"len == {n}")


@_sourced
def _keys_leaves(node: TreeNode, g: Guard) -> None:
    typ, keys = g.expected
    _add_type(node, typ)
    if keys:
        node.add("keys", *_weak_key_leaf_args(keys), f"keys == {_short(list(keys))}")
    else:
        node.add("falsy", None, None, "empty")


def _grad_mode_leaves(b: _TreeBuilder, g: Guard) -> bool:
    b.root.add("call_is", torch.is_grad_enabled, g.expected,
               f"torch.is_grad_enabled() is {g.expected!r}")
    return True


def _autocast_off_leaf(b: _TreeBuilder, expected: Any) -> bool:
    if expected is not None:
        return False
    b.late.append(TreeLeaf("call_is", torch._C._is_any_autocast_enabled, False,
                           "torch._C._is_any_autocast_enabled() is False"))
    return True


def _no_module_hooks_leaves(b: _TreeBuilder, expected: Any) -> bool:
    if expected is not False:
        return False
    hooks = b.root.child("const", torch.nn.modules.module, "torch.nn.modules.module")
    for name in GLOBAL_MODULE_HOOK_DICTS:
        hooks.child("attr", sys.intern(name), f".{name}").add("falsy", None, None, "empty")
    return True


#: global-state readers whose usual value has a cheaper check than calling them
_GLOBAL_STATE_FAST: dict[Callable, Callable[[_TreeBuilder, Any], bool]] = {
    _autocast_state: _autocast_off_leaf,
    _global_module_hooks: _no_module_hooks_leaves,
}


def _global_state_leaves(b: _TreeBuilder, g: Guard) -> bool:
    if len(g.expected) != len(GLOBAL_STATE_READERS):
        return False
    for (name, read), value in zip(GLOBAL_STATE_READERS, g.expected, strict=True):
        fast = _GLOBAL_STATE_FAST.get(read)
        if fast is None or not fast(b, value):
            b.late.append(TreeLeaf("call_eq", read, value, f"{name} == {_short(value)}"))
    return True


def _shape_leaves(b: _TreeBuilder, g: Guard) -> bool:
    return False  # a Python expression over sizes: a python leaf


# --------------------------------------------------------------------------------------
# GUARD_KINDS: one row per guard kind
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class GuardKindRow:
    """Everything one guard kind is, in one place (issue 26):

    - ``order``: when it is checked among the guards of one source depth (cheap and type
      checks first);
    - ``c_check``: the ``_guardtree.c`` leaf kinds its tree rule emits (``leaf_names`` there;
      ``python``: the leaf evaluates ``expr``);
    - ``expr(guard, ns, x)``: the guard as a Python expression (``x``: the source's value);
    - ``failure(guard, name, value)``: why it failed on ``value``, in words;
    - ``leaves(builder, guard)``: adds its tree leaves, or answers False (a python leaf);
    - ``sourced``: guards a source's value (False: grad mode, global state, shape guards,
      whose ``x`` and ``name`` are None).
    """

    kind: GuardKind
    order: int
    c_check: tuple[str, ...]
    expr: Callable[..., str]
    failure: Callable[..., str]
    leaves: Callable[[_TreeBuilder, Guard], bool]
    sourced: bool = True


#: GuardKind -> its row; every kind has exactly one
GUARD_KINDS: dict[GuardKind, GuardKindRow] = {}


def _row(*kinds: GuardKind, order: int, c_check: tuple[str, ...], expr: Callable[..., str],
         failure: Callable[..., str], leaves: Callable[[_TreeBuilder, Guard], bool],
         sourced: bool = True) -> None:
    for kind in kinds:
        if kind in GUARD_KINDS:
            raise ValueError(f"guard kind {kind} has two rows in GUARD_KINDS")
        GUARD_KINDS[kind] = GuardKindRow(kind, order, c_check, expr, failure, leaves, sourced)


def guard_kind_row(kind: GuardKind) -> GuardKindRow:
    row = GUARD_KINDS.get(kind)
    if row is None:
        raise KeyError(f"guard kind {kind} has no row in guards.GUARD_KINDS")
    return row


_row(GuardKind.GRAD_MODE, order=0, c_check=("call_is",), sourced=False,
     expr=lambda g, ns, x: f"{ns.add('grad_enabled', torch.is_grad_enabled)}() is {g.expected!r}",
     failure=lambda g, name, value: "grad mode changed: expected "
                                    f"{'enabled' if g.expected else 'disabled'}",
     leaves=_grad_mode_leaves)
_row(GuardKind.GLOBAL_STATE, order=0, c_check=("call_is", "falsy", "call_eq"), sourced=False,
     expr=lambda g, ns, x: f"{ns.add('torch_state', torch_global_state)}() == "
                           f"{ns.add('state', g.expected)}",
     failure=_global_state_failure, leaves=_global_state_leaves)
_row(GuardKind.ID_MATCH, GuardKind.FUNCTION_MATCH, order=1, c_check=("id",),
     expr=lambda g, ns, x: f"id({x}) == {g.expected}",
     failure=lambda g, name, value: f"{name} is not the {g.what or 'object'} seen at compile "
                                    f"time ({g.kind})",
     leaves=_id_leaves)
_row(GuardKind.NN_MODULE, order=1, c_check=("id", "is"),
     expr=lambda g, ns, x: f"id({x}) == {g.expected[0]} and {x}.training is {g.expected[1]!r}",
     failure=_module_failure, leaves=_module_leaves)
_row(GuardKind.TYPE_MATCH, order=2, c_check=("type",),
     expr=lambda g, ns, x: f"type({x}) is {ns.add('type', g.expected)}",
     failure=lambda g, name, value: f"type({name}) is {g.expected.__qualname__} "
                                    f"(actual {type(value).__qualname__})",
     leaves=_type_leaves)
_row(GuardKind.HASATTR, order=3, c_check=("hasattr",),
     expr=lambda g, ns, x: f"{'' if g.expected[1] else 'not '}hasattr({x}, {g.expected[0]!r})",
     failure=lambda g, name, value: f"hasattr({name}, {g.expected[0]!r}) is {g.expected[1]} "
                                    f"(actual {not g.expected[1]})",
     leaves=_hasattr_leaves)
_row(GuardKind.CONSTANT_MATCH, order=3, c_check=("is", "type", "eq", "nan", "same"),
     expr=_constant_expr,
     failure=lambda g, name, value: f"{name} == {g.expected!r} (actual {_short(value)})",
     leaves=_constant_leaves)
_row(GuardKind.LIST_LENGTH, order=3, c_check=("type", "len"),
     expr=lambda g, ns, x: f"type({x}) is {ns.add('type', g.expected[0])} and "
                           f"len({x}) == {g.expected[1]}",
     failure=_length_failure, leaves=_length_leaves)
_row(GuardKind.DICT_KEYS, order=3, c_check=("type", "keys", "falsy"), expr=_keys_expr,
     failure=_keys_failure, leaves=_keys_leaves)
_row(GuardKind.TENSOR_MATCH, order=4, c_check=("tensor",),
     expr=lambda g, ns, x: f"{ns.add('tg', g.expected)}({x})",
     failure=_tensor_failure, leaves=_tensor_leaves)
_row(GuardKind.SHAPE_ENV, order=5, c_check=("python",), sourced=False,
     expr=lambda g, ns, x: g.expected.code, failure=_shape_failure, leaves=_shape_leaves)

_missing = [kind.name for kind in GuardKind if kind not in GUARD_KINDS]
if _missing:
    raise AssertionError(f"guards.GUARD_KINDS has no row for {', '.join(_missing)}")

_check_counter = itertools.count()


def build_check_fn(guards: Iterable[Guard], arg_names: Sequence[str],
                   f_globals: dict[str, Any], *, name: str = "check") -> Callable[..., bool]:
    """ONE check ``check(<arg slots>) -> bool`` for all the guards: a ``GuardTree`` (C).

    Each value a guard reads is fetched once per call, by the tree node of its source, and
    the values reached through it start from there: a module tree's guards cost one step
    per edge, not one walk from the root per guard.  Any exception while checking counts as
    a miss.  The check gets ``.guards``, ``.code`` (the printed tree) and
    ``.failure_reason(*args)`` (the first failing guard in words, found by evaluating each
    guard in Python: only called after the tree said no).
    """
    if GuardTree is None:
        raise ImportError("kiln_frontend._evalframe is not built (it holds GuardTree): run "
                          "`python packages/frontend/hatch_build.py --inplace`")
    guard_list = guards.sorted() if isinstance(guards, GuardSet) else list(guards)
    filename = f"<kiln guards {next(_check_counter)}>"
    scope: dict[str, Any] = {"G": f_globals, GUARDED_FUNCTION: guarded_function,
                             "math": math, "torch": torch}  # shape guards print math., torch.
    builder = _TreeBuilder(arg_names, scope, filename)
    for g in guard_list:
        builder.add(g)
    root = builder.finish()
    check = GuardTree(len(arg_names), f_globals, root.spec())
    nodes, leaves = root.count()
    header = (f"def {name}({', '.join(arg_names)}):  # guard tree checked in C: {nodes} "
              f"nodes, {leaves} leaves, {len(guard_list)} guards")
    check.guards = guard_list
    check.code = "\n".join([header, *root.lines("    ")]) + "\n"
    check.failure_reason = _failure_reason_fn(guard_list, arg_names, scope, filename)
    return check


def _failure_reason_fn(guard_list: list[Guard], arg_names: Sequence[str],
                       scope: dict[str, Any], filename: str) -> Callable[..., str | None]:
    """``failure_reason(*args)``: each guard on its own, in check order, its value fetched
    from its source (compiled on first use: most entries never fail)."""
    params = ", ".join(arg_names)
    per_guard: list[tuple[Guard, Callable, Callable | None]] = []

    def compile_guards() -> None:
        ns = _Namespace()
        exprs = [g.expr(ns) for g in guard_list]
        own = {**scope, **ns.values}
        def make(text: str) -> Callable:
            code = compile(f"lambda {params}: {text}", filename, "eval")
            bind_guard_constants(code, own)
            return eval(code, own)

        for g, e in zip(guard_list, exprs, strict=True):
            ok_fn = make(f"({e})")
            val_fn = None
            if g.source is not None:
                val_fn = make(f"({g.source.guard_expr()})")
            elif g.kind is GuardKind.SHAPE_ENV:  # the sizes it reads, by name
                pairs = ", ".join(f"{text!r}: {code}" for text, code in g.expected.symbols)
                val_fn = make(f"{{{pairs}}}")
            per_guard.append((g, ok_fn, val_fn))

    def failure_reason(*args: Any) -> str | None:
        if not per_guard and guard_list:
            compile_guards()
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

    return failure_reason


def format_guards(guards: Iterable[Guard]) -> str:
    """The GUARDS section as TorchDynamo prints it (one `` - local 'a' TENSOR_MATCH`` line
    per guard)."""
    return "\n".join(str(g) for g in guards)


__all__ = [
    "Guard",
    "GuardKind",
    "GuardKindRow",
    "GUARD_KINDS",
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
