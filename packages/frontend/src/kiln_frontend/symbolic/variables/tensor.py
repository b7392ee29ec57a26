"""Tensors: an FX proxy plus a fake tensor (``proxy.node.meta["example_value"]``)."""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ...exc import Unsupported
from ...layers import upper
from .base import VariableTracker, tracker_for
from .constant import ConstantVariable

#: tensor attributes whose value is fixed by the guards (static shapes): folded to constants
CONSTANT_ATTRS = frozenset({
    "shape", "dtype", "device", "ndim", "layout", "is_cuda", "is_cpu", "is_meta",
    "is_sparse", "is_quantized", "is_mkldnn", "is_nested", "is_complex_dtype", "requires_grad",
    "is_leaf", "itemsize", "nbytes", "is_mps", "is_xpu",
})

#: tensor attributes that are tensors: become ``getattr`` nodes
TENSOR_ATTRS = frozenset({"T", "mT", "H", "mH", "real", "imag"})

#: methods whose (non-tensor) result only depends on what the guards fix: folded
CONSTANT_METHODS = frozenset({
    "size", "dim", "ndimension", "numel", "nelement", "stride", "is_contiguous",
    "element_size", "is_floating_point", "is_complex", "get_device", "storage_offset",
    "__len__", "is_signed", "has_names",
})

#: methods that cannot be captured (data-dependent Python values or side effects)
UNSUPPORTED_METHODS = {
    "tolist": "Tensor.tolist() reads values out of a tensor (data-dependent)",
    "backward": "Tensor.backward() inside a captured frame",
    "register_hook": "Tensor.register_hook",
    "retain_grad": "Tensor.retain_grad",
    "data_ptr": "Tensor.data_ptr() depends on the storage",
    "__bool__": "bool() of a tensor (data-dependent)",
    "__index__": "index() of a tensor (data-dependent)",
}


def _python_number(cast: type):
    """``int(t)``/``float(t)`` on the value ``t.item()`` gave: a node when the dtype differs."""

    def convert(tx, value: VariableTracker) -> VariableTracker:
        from ... import shapes

        if value.python_type() is cast:
            return value
        return shapes.sym_operator(tx, torch.sym_int if cast is int else torch.sym_float,
                                   [value])

    return convert


#: methods that read one number out of a tensor: ``t.item()`` in the graph (an unbacked
#: symbol, shapes.scalar_of_tensor), then converted to the Python type they promise
SCALAR_METHODS = {
    "item": lambda tx, value: value,
    "__float__": _python_number(float),
    "__int__": _python_number(int),
}


def plain_tensor_class(cls: type) -> bool:
    """``Tensor`` itself, or a subclass that opts out of both overrides (``Parameter``): what
    the graph computes on it is what eager computes. A subclass with its own
    ``__torch_function__`` or ``__torch_dispatch__`` (or Tensor's default
    ``__torch_function__``, which returns the subclass) is not."""
    return cls is torch.Tensor or (
        getattr(cls, "__torch_function__", None) is torch._C._disabled_torch_function_impl
        and getattr(cls, "__torch_dispatch__", None) is torch._C._disabled_torch_dispatch_impl)


class UncapturedTensorVariable(VariableTracker):
    """A tensor from the frame that is never a graph input: a sparse (COO, CSR, ...) or other
    non-strided tensor (it has no strides), or an instance of a tensor subclass that
    overrides torch's functions (its ``__torch_function__`` may change any result; kiln
    captures plain tensors only). Loading it works (a frame resumed after a break reloads it
    from its source); any use is a graph break at that instruction, as torch.compile breaks
    on sparse tensors. Guarded on its type and layout."""

    def __init__(self, value: torch.Tensor, why: str, *, source=None):
        super().__init__(source=source)
        self.value = value
        self.why = why

    @classmethod
    def wrap(cls, builder, value, why: str):
        from ...guards import GuardKind
        from ...sources import AttrSource

        builder.install_guard(GuardKind.TYPE_MATCH, type(value))
        builder.child(AttrSource(builder.source, "layout")).install_guard(
            GuardKind.ID_MATCH, id(value.layout), what="layout of an uncaptured tensor")
        return cls(value, why, source=builder.source)

    def python_type(self) -> type:
        return type(self.value)

    def _refuse(self) -> Unsupported:
        where = f" {self.source.name()}" if self.source is not None else ""
        return Unsupported(f"input{where} is {self.why}")

    def as_proxy(self) -> Any:
        raise self._refuse()

    def var_getattr(self, tx, name: str) -> VariableTracker:
        raise self._refuse()

    def call_function(self, tx, args, kwargs) -> VariableTracker:
        raise self._refuse()

    def truth_value(self, tx) -> bool:
        raise self._refuse()

    def describe(self) -> str:
        where = f" {self.source.name()}" if self.source is not None else ""
        return f"UncapturedTensorVariable({type(self.value).__name__}, {self.value.layout}{where})"


@upper.provide
@tracker_for(torch.Tensor)
class TensorVariable(VariableTracker):
    """A tensor in the graph being built.

    ``proxy`` is the ``torch.fx.Proxy`` of its node; ``example_value`` the fake tensor
    (also in ``proxy.node.meta["example_value"]``).  Tensors that came from the frame have a
    ``source`` (they are graph inputs, or ``get_attr`` parameters of a module)."""

    def __init__(self, proxy: torch.fx.Proxy, example_value: torch.Tensor, *, source=None,
                 class_type: type = torch.Tensor):
        super().__init__(source=source)
        self.proxy = proxy
        self.example_value = example_value
        self.class_type = class_type

    @classmethod
    def wrap(cls, builder, value):
        if value.layout is not torch.strided:  # sparse: loadable, any use graph-breaks
            layout = str(value.layout).replace("torch.", "")
            return UncapturedTensorVariable.wrap(
                builder, value, f"a {layout} tensor: only strided tensors are captured "
                                "(sparse tensors run eagerly)")
        from .tensor_subclass import guard_subclass, traceable_subclass

        if traceable_subclass(type(value)):  # flattened by the backend (tensor_subclass.py)
            try:
                if builder.guard and builder.source is not None:
                    guard_subclass(builder.tx.output, builder.source, value)
            except Unsupported as e:
                return UncapturedTensorVariable.wrap(builder, value, str(e))
            return builder.tx.output.add_graph_input(builder.source, value)
        if not plain_tensor_class(type(value)):
            return UncapturedTensorVariable.wrap(
                builder, value, f"a {type(value).__qualname__}, a tensor subclass that "
                                "overrides torch's functions (__torch_function__): kiln "
                                "captures plain tensors and traceable subclasses only "
                                "(its uses run eagerly)")
        return builder.tx.output.add_graph_input(builder.source, value)

    @property
    def node(self) -> torch.fx.Node:
        return self.proxy.node

    def python_type(self) -> type:
        if self.class_type is torch.Tensor and is_traceable_wrapper_subclass(self.example_value):
            return type(self.example_value)  # made in the graph (DTensor.from_local's result)
        return self.class_type

    def as_proxy(self) -> Any:
        return self.proxy

    def as_example(self) -> Any:
        return self.example_value

    def truth_value(self, tx) -> bool:
        raise Unsupported("data-dependent branch on a tensor")

    def has_unpack_var_sequence(self, tx) -> bool:
        return self.example_value.dim() > 0

    def unpack_var_sequence(self, tx) -> list[VariableTracker]:
        if self.example_value.dim() == 0:
            raise Unsupported("iterating over a 0-d tensor")
        n = self.example_value.shape[0]
        return [tx.output.create_graph_op("call_function", operator.getitem,
                                          [self, ConstantVariable(i)], {}) for i in range(n)]

    def var_getattr(self, tx, name: str) -> VariableTracker:
        if name in CONSTANT_ATTRS:
            value = getattr(self.example_value, name)
            from ... import shapes

            if shapes.is_symbolic(value):  # dynamic shapes: sizes are SymInts
                if name == "shape":
                    return shapes.tensor_size(tx, self)
                return shapes.wrap_symbolic(tx.output, lambda: tx.output.tracer.create_proxy(
                    "call_function", getattr, (self.proxy, name), {}), value)
            return ConstantVariable.create(value)
        if name in TENSOR_ATTRS:
            return tx.output.create_graph_op("call_function", getattr,
                                             [self, ConstantVariable(name)], {})
        if name == "grad":
            raise Unsupported("reading Tensor.grad")
        if name == "data":
            from .tensor_data import take_data

            return take_data(tx, self)
        attr = getattr(torch.Tensor, name, None)
        if attr is None:
            dtensor = upper.dtensor_attribute(tx, self, name)  # to_local, redistribute, placements
            if dtensor is not None:
                return dtensor
            raise Unsupported(f"tensor attribute {name!r}")
        if callable(attr):
            return TensorMethodVariable(self, name)
        raise Unsupported(f"tensor attribute {name!r}")

    def call_method(self, tx, name, args, kwargs):
        return TensorMethodVariable(self, name).call_function(tx, args, kwargs)

    def describe(self) -> str:
        ex = self.example_value
        where = f" {self.source.name()}" if self.source is not None else ""
        return f"TensorVariable({self.node.name}{where}: {tuple(ex.shape)} {ex.dtype})"


class TensorMethodVariable(VariableTracker):
    """``tensor.method`` loaded but not called yet."""

    def __init__(self, tensor: TensorVariable, name: str):
        super().__init__()
        self.tensor = tensor
        self.name = name

    def children(self):
        return [self.tensor]

    def describe(self) -> str:
        return f"Tensor.{self.name}"

    def call_function(self, tx, args, kwargs):
        name = self.name
        if name in SCALAR_METHODS and not args and not kwargs:
            from ... import shapes

            value = shapes.scalar_of_tensor(tx, self.tensor, f"Tensor.{name}()")
            return SCALAR_METHODS[name](tx, value)
        if name in UNSUPPORTED_METHODS:
            raise Unsupported(UNSUPPORTED_METHODS[name])
        if name == "numpy":
            return self.as_numpy(args, kwargs)
        if name == "requires_grad_":
            return self.requires_grad_(tx, args, kwargs)
        if name in CONSTANT_METHODS:
            fake = self.tensor.example_value
            try:
                cargs = [a.as_python_constant() for a in args]
                ckwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
            except Exception:  # noqa: BLE001
                raise Unsupported(f"Tensor.{name} with non-constant arguments") from None
            value = getattr(fake, name)(*cargs, **ckwargs)
            from ... import shapes

            if shapes.is_symbolic(value):  # dynamic shapes: sizes are SymInts
                if name == "size" and not ckwargs and len(cargs) <= 1:
                    return shapes.tensor_size(tx, self.tensor, cargs[0] if cargs else None)
                return shapes.wrap_symbolic(tx.output, lambda: tx.output.tracer.create_proxy(
                    "call_method", name, (self.tensor.proxy, *cargs), ckwargs), value)
            return ConstantVariable.create(value)
        return tx.output.create_graph_op("call_method", name, [self.tensor, *args], kwargs)

    def requires_grad_(self, tx, args, kwargs) -> VariableTracker:
        """``t.requires_grad_()`` in the graph; on an intermediate it is remembered
        (``OutputGraph.leaks_requires_grad``), or breaks the graph on the trace after a
        leak, as torch.compile does."""
        tensor = self.tensor
        before = tensor.example_value.requires_grad
        out = tx.output
        if tensor.source is None and not before and out.refuse_requires_grad_:
            wanted = args[0] if args else kwargs.get("requires_grad", ConstantVariable(True))
            if wanted.is_python_constant() and wanted.as_python_constant() is True and \
                    not out.tracing_bodies and tx.root().defer_requires_grad(tensor):
                return tensor  # set on the graph's output, before the rest of the frame
            raise Unsupported("requires_grad_() of an intermediate whose gradient leaves "
                              "the graph")
        result = out.create_graph_op("call_method", "requires_grad_", [tensor, *args], kwargs)
        if tensor.source is None and not before and tensor.example_value.requires_grad:
            out.requires_grad_roots.append(tensor.node)
        return result

    def as_numpy(self, args, kwargs) -> VariableTracker:
        """``t.numpy()``: the array sharing ``t``'s memory (numpy_arrays.py)."""
        from .numpy_values import np

        fake = self.tensor.example_value
        if np is None:
            raise Unsupported("Tensor.numpy() without NumPy installed")
        if args or kwargs:
            raise Unsupported("Tensor.numpy(force=...)")
        if fake.requires_grad or fake.device.type != "cpu":
            raise Unsupported("Tensor.numpy() of a tensor that requires grad or is not on "
                              "the CPU (eager raises)")
        return upper.NumpyNdarrayVariable(self.tensor)

    def reconstruct(self, codegen):
        codegen(self.tensor)
        codegen.load_attr(self.name)
