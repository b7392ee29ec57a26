"""kiln-frontend: capture PyTorch programs frame by frame and hand FX graphs to a backend.

    import kiln_frontend

    @kiln_frontend.optimize("eager")          # or kiln_frontend.compile(fn, backend=...)
    def f(x, y):
        return x.sin() + y.cos()

Public API: ``optimize``, ``compile``, ``run``, ``disable``, ``reset``, ``explain``,
``list_backends``, ``register_backend``, ``lookup_backend``, ``config``, ``Unsupported``.
See docs/frontend-api.md.

The names are loaded on first use (PEP 562), so ``import kiln_frontend.bytecode`` needs
neither torch nor the compiled ``_evalframe`` extension.
"""

from __future__ import annotations

from typing import Any

from . import config

__version__ = "0.1.0"

_LAZY = {
    "optimize": ("api", "optimize"),
    "compile": ("api", "compile"),
    "run": ("api", "run"),
    "disable": ("api", "disable"),
    "reset": ("api", "reset"),
    "OptimizedModule": ("api", "OptimizedModule"),
    "list_backends": ("backends", "list_backends"),
    "register_backend": ("backends", "register_backend"),
    "lookup_backend": ("backends", "lookup_backend"),
    "InvalidBackend": ("backends", "InvalidBackend"),
    "Unsupported": ("exc", "Unsupported"),
    "BackendCompilerFailed": ("exc", "BackendCompilerFailed"),
    "explain": ("explain", "explain"),
    "ExplainOutput": ("explain", "ExplainOutput"),
    "mark_dynamic": ("shapes", "mark_dynamic"),
    "mark_static": ("shapes", "mark_static"),
}

__all__ = ["config", *_LAZY]

def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'kiln_frontend' has no attribute {name!r}")
    import importlib

    module_name, attr = target
    try:
        module = importlib.import_module(f".{module_name}", __name__)
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{module_name}":
            raise
        raise AttributeError(
            f"kiln_frontend.{name} is not available yet (no module kiln_frontend.{module_name})"
        ) from e
    value = getattr(module, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
