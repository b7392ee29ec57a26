"""The frontend's layers, and ``upper``: how a lower layer reaches a name of a higher one.

Modules import downward only (no import cycle, module-level or inside a function; checked by
tests-integration/test_import_layering.py and tests/test_import_layers.py).  Bottom to top:

1. foundations: ``config``, ``exc``, ``logging_utils``, ``sources``, ``guards``,
   ``bytecode/``, ``trace_rules``, this module;
2. trackers, in ``TRACKER_LAYERS`` order: ``symbolic.variables.base`` first, then each
   tracker module above the ones it builds on (``shapes`` holds ``SymNodeVariable``);
3. ``symbolic.hops.*`` (the higher-order operators' entries; their registry, ``hops``'s
   ``__init__``, imports only ``base`` and is used by the trackers), then ``symbolic.codegen``,
   ``symbolic.side_effects``, ``symbolic.output_graph``;
4. ``symbolic.handlers`` (opcode handlers), then ``symbolic.translator``;
5. ``convert``, ``eval_frame``, ``api``.

Python values nest both ways (a constant tuple is a ``TupleVariable`` of constants; ``len``
of a list is a constant), so a tracker sometimes builds or recognises a tracker defined
above it.  It names it through ``upper`` (``upper.TupleVariable([...])``), as JAX's core
reaches rules that higher modules register: the defining module registers the name with
``@upper.provide`` when it is imported (``kiln_frontend.symbolic`` imports every layer before
anything is traced).  A name registered twice is refused; a name nobody registered raises
``LookupError`` naming it.  Trackers reach the translator and code generator through the
``tx`` and ``codegen`` objects they are handed, never by import.
"""

from __future__ import annotations

from typing import Any

#: the tracker modules (``kiln_frontend.`` omitted), bottom to top: each imports only the
#: ones before it (tests/test_import_layers.py checks it)
TRACKER_LAYERS: tuple[str, ...] = (
    "symbolic.variables.base",
    "symbolic.variables.constant",
    "symbolic.variables.raising",
    "symbolic.variables.containers",
    "symbolic.variables.numpy_values",
    "shapes",
    "symbolic.variables.autograd_function",
    "symbolic.variables.tensor",
    "symbolic.variables.attributes",
    "symbolic.variables.functional_call",
    "symbolic.variables.model_output",
    "symbolic.variables.ctx_managers",
    "symbolic.variables.misc",
    "symbolic.variables.numpy_arrays",
    "symbolic.variables.deepcopy",
    "symbolic.variables.exceptions",
    "symbolic.variables.operators",
    "symbolic.variables.distributed",
    "symbolic.variables.generator_ctx",
    "symbolic.variables.torch",
    "symbolic.variables.iterators",
    "symbolic.variables.functions",
    "symbolic.variables.builder",
    "symbolic.variables.stdlib",
    "symbolic.variables.itertools_vars",
    "symbolic.variables.nn_module",
    "symbolic.variables.builtins",
)


class UpperNames:
    """Names defined in a higher layer, registered by their module when it is imported."""

    def __init__(self) -> None:
        self._names: dict[str, Any] = {}

    def provide(self, obj: Any = None, *, name: str | None = None) -> Any:
        """Register ``obj`` under ``name`` (default: its ``__name__``); usable as a
        decorator.  Returns ``obj``."""
        if obj is None:
            return lambda o: self.provide(o, name=name)
        key = name or obj.__name__
        old = self._names.get(key)
        if old is not None and old is not obj:
            raise ValueError(f"upper.{key} registered twice: by {_where(old)} and {_where(obj)}")
        self._names[key] = obj
        return obj

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy/pickle/inspect probes: plain attribute errors
            raise AttributeError(name)
        try:
            return self._names[name]
        except KeyError:
            raise LookupError(
                f"upper.{name} is not registered: the module that defines it has not been "
                f"imported (kiln_frontend.symbolic imports them all) or does not "
                f"@upper.provide it") from None

    def registered(self) -> dict[str, Any]:
        return dict(self._names)


def _where(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


#: the one table of late-bound names (see the module docstring)
upper = UpperNames()
