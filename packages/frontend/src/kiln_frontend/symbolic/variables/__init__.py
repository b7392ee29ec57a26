"""Variable trackers: one class per kind of Python value the symbolic interpreter follows.

Importing this package imports every tracker module, which registers each tracker with
``@tracker_for`` and each name lower layers reach with ``@upper.provide`` (kiln_frontend/layers.py;
some modules are imported by no lower one, e.g. ``distributed``)."""

from . import (  # noqa: F401
    attributes,
    autograd_function,
    builder,
    builtins,
    constant,
    containers,
    ctx_managers,
    deepcopy,
    distributed,
    exceptions,
    functional_call,
    functions,
    generator_ctx,
    iterators,  # (registers set()/frozenset() of an iterator)
    itertools_vars,  # (registers itertools/operator constructors)
    misc,
    model_output,
    nn_module,
    numpy_arrays,
    numpy_values,
    operators,
    raising,
    stdlib,
    tensor,
    tensor_data,
    tensor_select,
    tensor_subclass,
    torch,
)
from .base import NotConstant, VariableTracker, lookup_tracker, registered_types, tracker_for
from .builder import VariableBuilder
from .builtins import BuiltinVariable
from .constant import ConstantVariable
from .containers import (
    ConstDictVariable,
    ListIteratorVariable,
    ListVariable,
    SliceVariable,
    TupleVariable,
)
from .functions import (
    NestedUserFunctionVariable,
    UserFunctionVariable,
    UserMethodVariable,
)
from .misc import (
    ClosureCellVariable,
    DeletedVariable,
    LazyVariable,
    LocalCellVariable,
    NullVariable,
    UserDefinedClassVariable,
    UserDefinedObjectVariable,
)
from .nn_module import NNModuleVariable
from .numpy_arrays import NumpyNdarrayVariable  # (registers nothing without NumPy)
from .numpy_values import NumpyScalarVariable  # (registers nothing without NumPy)
from .stdlib import LruCacheFunctionVariable
from .tensor import TensorMethodVariable, TensorVariable
from .torch import PythonModuleVariable, TorchFunctionVariable

__all__ = [
    "NotConstant",
    "VariableTracker",
    "VariableBuilder",
    "tracker_for",
    "lookup_tracker",
    "registered_types",
    "ConstantVariable",
    "ConstDictVariable",
    "ListIteratorVariable",
    "ListVariable",
    "SliceVariable",
    "TupleVariable",
    "BuiltinVariable",
    "NestedUserFunctionVariable",
    "UserFunctionVariable",
    "UserMethodVariable",
    "ClosureCellVariable",
    "DeletedVariable",
    "LazyVariable",
    "LocalCellVariable",
    "NullVariable",
    "UserDefinedClassVariable",
    "UserDefinedObjectVariable",
    "NNModuleVariable",
    "NumpyNdarrayVariable",
    "NumpyScalarVariable",
    "LruCacheFunctionVariable",
    "TensorMethodVariable",
    "TensorVariable",
    "PythonModuleVariable",
    "TorchFunctionVariable",
]
