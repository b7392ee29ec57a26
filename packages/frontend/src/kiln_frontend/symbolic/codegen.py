"""PyCodegen: emits the bytecode that rebuilds tracked values in the transformed code.

Every instruction is made through ``kiln_frontend.bytecode`` (``create_instruction`` and the
``builders``), so nothing here knows which Python version runs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch.fx

from ..bytecode import builders, create_instruction
from ..exc import Unsupported
from .variables.base import VariableTracker

#: types LOAD_CONST may carry in a code object built in memory (never marshalled) that
#: the ``dis`` module also prints well
_LITERAL_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis))


class PyCodegen:
    """Collects instructions.  ``graph_outputs`` maps graph nodes to the temporary locals
    holding the compiled graph's outputs; ``temps`` maps trackers already stored in
    temporaries (so an object referenced twice is rebuilt once and stays one object)."""

    def __init__(self, *, cellvars: Iterable[str] = (), freevars: Iterable[str] = (),
                 install_global_object=None):
        self.insts: list = []
        self.cellvars = set(cellvars)
        self.freevars = set(freevars)
        self.graph_outputs: dict[torch.fx.Node, str] = {}
        self.temps: dict[int, str] = {}
        self._keep_alive: list[Any] = []
        self._install_global_object = install_global_object

    # -- raw emission -----------------------------------------------------------------

    def extend(self, insts: Iterable) -> None:
        self.insts.extend(insts)

    def append(self, inst) -> None:
        self.insts.append(inst)

    def load_local(self, name: str) -> None:
        if name in self.cellvars or name in self.freevars:
            self.extend(builders.load_deref(name))
        else:
            self.extend(builders.load_fast(name))

    def store_local(self, name: str) -> None:
        if name in self.cellvars or name in self.freevars:
            self.append(create_instruction("STORE_DEREF", argval=name))
        else:
            self.extend(builders.store_fast(name))

    def load_fast(self, name: str) -> None:
        self.extend(builders.load_fast(name))

    def store_fast(self, name: str) -> None:
        self.extend(builders.store_fast(name))

    def load_deref(self, name: str) -> None:
        self.extend(builders.load_deref(name))

    def load_global(self, name: str, push_null: bool = False) -> None:
        self.extend(builders.load_global(name, push_null))

    def load_attr(self, name: str) -> None:
        self.extend(builders.load_attr(name))

    def load_const(self, value: Any) -> None:
        if type(value) is tuple and all(isinstance(v, _LITERAL_TYPES) for v in value):
            self.extend(builders.load_const(value))
        elif isinstance(value, _LITERAL_TYPES):
            self.extend(builders.load_const(value))
        else:
            self.load_const_object(value)

    def load_const_object(self, value: Any) -> None:
        """Load any object.  Code objects built in memory may hold any constant; to keep
        ``dis`` output readable and avoid surprises with equal-but-distinct constants we
        install it as a global instead when we can."""
        if self._install_global_object is not None:
            name = self._install_global_object("const", value)
            self.load_global(name)
        else:
            self._keep_alive.append(value)
            self.extend(builders.load_const(value))

    def push_null(self) -> None:
        self.extend(builders.push_null())

    def binary_subscr(self) -> None:
        self.extend(builders.binary_subscr())

    def build_tuple(self, n: int) -> None:
        self.extend(builders.build_tuple(n))

    def build_list(self, n: int) -> None:
        self.extend(builders.build_list(n))

    def build_map(self, n: int) -> None:
        self.extend(builders.build_map(n))

    def build_slice(self, n: int) -> None:
        self.append(create_instruction("BUILD_SLICE", arg=n))

    def get_iter(self) -> None:
        self.append(create_instruction("GET_ITER"))

    def call_simple(self, nargs: int) -> None:
        """Stack ``[callable, *args]`` (no NULL) -> result."""
        self.extend(builders.call_function(nargs, push_null_before=True))

    def call_function(self, nargs: int) -> None:
        """Stack ``[NULL, callable, *args]`` -> result."""
        self.extend(builders.call_function(nargs, push_null_before=False))

    def make_function(self, code, closure_vars) -> None:
        self.extend(builders.make_function(code, closure_vars))

    def pop_top(self) -> None:
        self.extend(builders.pop_top())

    def return_value(self) -> None:
        self.extend(builders.return_value())

    # -- rebuilding trackers ----------------------------------------------------------

    def __call__(self, var: VariableTracker) -> None:
        from .variables.misc import LazyVariable
        from .variables.tensor import TensorVariable

        if isinstance(var, LazyVariable):
            if var.realized is None:
                var.source.reconstruct(self)
                return
            var = var.realized
        temp = self.temps.get(id(var))
        if temp is not None:
            self.load_fast(temp)
            return
        if isinstance(var, TensorVariable):
            self.load_graph_value(var)
            return
        var.reconstruct(self)

    def load_graph_value(self, var: VariableTracker) -> None:
        """A value the graph computes (a tensor, a symbolic size): the local its graph output
        was stored in, else its source reloaded."""
        out = self.graph_outputs.get(var.node)
        if out is not None:
            self.load_fast(out)
            return
        if var.source is not None:
            var.source.reconstruct(self)
            return
        raise Unsupported(f"{var.describe()} is neither a graph output nor reloadable")

    def store_in_temp(self, var: VariableTracker, name: str) -> None:
        """Rebuild ``var`` once into local ``name``; later uses load it."""
        self(var)
        self.store_fast(name)
        self.temps[id(var)] = name


def walk_trackers(values: Iterable[VariableTracker]):
    """Every tracker reachable from ``values`` (through containers), depth first,
    children before parents."""
    from .variables.misc import LazyVariable

    seen: set[int] = set()

    def visit(v: VariableTracker):
        if isinstance(v, LazyVariable) and v.realized is not None:
            v = v.realized
        for child in v.children():
            yield from visit(child)
        if id(v) not in seen:
            seen.add(id(v))
            yield v

    for value in values:
        yield from visit(value)
