"""Dataclasses built while kiln captures: frozen ones whose ``__post_init__`` sets derived
fields with ``object.__setattr__`` and caches its hash in a field (torch's ``DTensorSpec``,
``_MeshLayout``, TorchDynamo's ``CompileId``...), ``field(default_factory=...)``,
``slots=True``, ``__setattr__`` overrides, ``InitVar``, inheritance.

Each case runs a function eagerly and compiled (``kiln_frontend.compile``) and compares the
results and the final state of every object it made (fields, ``__dict__``, slots); then the
dataclass's own ``__init__`` runs as the frame kiln captures (a constructor called under
``optimize``, as torch's own code calls them), where kiln's builder used to hash the
half-built ``self`` (``v in TORCH_SPECIAL_FUNCTIONS`` ran the class's ``__hash__``, which read
a field ``__post_init__`` had not set yet): an internal error on every such ``__init__``.
No case may log on ``kiln.internal_errors``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import InitVar, dataclass, field
from typing import Any

import kiln_frontend
import pytest
import torch
from torch.testing import assert_close

pytestmark = pytest.mark.usefixtures("fresh_frontend")


def _graph_backend(gm, example_inputs):
    return gm.forward


# -- the dataclasses ----------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """Like DTensorSpec: frozen, derived fields and a cached hash set in __post_init__."""

    shape: tuple
    scale: float = 1.0

    def __post_init__(self):
        object.__setattr__(self, "numel", self.shape[0] * self.shape[1])
        object.__setattr__(self, "_hash", hash((self.shape, self.scale)))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return isinstance(other, Spec) and self.shape == other.shape and \
            self.scale == other.scale


@dataclass(frozen=True)
class Layout:
    """Like _MeshLayout: a frozen dataclass whose eq/hash use a property of its fields."""

    sizes: tuple
    strides: tuple

    @property
    def shape(self):
        return self.sizes

    def __hash__(self):
        return hash((self.shape, self.strides))

    @classmethod
    def contiguous(cls, sizes):
        strides, acc = [], 1
        for s in reversed(sizes):
            strides.append(acc)
            acc *= s
        return cls(tuple(sizes), tuple(reversed(strides)))


@dataclass
class Bag:
    name: str
    items: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)


@dataclass(slots=True)
class Slotted:
    a: int
    b: float = 2.0


@dataclass(frozen=True, slots=True)
class FrozenSlotted:
    a: int
    b: int

    def total(self):
        return self.a + self.b


class ReadOnlyError(AttributeError):
    pass


@dataclass
class Guarded:
    """A __setattr__ override that refuses writes once built."""

    x: int
    y: int = 0

    def __post_init__(self):
        object.__setattr__(self, "_sealed", True)

    def __setattr__(self, name, value):
        if getattr(self, "_sealed", False):
            raise ReadOnlyError(name)
        object.__setattr__(self, name, value)


@dataclass(frozen=True)
class Base:
    a: int

    def __post_init__(self):
        object.__setattr__(self, "double", self.a * 2)


@dataclass(frozen=True)
class Derived(Base):
    b: int = 3

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "total", self.double + self.b)


@dataclass
class WithInitVar:
    x: int
    factor: InitVar[int] = 2
    scaled: int = field(init=False)

    def __post_init__(self, factor):
        self.scaled = self.x * factor


@dataclass(frozen=True, order=True)
class Version:
    major: int
    minor: int = 0


@dataclass(frozen=True, kw_only=True)
class Opts:
    lr: float
    momentum: float = 0.9
    tags: tuple = ()


# -- comparing ----------------------------------------------------------------------------


def _state(obj: Any) -> Any:
    """Everything an object holds: its fields, ``__dict__`` and slots (recursively)."""
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_state(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _state(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        state = {"__class__": type(obj).__name__}
        state.update({k: _state(v) for k, v in getattr(obj, "__dict__", {}).items()})
        for cls in type(obj).__mro__:
            for name in getattr(cls, "__slots__", ()):
                if hasattr(obj, name):
                    state[name] = _state(getattr(obj, name))
        return state
    return obj


def _same(got: Any, expected: Any) -> None:
    """Equal states: tensors with ``assert_close``, everything else with ``==``."""
    if isinstance(expected, torch.Tensor):
        assert_close(got, expected)
    elif isinstance(expected, (list, tuple)):
        assert type(got) is type(expected) and len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            _same(g, e)
    elif isinstance(expected, dict):
        assert type(got) is type(expected) and list(got) == list(expected)
        for k in expected:
            _same(got[k], expected[k])
    else:
        assert type(got) is type(expected) and got == expected, (got, expected)


def _check(fn, *args):
    """fn compiled matches fn eager: its result and the final state of what it made."""
    expected = fn(*args)
    compiled = kiln_frontend.compile(fn, backend=_graph_backend)
    got = compiled(*args)
    _same(_state(got), _state(expected))
    again = compiled(*args)  # the cached entry too
    _same(_state(again), _state(expected))
    return got


# -- the cases ----------------------------------------------------------------------------


def test_frozen_post_init_object_setattr_and_cached_hash(no_internal_errors):
    def fn(x):
        s = Spec((2, 3), 2.0)
        t = Spec((2, 3), 2.0)
        same = s == t and hash(s) == hash(t)
        return x * s.scale + s.numel, same, s, t, {s: 1}.get(t, 0)

    _check(fn, torch.randn(2, 3))


def test_frozen_property_hash_and_classmethod_constructor(no_internal_errors):
    def fn(x):
        lay = Layout.contiguous([2, 3])
        other = Layout((2, 3), (3, 1))
        return x.reshape(lay.shape) * lay.strides[0], lay == other, \
            hash(lay) == hash(other), lay

    _check(fn, torch.arange(6.0))


def test_default_factory_fields_are_fresh_and_mutated(no_internal_errors):
    def fn(x):
        a = Bag("a")
        b = Bag("b")
        a.items.append(x.sum())
        a.meta["n"] = len(a.items)
        b.items.extend([1, 2])
        return x + len(b.items), a, b, a.items is not b.items

    _check(fn, torch.randn(4))


def test_slots_dataclasses(no_internal_errors):
    def fn(x):
        s = Slotted(3)
        s.b = s.b * 2
        f = FrozenSlotted(1, 2)
        return x * s.a + s.b + f.total(), s, f, f == FrozenSlotted(1, 2)

    _check(fn, torch.randn(3))


def test_frozen_mutation_raises_frozen_instance_error(no_internal_errors):
    def fn(x):
        s = Spec((1, 2))
        try:
            s.scale = 5.0
        except dataclasses.FrozenInstanceError as e:
            return x + 1, type(e).__name__, s
        return x, "no error", s

    _check(fn, torch.randn(2))

    def uncaught(x):
        f = FrozenSlotted(1, 2)
        f.a = 3
        return x

    compiled = kiln_frontend.compile(uncaught, backend=_graph_backend)
    with pytest.raises(dataclasses.FrozenInstanceError):
        uncaught(torch.randn(2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        compiled(torch.randn(2))


def test_setattr_override_refuses_writes(no_internal_errors):
    def fn(x):
        g = Guarded(2)
        try:
            g.y = 7
        except ReadOnlyError:
            return x * g.x, g, "refused"
        return x, g, "written"

    _check(fn, torch.randn(3))


def test_inherited_post_init_and_init_var(no_internal_errors):
    def fn(x):
        d = Derived(4)
        w = WithInitVar(5, factor=3)
        return x + d.total + w.scaled, d, w, isinstance(d, Base)

    _check(fn, torch.randn(2))


def test_order_kw_only_and_replace(no_internal_errors):
    def fn(x):
        v1, v2 = Version(1, 2), Version(1, 10)
        o = Opts(lr=0.1, tags=("a",))
        o2 = dataclasses.replace(o, momentum=0.5)
        s2 = dataclasses.replace(Spec((2, 2)), scale=3.0)  # __post_init__ runs again
        return x * o2.momentum + o.lr, v1 < v2, max(v1, v2), o2, s2, s2.numel

    _check(fn, torch.randn(2))


def test_dataclass_with_tensor_fields_computed_in_post_init(no_internal_errors):
    @dataclass(frozen=True)
    class Stats:
        data: torch.Tensor

        def __post_init__(self):
            object.__setattr__(self, "mean", self.data.mean())
            object.__setattr__(self, "centered", self.data - self.data.mean())

    def fn(x):
        st = Stats(x * 2)
        return st.centered.abs().sum() + st.mean, st

    _check(fn, torch.randn(5))


@pytest.mark.parametrize("make", [
    lambda: Spec((2, 3), 2.0),
    lambda: Layout.contiguous([4, 2]),
    lambda: Bag("x"),
    lambda: Slotted(1),
    lambda: FrozenSlotted(1, 2),
    lambda: Guarded(3),
    lambda: Derived(2),
    lambda: WithInitVar(2),
    lambda: Opts(lr=1.0),
], ids=["spec", "layout", "bag", "slotted", "frozen_slotted", "guarded", "derived", "initvar",
        "kw_only"])
def test_dataclass_init_as_the_captured_frame(make, no_internal_errors):
    """The constructor called under ``optimize``: the dataclass's ``__init__`` (and
    ``__post_init__``) are frames kiln captures themselves, with ``self`` half built."""
    expected = make()
    with kiln_frontend.optimize(_graph_backend):
        got = make()
        again = make()
    _same(_state(got), _state(expected))
    _same(_state(again), _state(expected))
    assert got == expected and again == expected
    if type(got).__hash__ is not None:
        assert hash(got) == hash(expected)


def test_dtensor_on_a_size_one_mesh(tmp_path, no_internal_errors):
    """torch's DTensorSpec (frozen, ``__post_init__`` caching ``_hash``) and DeviceMesh's
    layout dataclasses, built while a compiled program runs: the program matches eager.
    (DTensor capture itself is another issue: graph breaks are fine here.)"""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = DeviceMesh("cpu", [0])

        def prog(x, w):
            dw = distribute_tensor(w, mesh, [Replicate()])
            dx = distribute_tensor(x, mesh, [Shard(0)])
            y = (dx @ dw).relu() + 1
            return y.full_tensor(), tuple(y.placements)

        x, w = torch.randn(3, 4), torch.randn(4, 4)
        expected = prog(x, w)
        compiled = kiln_frontend.compile(prog, backend="eager")
        for _ in range(2):
            got = compiled(x, w)
            assert_close(got[0], expected[0])
            assert got[1] == expected[1]

        # tensor parallel: a column- then a row-parallel Linear
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 4))
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x = torch.randn(2, 8)
        expected = model(x)
        compiled = kiln_frontend.compile(model, backend="eager")
        for _ in range(2):
            assert_close(compiled(x), expected)
    finally:
        dist.destroy_process_group()


def test_builder_table_lookups_never_hash_user_objects():
    """The builder asks whether a value is one of torch's special functions by identity: a
    user ``__hash__`` is never run (it may read a field not set yet), and None is no key."""
    from kiln_frontend.symbolic.variables.torch import TORCH_SPECIAL_FUNCTIONS, is_member

    class Explosive:
        def __hash__(self):
            raise AssertionError("hashed")

    assert not is_member(Explosive(), TORCH_SPECIAL_FUNCTIONS)
    assert not is_member(None, TORCH_SPECIAL_FUNCTIONS)
    assert is_member(torch._assert, TORCH_SPECIAL_FUNCTIONS)
