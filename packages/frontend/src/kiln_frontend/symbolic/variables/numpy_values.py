"""NumPy scalars (``np.float32(2.0)``, a global ``np.int64``): constants guarded by value
(CONSTANT_MATCH: type and ``==``).  In a graph they are the Python number they equal, so the
generated graph code never names ``np`` (it did: ``NameError: name 'np' is not defined``).
NumPy is optional (torch does not require it): without it nothing is registered."""

from __future__ import annotations

from ...exc import Unsupported
from .base import NotConstant, tracker_for
from .constant import ConstantVariable

try:
    import numpy as np
except ImportError:  # pragma: no cover - NumPy is not installed
    np = None


class NumpyScalarVariable(ConstantVariable):
    def as_proxy(self):
        return self.value.item()

    def as_example(self):
        return self.value.item()

    def reconstruct(self, codegen) -> None:
        codegen.load_const_object(self.value)

    def describe(self) -> str:
        return f"NumpyScalarVariable({self.value!r})"


if np is not None:
    tracker_for(np.generic)(NumpyScalarVariable)


def is_numpy_scalar_class(cls) -> bool:
    return np is not None and isinstance(cls, type) and issubclass(cls, np.generic)


def construct_numpy_scalar(tx, cls, args, kwargs):
    """``np.float32(2.0)`` on constants."""
    try:
        cargs = [a.as_python_constant() for a in args]
        ckwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
    except NotConstant:
        raise Unsupported(f"numpy.{cls.__name__}() with non-constant arguments") from None
    value = cls(*cargs, **ckwargs)
    if not isinstance(value, np.generic):
        raise Unsupported(f"numpy.{cls.__name__}() made a {type(value).__name__}")
    return NumpyScalarVariable(value)
