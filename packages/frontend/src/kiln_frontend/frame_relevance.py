"""Which frames are worth tracing at all: those that can touch torch.

A frame none of whose arguments or closure cells holds a tensor, an ``nn.Module`` (or a
module class) or a NumPy array, and whose code names no torch or NumPy module among its
globals, can make no graph worth having; torch.compile skips such a frame for good
without tracing it (``has_tensor_in_frame``), and so does kiln. Tracing it anyway would
give an empty graph whose constant guards (an ``int`` argument) recompile at every new
value until ``cache_size_limit``. The root of what the user compiled is always traced
(``eval_frame.add_root_code``), whatever it is called with.
"""

from __future__ import annotations

import sys
import types
from typing import Any

#: containers looked into (exact types, as torch.compile does: a subclass may hide state)
_CONTAINERS = (list, tuple, dict)
_ATOMS = (str, int, float, bool, complex, bytes, type(None))


def _is_torch_module(obj: Any) -> bool:
    name = getattr(obj, "__name__", None)
    return isinstance(name, str) and (name == "torch" or name.startswith("torch.")
                                      or name == "numpy" or name.startswith("numpy."))


def _holds_tensor(obj: Any, seen: set[int]) -> bool:
    import torch

    if id(obj) in seen:
        return False
    seen.add(id(obj))
    kind = type(obj)
    if kind in _ATOMS:
        return False
    if isinstance(obj, (torch.Tensor, torch.nn.Module)) or (
            kind is type and issubclass(obj, torch.nn.Module)):
        return True
    numpy = sys.modules.get("numpy")
    if numpy is not None and (kind is numpy.ndarray or isinstance(obj, numpy.generic)):
        return True
    if kind in (list, tuple):
        return any(_holds_tensor(v, seen) for v in obj)
    if kind is dict:
        return any(_holds_tensor(v, seen) for v in list(obj.values()))
    if isinstance(obj, tuple) and hasattr(kind, "_fields"):  # a namedtuple
        return any(_holds_tensor(v, seen) for v in obj)
    return False


def may_use_torch(frame: Any) -> bool:
    """Can this not-yet-run frame (``.code``, ``.globals``, ``.args``, ``.closure``) touch
    torch? See the module docstring for the rule."""
    globals_ = frame.globals
    if isinstance(globals_, dict):
        for name in frame.code.co_names:
            obj = globals_.get(name)
            if isinstance(obj, types.ModuleType) and _is_torch_module(obj):
                return True
    seen: set[int] = set()
    if any(_holds_tensor(v, seen) for v in frame.args):
        return True
    for cell in frame.closure or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if _holds_tensor(value, seen):
            return True
    return False


__all__ = ["may_use_torch"]
