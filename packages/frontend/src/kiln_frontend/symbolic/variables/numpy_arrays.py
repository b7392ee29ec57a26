"""NumPy arrays in a captured frame, traced into the graph as tensors (as torch.compile
does): ``t.numpy()``, ``np.mean(a)``, ``a * 2``, ``a[0] = v``, ``torch.from_numpy(a)``.

* An array is a ``NumpyNdarrayVariable`` around the tensor that holds its data.
* A NumPy function or ndarray method on arrays is one graph node whose target is a
  ``NumpyCall``: it runs ``torch._numpy`` (NumPy's semantics, type promotion included,
  written with torch ops) on the tensors, so the graph is tensor code and its printed form
  never names ``np`` (``NameError: name 'np' is not defined`` was issue 10).
* An array reached from the frame (a global ``np.array`` used as a constant) is a graph
  input: ``torch.from_numpy(arr)`` (``FromNumpySource``), which shares the array's memory
  and is read at every call, so an array written between calls gives the new answer (no
  guard on its contents is needed; dtype, shape and strides are guarded by TENSOR_MATCH).
* ``np.random`` and anything ``torch._numpy`` lacks is a graph break.

NumPy is optional (torch does not require it): without it nothing is registered.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from ...exc import Unsupported
from ...guards import GuardKind
from ...layers import upper
from .base import BoundMethodVariable, NotConstant, VariableTracker, tracker_for
from .constant import ConstantVariable

try:
    import numpy as np
except ImportError:  # pragma: no cover - NumPy is not installed
    np = None

#: NumPy module -> the torch._numpy module with the same functions
_TNP_MODULES = {"numpy": "", "numpy.linalg": "linalg", "numpy.fft": "fft"}


def torch_numpy():
    """``torch._numpy`` with NumPy's default dtypes (float64, int64).  Setting them here keeps
    torch._numpy from reading them out of TorchDynamo's config (importing it)."""
    import torch._numpy as tnp
    from torch._numpy import _dtypes_impl

    if _dtypes_impl._default_dtypes is None:
        _dtypes_impl._default_dtypes = _dtypes_impl.DefaultDTypes(
            float_dtype=torch.float64, complex_dtype=torch.complex128, int_dtype=torch.int64)
    return tnp


def _to_tnp(value: Any) -> Any:
    tnp = torch_numpy()
    if isinstance(value, torch.Tensor):
        return tnp.ndarray(value)
    if type(value) in (list, tuple):
        return type(value)(_to_tnp(v) for v in value)
    return value


def _from_tnp(value: Any) -> Any:
    tnp = torch_numpy()
    if isinstance(value, tnp.ndarray):
        return value.tensor
    if type(value) in (list, tuple):
        return type(value)(_from_tnp(v) for v in value)
    return value


_INPLACE_OPERATORS = frozenset({
    "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "imatmul", "iand",
    "ior", "ixor", "ilshift", "irshift",
})


class NumpyCall:
    """A graph node's target: NumPy's ``name`` run with ``torch._numpy`` on tensors.
    ``kind``: ``function`` (``np.<module>.<name>``), ``method`` (``ndarray.<name>``, the
    array first), ``attribute`` (``ndarray.<name>``, an array) or ``operator``
    (``operator.<name>``)."""

    _made: dict[tuple[str, str, str], NumpyCall] = {}

    def __init__(self, kind: str, module: str, name: str):
        self.kind = kind
        self.module = module
        self.name = name
        mutating = (kind == "method" and name == "__setitem__") or \
            (kind == "operator" and name in _INPLACE_OPERATORS)
        # FX names the node and the global after __name__; a trailing "_" marks a write
        # (OutputGraph._guard_distinct_inputs)
        self.__name__ = f"numpy_{name.strip('_')}" + ("_" if mutating else "")
        self.__qualname__ = self.__name__
        self.__module__ = __name__

    @classmethod
    def get(cls, kind: str, name: str, module: str = "") -> NumpyCall:
        key = (kind, module, name)
        if key not in cls._made:
            cls._made[key] = cls(kind, module, name)
        return cls._made[key]

    def resolve(self) -> Any:
        tnp = torch_numpy()
        if self.kind == "operator":
            return getattr(operator, self.name)
        if self.kind == "attribute":
            return operator.attrgetter(self.name)
        if self.kind == "method":
            return getattr(tnp.ndarray, self.name)
        owner = getattr(tnp, self.module) if self.module else tnp
        return getattr(owner, self.name)

    def __call__(self, *args, **kwargs):
        fn = self.resolve()
        if self.kind == "operator" and self.name in ("truediv", "itruediv") and \
                isinstance(args[0], torch.Tensor) and \
                not (args[0].is_floating_point() or args[0].is_complex()):
            # NumPy divides integers in float64; torch._numpy in the default float dtype
            args = (args[0].to(torch.float64), *args[1:])
        return _from_tnp(fn(*_to_tnp(args), **{k: _to_tnp(v) for k, v in kwargs.items()}))

    def __repr__(self) -> str:
        return f"NumpyCall({self.kind}, {self.module + '.' if self.module else ''}{self.name})"

    def __reduce__(self):
        return (NumpyCall.get, (self.kind, self.name, self.module))


def _unwrap(tx, value: VariableTracker) -> VariableTracker:
    """Arrays become the tensors holding them (recursively in lists and tuples)."""
    from .containers import ListVariable, TupleVariable

    value = tx.realize(value)
    if isinstance(value, NumpyNdarrayVariable):
        return value.tensor
    if isinstance(value, (ListVariable, TupleVariable)) and not value.is_python_constant():
        items = [_unwrap(tx, v) for v in value.items]
        return ListVariable(items) if isinstance(value, ListVariable) else TupleVariable(items)
    return value


#: functions whose 0-d result is a 0-d array; other 0-d results are NumPy scalars
_ARRAY_MAKERS = frozenset({
    "array", "asarray", "ascontiguousarray", "copy", "zeros", "ones", "empty", "full",
    "zeros_like", "ones_like", "empty_like", "full_like", "reshape", "squeeze", "astype",
    "view", "__getitem__",
})


def _wrap_result(tx, value: VariableTracker, target: NumpyCall) -> VariableTracker:
    from .containers import ListVariable, TupleVariable
    from .tensor import TensorVariable

    if isinstance(value, TensorVariable):
        return NumpyNdarrayVariable(value, scalar=value.example_value.dim() == 0 and
                                    target.name not in _ARRAY_MAKERS)
    if isinstance(value, (ListVariable, TupleVariable)):
        items = [_wrap_result(tx, v, target) for v in value.items]
        return ListVariable(items) if isinstance(value, ListVariable) else TupleVariable(items)
    return value


def numpy_op(tx, target: NumpyCall, args: list[VariableTracker],
             kwargs: dict[str, VariableTracker]) -> VariableTracker:
    """One graph node running ``target`` on the arrays' tensors; tensors it returns are
    arrays again."""
    try:
        target.resolve()
    except AttributeError:
        raise Unsupported(f"{target!r}: torch._numpy does not have it") from None
    out = tx.output.create_graph_op("call_function", target, [_unwrap(tx, a) for a in args],
                                    {k: _unwrap(tx, v) for k, v in kwargs.items()},
                                    allow_constant_result=True)
    return _wrap_result(tx, out, target)


def has_array(args) -> bool:
    return any(isinstance(a, NumpyNdarrayVariable) for a in args)


def numpy_operator(tx, fn: Any, args: list[VariableTracker]) -> VariableTracker:
    """``a * 2``, ``a @ b``, ``-a``, ``a > 0`` with an array among the operands."""
    name = getattr(fn, "__name__", None)
    if name is None or getattr(operator, name, None) is not fn:
        raise Unsupported(f"{fn!r} on a NumPy array")
    return numpy_op(tx, NumpyCall.get("operator", name), list(args), {})


#: ndarray attributes fixed by the guards on the tensor holding the array (static shapes)
_CONSTANT_ATTRS = {
    "shape": lambda fake: tuple(fake.shape),
    "ndim": lambda fake: fake.dim(),
    "size": lambda fake: fake.numel(),
    "itemsize": lambda fake: fake.element_size(),
    "nbytes": lambda fake: fake.numel() * fake.element_size(),
    "dtype": lambda fake: np.dtype(str(fake.dtype).removeprefix("torch.")),
}
#: ndarray attributes that are arrays: one node each
_ARRAY_ATTRS = frozenset({"T", "real", "imag"})


@upper.provide
class NumpyNdarrayVariable(VariableTracker):
    """A NumPy array (or a NumPy scalar, ``scalar``): ``tensor`` (a TensorVariable) holds
    its data."""

    def __init__(self, tensor: VariableTracker, *, scalar: bool = False):
        super().__init__()
        self.tensor = tensor
        #: a 0-d result NumPy gives as a scalar (``np.mean(a)``): rebuilt as ``a[()]``
        self.scalar = scalar

    def children(self):
        return [self.tensor]

    def python_type(self) -> type:
        if self.scalar:
            return _CONSTANT_ATTRS["dtype"](self.tensor.example_value).type
        return np.ndarray

    def describe(self) -> str:
        return f"NumpyNdarrayVariable({self.tensor.describe()})"

    def truth_value(self, tx) -> bool:
        raise Unsupported("data-dependent branch on a NumPy array")

    def var_getattr(self, tx, name: str) -> VariableTracker:
        fake = self.tensor.example_value
        if name in _CONSTANT_ATTRS:
            from ... import shapes

            if shapes.is_symbolic(tuple(fake.shape)):
                raise Unsupported(f"ndarray.{name} of an array with symbolic sizes")
            value = _CONSTANT_ATTRS[name](fake)
            return ConstantVariable.create(value) if type(value) is tuple else \
                ConstantVariable(value)
        if name in _ARRAY_ATTRS:
            return numpy_op(tx, NumpyCall.get("attribute", name), [self], {})
        if not callable(getattr(np.ndarray, name, None)):
            raise Unsupported(f"ndarray attribute {name!r}")
        return NumpyMethodVariable(self, name)

    def call_method(self, tx, name, args, kwargs):
        return NumpyMethodVariable(self, name).call_function(tx, args, kwargs)

    def has_unpack_var_sequence(self, tx) -> bool:
        return self.tensor.example_value.dim() > 0

    def unpack_var_sequence(self, tx) -> list[VariableTracker]:
        n = self.tensor.example_value.shape[0]
        return [self.getitem(tx, ConstantVariable(i)) for i in range(n)]

    def len_value(self, tx) -> int:
        if self.tensor.example_value.dim() == 0:
            raise Unsupported("len() of a 0-d NumPy array")
        return int(self.tensor.example_value.shape[0])

    def getitem(self, tx, index: VariableTracker) -> VariableTracker:
        return numpy_op(tx, NumpyCall.get("method", "__getitem__"), [self, index], {})

    def setitem(self, tx, index: VariableTracker, value: VariableTracker) -> None:
        tx.output.create_graph_op("call_function", NumpyCall.get("method", "__setitem__"),
                                  [_unwrap(tx, self), _unwrap(tx, index), _unwrap(tx, value)],
                                  {}, mutation=True)

    def reconstruct(self, codegen) -> None:
        """The array of the graph's output tensor: ``Tensor.numpy(t)`` (shares memory)."""
        codegen.push_null()
        codegen.load_const_object(torch.Tensor.numpy)
        codegen(self.tensor)
        codegen.call_function(1)
        if self.scalar:
            codegen.load_const(())
            codegen.binary_subscr()


class NumpyMethodVariable(BoundMethodVariable):
    """``array.method`` loaded but not called yet."""

    owner_label = "ndarray"
    array = property(lambda self: self.obj, doc="the NumpyNdarrayVariable it is bound to")

    def call_function(self, tx, args, kwargs):
        if self.name in ("tolist", "item", "tobytes", "tofile", "dump", "dumps"):
            raise Unsupported(f"ndarray.{self.name}() leaves the graph")
        return numpy_op(tx, NumpyCall.get("method", self.name), [self.array, *args], kwargs)


def is_numpy_function(value: Any) -> bool:
    """A NumPy function or ufunc (``np.mean``, ``np.sin``, ``np.linalg.norm``)."""
    if np is None or isinstance(value, type):
        return False
    if isinstance(value, np.ufunc):
        return True
    module = getattr(value, "__module__", None) or ""
    return callable(value) and (module == "numpy" or module.startswith("numpy."))


class NumpyFunctionVariable(VariableTracker):
    """A NumPy function: called on arrays (or tensors, or constants) it is a graph node
    running torch._numpy's version (``NumpyCall``)."""

    def __init__(self, fn: Any, *, source=None):
        super().__init__(source=source)
        self.fn = fn

    @classmethod
    def wrap(cls, builder, value):
        builder.install_identity_guard(value, GuardKind.ID_MATCH, what="numpy function")
        return cls(value, source=builder.source)

    def as_python_constant(self) -> Any:
        return self.fn

    def python_type(self) -> type:
        return type(self.fn)

    def describe(self) -> str:
        return f"NumpyFunctionVariable({getattr(self.fn, '__name__', self.fn)})"

    def call_function(self, tx, args, kwargs):
        fn = self.fn
        name = getattr(fn, "__name__", None)
        module = "numpy" if isinstance(fn, np.ufunc) else fn.__module__
        if module.startswith("numpy.random"):
            raise Unsupported(f"numpy.random.{name}: random numbers are not captured")
        folded = _fold_on_constants(fn, args, kwargs)
        if folded is not None:
            return folded
        tnp_module = _TNP_MODULES.get(module)
        if name is None or tnp_module is None:
            raise Unsupported(f"{module}.{name}: not a NumPy function torch._numpy has")
        return numpy_op(tx, NumpyCall.get("function", name, tnp_module), list(args), kwargs)

    def reconstruct(self, codegen):
        self.reload_or_load(codegen, self.fn)


def _fold_on_constants(fn: Any, args, kwargs) -> VariableTracker | None:
    """``np.sqrt(16)`` on constants is the NumPy scalar NumPy gives, a constant (a 0-d array
    in the graph made ``tensor *= np.sqrt(d)`` an array, as transformers' CTRL does); None
    where an argument is not constant or the result is not a scalar."""
    from .numpy_values import NumpyScalarVariable

    try:
        cargs = [a.as_python_constant() for a in args]
        ckwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
    except NotConstant:
        return None
    if any(isinstance(a, (np.ndarray, torch.Tensor)) for a in [*cargs, *ckwargs.values()]):
        return None
    try:
        value = fn(*cargs, **ckwargs)
    except Exception:  # let the traced path report it
        return None
    return NumpyScalarVariable(value) if isinstance(value, np.generic) else None


@tracker_for(*((np.ndarray,) if np is not None else ()))
class NumpyArrayInputVariable:
    """An ndarray reached from the frame: the graph input ``torch.from_numpy(arr)``."""

    @classmethod
    def wrap(cls, builder, value):
        from ...sources import FromNumpySource
        from .misc import UserDefinedObjectVariable

        tensor = None
        if builder.source is not None and type(value) is np.ndarray and \
                value.dtype != object and value.dtype.isnative and value.flags.writeable:
            try:
                tensor = torch.from_numpy(value)
            except (TypeError, ValueError):
                tensor = None
        if tensor is None:  # an array torch cannot share: opaque (loading it still works;
            # using it is a graph break)
            return UserDefinedObjectVariable.wrap(builder, value)
        builder.install_guard(GuardKind.TYPE_MATCH, type(value))
        tensor_var = builder.child(FromNumpySource(builder.source))(tensor)
        return NumpyNdarrayVariable(tensor_var)


def tensor_from_array(tx, fn: Any, args: list[VariableTracker],
                      kwargs: dict[str, VariableTracker]) -> VariableTracker | None:
    """``torch.from_numpy(a)`` / ``torch.as_tensor(a)`` / ``torch.tensor(a)`` on an array:
    the tensor holding it (a copy for ``torch.tensor``); None when no array is involved."""
    if not args or not isinstance(tx.realize(args[0]), NumpyNdarrayVariable):
        return None
    array = tx.realize(args[0])
    if fn is torch.from_numpy:
        if len(args) != 1 or kwargs:
            raise Unsupported("torch.from_numpy with more than one argument")
        return array.tensor
    if fn is torch.tensor:
        if len(args) != 1 or set(kwargs) - {"dtype"}:
            raise Unsupported("torch.tensor(ndarray) with arguments other than dtype")
        copy = tx.output.create_graph_op("call_method", "clone", [array.tensor], {})
        if "dtype" not in kwargs:
            return copy
        return tx.output.create_graph_op("call_method", "to", [copy], {"dtype": kwargs["dtype"]})
    if fn is not torch.as_tensor:
        return None
    return tx.output.create_graph_op("call_function", fn, [array.tensor, *args[1:]], kwargs)
