"""Soundness of attribute lookup (issue 25): every attribute read resolves as CPython's
``object.__getattribute__`` does (data descriptors, then the instance dict, then non-data
descriptors and class attributes, then ``__getattr__``), on modules, user objects and
objects made while tracing; a compiled module's wrapper is a view of the module (stores,
deletions and reads through it reach the module); a module's class's own ``__call__`` or
``_call_impl`` is what calling it runs.

Each case is built twice from its factory (two independent worlds): one runs eagerly, the
other compiled (with the ``eager`` backend and with a backend that runs the captured graph
as it is); both take the same steps (a call, then each mutation followed by a call), and the
results, then the final states, are compared with ``assert_close``. ``recompile`` says
whether the mutations must recompile (True), must not (False), or is not checked (None).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import kiln_frontend
import pytest
import torch
import torch.fx
from kiln_frontend.eval_frame import counters
from torch import nn
from torch.testing import assert_close

pytestmark = pytest.mark.usefixtures("fresh_frontend")


def _graph_backend(gm, example_inputs):
    return gm.forward


@dataclasses.dataclass
class Case:
    #: what eager runs (and what is compiled, unless ``target`` is given)
    fn: Callable[..., Any]
    args: tuple = ()
    #: each is called with the handle (the compiled wrapper in the compiled world, the
    #: target itself in the eager one), then the function is called again
    mutations: list[Callable[[Any], Any]] = dataclasses.field(default_factory=list)
    recompile: bool | None = None
    #: the state compared after the last call
    state: Callable[[], Any] | None = None
    #: what to compile (default: fn); when given, the compiled world calls the compiled
    #: target instead of fn
    target: Any = None
    fullgraph: bool = True


CASES: dict[str, Callable[[], Case]] = {}


def case(name: str):
    def deco(factory: Callable[[], Case]) -> Callable[[], Case]:
        if name in CASES:
            raise ValueError(f"duplicate case {name!r}")
        CASES[name] = factory
        return factory

    return deco


def _x() -> torch.Tensor:
    return torch.arange(4, dtype=torch.float32) / 3 + 0.5


# =======================================================================================
# nn.Module: which of two same-named things an attribute read finds
# =======================================================================================


@case("module_instance_lambda_shadows_class_method")
def _():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.helper = lambda: 7.0

        def helper(self):
            return 1.0

        def forward(self, x):
            return x * self.inner()

        def inner(self):
            return self.helper()

    m = M()
    return Case(m, (_x(),), target=m)


@case("module_instance_attribute_set_then_deleted_over_method")
def _():
    class M(nn.Module):
        def helper(self):
            return 1.0

        def forward(self, x):
            return x * self.helper()

    m = M()
    return Case(lambda x: m(x), (_x(),), recompile=True, mutations=[
        lambda h: setattr(m, "helper", lambda: 7.0),
        lambda h: delattr(m, "helper"),
    ])


@case("module_submodule_named_like_class_method")
def _():
    # nn.Module.__setattr__ puts the submodule in _modules; the class's method is found
    # first (nn.Module.__getattr__ only runs when normal lookup fails): eager calls it
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.sub = nn.Identity()

        def sub(self, x):
            return x * 99

        def forward(self, x):
            return self.sub(x) * 7

    m = M()
    return Case(m, (_x(),), target=m)


@case("module_submodule_behind_class_attribute_none")
def _():
    # ``down = None`` on the class is found before nn.Module.__getattr__ reaches _modules:
    # eager's ``self.down`` is None although a submodule was assigned
    class M(nn.Module):
        down = None

        def __init__(self):
            super().__init__()
            self.down = nn.ReLU()

        def forward(self, x):
            if self.down is None:
                return x * 7
            return self.down(x - 1.0)

    m = M()
    return Case(m, (_x(),), target=m)


@case("module_method_shadows_base_class_attribute")
def _():
    class Base(nn.Module):
        scale = 7.0

    class M(Base):
        def scale(self):
            return 1.0

        def forward(self, x):
            return x * self.scale()

    m = M()
    return Case(m, (_x(),), target=m)


@case("module_property_over_instance_dict")
def _():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.__dict__["val"] = 7.0

        @property
        def val(self):
            return 1.0

        def forward(self, x):
            return x * self.val

    m = M()
    return Case(m, (_x(),), target=m)


@case("module_property_setter_then_read_in_forward")
def _():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self._s = 1.0

        @property
        def s(self):
            return self._s * 7

        @s.setter
        def s(self, v):
            self._s = v

        def forward(self, x):
            self.s = self._s + 1.0
            return x * self.s

    m = M()
    return Case(m, (_x(),), target=m, fullgraph=False, state=lambda: m._s,
                mutations=[lambda h: None])


@case("module_instance_attributes_shadow_classmethod_and_staticmethod")
def _():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = 7.0
            self.s = 3.0

        @classmethod
        def c(cls):
            return 1.0

        @staticmethod
        def s():
            return 1.0

        def forward(self, x):
            return x * self.c + self.s

    m = M()
    return Case(m, (_x(),), target=m)


@case("module_cached_property")
def _():
    class M(nn.Module):
        calls = 0

        @functools.cached_property
        def c(self):
            type(self).calls += 1
            return 7.0

        def forward(self, x):
            return x * self.c

    m = M()
    return Case(m, (_x(),), target=m, state=lambda: (m.__dict__.get("c"), type(m).calls),
                mutations=[lambda h: m.__dict__.__setitem__("c", 2.0)], recompile=True)


class _DataDescriptor:
    def __get__(self, obj, owner):
        return self if obj is None else obj.__dict__.get("_d", 7.0)

    def __set__(self, obj, value):
        obj.__dict__["_d"] = value


class _NonDataDescriptor:
    def __get__(self, obj, owner):
        return self if obj is None else 5.0


@case("module_data_and_non_data_descriptors_against_instance_dict")
def _():
    class M(nn.Module):
        d = _DataDescriptor()
        n = _NonDataDescriptor()
        n2 = _NonDataDescriptor()

        def __init__(self):
            super().__init__()
            self.__dict__["d"] = 1.0  # loses to the data descriptor
            self.__dict__["n"] = 3.0  # wins over the non-data one

        def forward(self, x):
            return x * self.d + self.n * self.n2

    m = M()
    return Case(m, (_x(),), target=m, recompile=True,
                mutations=[lambda h: setattr(m, "d", 2.0),
                           lambda h: m.__dict__.__setitem__("n2", -1.0)])


@case("module_user_getattr_and_getattribute")
def _():
    class G(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def __getattr__(self, name):
            if name == "magic":
                return 7.0
            return super().__getattr__(name)

        def forward(self, x):
            return self.lin(x) * self.magic

    class A(nn.Module):
        k = 1.0

        def __getattribute__(self, name):
            if name == "k":
                return 3.0
            return super().__getattribute__(name)

        def forward(self, x):
            return x * self.k

    g, a = G(), A()
    return Case(lambda x: g(x) + a(x), (_x(),))


@case("module_parameter_deleted_then_set_as_tensor_attribute")
def _():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return x * self.w

    m = M()

    def replace(h):
        del m.w
        m.w = torch.full((4,), 7.0)

    return Case(lambda x: m(x), (_x(),), mutations=[replace, lambda h: m.w.add_(1.0)],
                recompile=True, state=lambda: m.w)


@case("module_submodule_replaced_by_plain_attribute")
def _():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(x - 1.0)

    m = M()

    def replace(h):
        del m.act
        m.act = lambda t: t * 7.0

    return Case(lambda x: m(x), (_x(),), mutations=[replace], recompile=True)


# =======================================================================================
# user objects and objects made while tracing
# =======================================================================================


@case("object_property_slots_and_descriptors")
def _():
    class P:
        d = _DataDescriptor()
        n = _NonDataDescriptor()

        def __init__(self):
            self.__dict__["v"] = 7.0
            self.__dict__["d"] = 1.0

        @property
        def v(self):
            return 1.0

    class S:
        __slots__ = ("a",)

        def __init__(self):
            self.a = 7.0

    p, s = P(), S()
    return Case(lambda x: x * p.v + p.d * s.a - p.n, (_x(),), recompile=True,
                mutations=[lambda h: setattr(s, "a", 2.0), lambda h: setattr(p, "d", 3.0)])


@case("object_instance_attribute_shadows_method_later")
def _():
    class Obj:
        def h(self):
            return 1.0

        @classmethod
        def c(cls):
            return 2.0

    o = Obj()
    return Case(lambda x: x * o.h() + o.c(), (_x(),), recompile=True, mutations=[
        lambda h: setattr(o, "h", lambda: 7.0),
        lambda h: setattr(o, "c", lambda: -1.0),
        lambda h: delattr(o, "h"),
    ])


@case("object_getattr_and_getattribute")
def _():
    class G:
        z2 = 3.0

        def __getattr__(self, name):
            return 7.0 if name == "z" else 0.0

    class A:
        k = 1.0

        def __getattribute__(self, name):
            if name == "k":
                return 5.0
            return object.__getattribute__(self, name)

    g, a = G(), A()
    return Case(lambda x: x * g.z * g.z2 + a.k, (_x(),), fullgraph=False)


@case("object_cached_property_and_class_attribute")
def _():
    class C:
        k = 1.0

        @functools.cached_property
        def c(self):
            return 7.0

    o = C()
    return Case(lambda x: x * o.c + o.k, (_x(),), recompile=True,
                state=lambda: dict(o.__dict__),
                mutations=[lambda h: setattr(C, "k", 4.0), lambda h: setattr(o, "k", 3.0),
                           lambda h: o.__dict__.__setitem__("c", 2.0)])


class _WithSetter:
    def __init__(self, v):
        self.v = v  # through the property's setter

    @property
    def v(self):
        return self._v * 7

    @v.setter
    def v(self, value):
        self._v = value


class _CachedMade:
    @functools.cached_property
    def c(self):
        return 7.0


@case("frame_object_property_setter_and_cached_property")
def _():
    def fn(x):
        o = _WithSetter(1.0)
        c = _CachedMade()
        first = c.c
        c.__dict__["c"] = 2.0  # the cache is now the instance entry
        return x * o.v + first + c.c

    return Case(fn, (_x(),))


@case("frame_object_instance_attribute_shadows_method")
def _():
    class F:
        def __init__(self):
            self.h = lambda: 7.0

        def h(self):
            return 1.0

    return Case(lambda x: x * F().h(), (_x(),))


@case("hasattr_sees_the_frames_own_stores_and_deletions")
def _():
    # stores are replayed after the graph: hasattr read the real object, which had
    # neither the new attribute nor the deletion yet
    class Obj:
        def __init__(self):
            self.tmp = 1.0

        def h(self):
            return 0.0

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.tmp = 1.0

        def forward(self, x):
            self.newattr = 2.0
            a = 7.0 if hasattr(self, "newattr") else 1.0
            return x * a

    o, m = Obj(), M()

    def fn(x):
        o.newattr = 2.0
        o.h = lambda: 1.0
        a = 7.0 if hasattr(o, "newattr") else 1.0
        del o.tmp, o.h
        b = 5.0 if hasattr(o, "tmp") else 0.0
        c = 3.0 if hasattr(o, "h") else 0.5  # the class's method is still there
        return x * a + b + c + m(x)

    return Case(fn, (_x(),), state=lambda: (hasattr(o, "tmp"), hasattr(o, "newattr"),
                                            "h" in vars(o), getattr(m, "newattr", None)))


@case("instance_dict_writes_are_attribute_writes")
def _():
    # obj.__dict__ was a dict tracker apart from the attribute reads (and stores): a write
    # through it was not seen by ``obj.k``
    class Obj:
        def __init__(self):
            self.k = 1.0

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.k = 1.0

        def forward(self, x):
            self.__dict__["k"] = self.k + 6.0
            return x * self.k

    o, m = Obj(), M()

    def fn(x):
        o.__dict__["k"] = 7.0
        a = o.k
        vars(o)["k"] = 5.0
        return x * a + o.k + m(x)

    return Case(fn, (_x(),), fullgraph=False, state=lambda: (o.k, m.k))


class _Lazy:
    def __getattr__(self, name):
        if name == "z":
            return 7.0
        raise AttributeError(name)


class _RaisingProperty:
    @property
    def p(self):
        raise AttributeError("not set")


@case("frame_object_identity_and_hasattr_are_the_objects")
def _():
    # a frame object is not its class (``o is _Lazy`` was True), and ``hasattr`` runs
    # the object's lookup (``__getattr__``, a getter raising AttributeError), not the
    # class's
    def fn(x):
        o, r = _Lazy(), _RaisingProperty()
        a = 7.0 if hasattr(o, "z") else 1.0
        b = 5.0 if hasattr(o, "w") else 2.0
        c = 3.0 if hasattr(r, "p") else -1.0
        d = 11.0 if o is _Lazy else 0.5
        return x * a + b + c + d

    return Case(fn, (_x(),))


# =======================================================================================
# a module's own __call__ / _call_impl
# =======================================================================================


@case("module_own___call___called_from_compiled_function")
def _():
    class M(nn.Module):
        def forward(self, x):
            return x * 3

        def __call__(self, x):
            return x * 15

    m = M()
    return Case(lambda x: m(x) + 1, (_x(),))


@case("module___call___override_calls_super")
def _():
    class M(nn.Module):
        def forward(self, x):
            return x * 3

        def __call__(self, *args, **kwargs):
            return super().__call__(*args, **kwargs) * 5

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = M()

        def forward(self, x):
            return self.inner(x) + 1

    o = Outer()
    return Case(o, (_x(),), target=o)


@case("module__call_impl_override_calls_super")
def _():
    class M(nn.Module):
        def forward(self, x):
            return x * 3

        def _call_impl(self, *args, **kwargs):
            return super()._call_impl(*args, **kwargs) * 5

    class L(nn.Linear):
        def __call__(self, x):
            return super().__call__(x) * 0 + 15

    m, lin = M(), L(4, 4)
    return Case(lambda x: m(x) + lin(x), (_x(),))


@case("graph_module_called_from_compiled_function")
def _():
    # GraphModule.recompile installs its own __call__ (call_wrapped), which only forwards
    # to nn.Module.__call__: still one graph
    class M(nn.Module):
        def forward(self, x):
            return torch.relu(x - 1.0) * 2

    gm = torch.fx.symbolic_trace(M())
    return Case(lambda x: gm(x) + 1, (_x(),))


@case("compiled_module_with_own___call__")
def _():
    class M(nn.Module):
        def forward(self, x):
            return x * 3

        def __call__(self, x):
            return x * 15

    m = M()
    return Case(m, (_x(),), target=m)


# =======================================================================================
# the compiled module's wrapper is a view of the module
# =======================================================================================


class _WithK(nn.Module):
    def __init__(self):
        super().__init__()
        self.k = 1
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        out = self.lin(x) * self.k
        return out + getattr(self, "extra", 0.0)


@case("compiled_module_setattr_reaches_module")
def _():
    m = _WithK()
    return Case(m, (_x(),), target=m, recompile=True, state=lambda: m.__dict__.get("k"),
                mutations=[lambda h: setattr(h, "k", 3), lambda h: setattr(h, "k", -2)])


@case("compiled_module_delattr_and_new_attribute_reach_module")
def _():
    m = _WithK()
    return Case(m, (_x(),), target=m, recompile=True, fullgraph=False,
                state=lambda: (hasattr(m, "extra"), m.__dict__.get("extra")),
                mutations=[lambda h: setattr(h, "extra", 5.0), lambda h: delattr(h, "extra")])


@case("compiled_module_training_and_parameters_are_the_modules")
def _():
    class D(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x) * (2.0 if self.training else 1.0)

    m = D()

    def via_wrapper_eval(h):
        h.eval()
        assert not m.training

    def module_train(h):
        m.train()
        assert h.training

    def weight_through_wrapper(h):
        with torch.no_grad():
            h.lin.weight.mul_(2.0)

    return Case(m, (_x(),), target=m, recompile=True, state=lambda: (m.training,
                                                                     m.lin.weight),
                mutations=[via_wrapper_eval, module_train, weight_through_wrapper])


# =======================================================================================
# the driver
# =======================================================================================


def _steps(c: Case, call: Callable[..., Any], handle: Any) -> list[Any]:
    outs = [call(*c.args)]
    for mutate in c.mutations:
        mutate(handle)
        outs.append(call(*c.args))
    if c.state is not None:
        outs.append(c.state())
    return outs


@pytest.mark.parametrize("backend", ["eager", _graph_backend], ids=["eager", "graph"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_attribute_lookup_matches_eager(name, backend):
    torch.manual_seed(0)  # (the two worlds' modules start equal)
    eager_case = CASES[name]()
    expected = _steps(eager_case, eager_case.fn, eager_case.target)

    torch.manual_seed(0)
    c = CASES[name]()
    kiln_frontend.reset()
    target = c.target if c.target is not None else c.fn
    compiled = kiln_frontend.compile(target, backend=backend, fullgraph=c.fullgraph)
    before = counters["recompiles"]
    got = _steps(c, compiled, compiled)
    assert counters["compiles"] >= 1, "nothing was compiled"
    assert_close(got, expected, msg=lambda m: f"{name}: compiled != eager\n{m}")
    recompiles = counters["recompiles"] - before
    if c.recompile is True:
        assert recompiles >= 1, f"{name}: the mutations did not recompile"
    elif c.recompile is False:
        assert recompiles == 0, f"{name}: {recompiles} needless recompiles"


def test_enough_cases():
    assert len(CASES) >= 20


def test_compiled_module_attribute_protocol_is_the_modules():
    """As torch's OptimizedModule: stores, deletions and reads of names the wrapper's class
    does not define go to the module; the wrapper's own class attributes stay its own."""
    m = _WithK()
    cm = kiln_frontend.compile(m, backend="eager")
    cm.k = 3
    assert m.k == 3 and "k" not in cm.__dict__
    cm.extra = 1.0
    assert m.extra == 1.0
    del cm.extra
    assert not hasattr(m, "extra")
    assert cm.lin is m.lin and cm.k == 3
    m.eval()
    assert cm.training is False
    cm.train()
    assert m.training is True
    assert cm(_x()).shape == (4,)
    assert "forward" in type(cm).__dict__  # the wrapper's own
