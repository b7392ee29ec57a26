"""``torch.func.functional_call(module, params, args)``: the module's forward traced with
some of its parameters and buffers replaced by the given values.

torch swaps the module's state in and out around the call (``torch.nn.utils.stateless``,
``setattr`` on live modules); tracing that swap would record mutations of the module.
Here the swap is symbolic: while the call is traced, reads of the named parameters and
buffers give the given trackers (``OutputGraph.state_overrides``) and torch's leaf modules
are inlined rather than called as ``call_module`` nodes (which would bake the real weights
in).  The module itself is never mutated, so there is nothing to undo or to guard beyond
what reading the module already guards."""

from __future__ import annotations

import inspect
from typing import Any

from ...exc import Unsupported
from ...layers import upper
from .base import VariableTracker, constant_or_break


def _signature_of_functional_call(module, parameter_and_buffer_dicts, args=None, kwargs=None,
                                  *, tie_weights=True, strict=False):
    """The signature ``torch.func.functional_call`` and ``stateless.functional_call`` share."""


_SIGNATURE = inspect.signature(_signature_of_functional_call)


def _constant(v: VariableTracker | None, what: str, default: Any) -> Any:
    if v is None:
        return default
    return constant_or_break(v, f"functional_call with a non-constant {what}")


def _dict_items(tx, v: VariableTracker) -> list[tuple[str, VariableTracker]]:
    from .containers import ConstDictVariable

    v = tx.realize(v)
    if isinstance(v, ConstDictVariable):
        out = []
        for k, item in v.items.items():
            if not isinstance(k, str):
                raise Unsupported(f"functional_call with a non-string key {k!r}")
            out.append((k, tx.realize(item)))
        return out
    if v.has_unpack_var_sequence(tx):  # a tuple/list of dicts, merged (torch refuses a
        # name given twice)
        merged: list[tuple[str, VariableTracker]] = []
        for d in v.unpack_var_sequence(tx):
            merged.extend(_dict_items(tx, d))
        names = [k for k, _ in merged]
        dup = sorted({k for k in names if names.count(k) > 1})
        if dup:
            raise Unsupported(f"functional_call with {dup} in more than one dict")
        return merged
    raise Unsupported(f"functional_call with parameters given as {v.describe()}")


def _tied_names(module) -> dict[str, list[str]]:
    """name -> every name of the same tensor in ``module`` (itself included)."""
    by_id: dict[int, list[str]] = {}
    for name, t in [*module.named_parameters(remove_duplicate=False),
                    *module.named_buffers(remove_duplicate=False)]:
        if t is not None:
            by_id.setdefault(id(t), []).append(name)
    return {name: names for names in by_id.values() for name in names}


def _owner_and_attr(module, name: str) -> tuple[Any, str]:
    prefix, _, attr = name.rpartition(".")
    try:
        owner = module.get_submodule(prefix) if prefix else module
    except AttributeError:
        raise Unsupported(f"functional_call: no submodule {prefix!r}") from None
    if attr not in owner.__dict__.get("_parameters", {}) and \
            attr not in owner.__dict__.get("_buffers", {}):
        raise Unsupported(f"functional_call: {name!r} is not a parameter or buffer of the "
                          "module (torch would set a new attribute)")
    return owner, attr


def functional_call(tx, args: list[VariableTracker], kwargs: dict[str, VariableTracker]):
    """The handler of ``torch.func.functional_call`` (a TORCH_SPECIAL_FUNCTIONS entry)."""
    from .constant import ConstantVariable
    from .containers import TupleVariable

    try:
        bound = _SIGNATURE.bind(*args, **kwargs)
    except TypeError as e:
        raise Unsupported(f"functional_call: {e}") from None
    a = bound.arguments
    module_var = tx.realize(a["module"])
    if not isinstance(module_var, upper.NNModuleVariable):
        raise Unsupported(f"functional_call on {module_var.describe()}, not a module")
    module = module_var.module
    tie_weights = _constant(a.get("tie_weights"), "tie_weights", True)
    strict = _constant(a.get("strict"), "strict", False)
    given = _dict_items(tx, a["parameter_and_buffer_dicts"])
    tied = _tied_names(module)
    overrides: dict[tuple[int, str], VariableTracker] = {}
    given_names = {k for k, _ in given}
    for name, value in given:
        names = tied.get(name, [name]) if tie_weights else [name]
        others = [n for n in names if n != name and n in given_names]
        if others and any(dict(given)[n] is not value for n in others):
            raise Unsupported(f"functional_call: tied tensors {sorted(names)} given different "
                              "values")
        for n in names:
            owner, attr = _owner_and_attr(module, n)
            overrides[(id(owner), attr)] = value
    if strict:
        expected = set(tied)
        if given_names != expected:
            raise Unsupported("functional_call(strict=True) with missing or unexpected keys")
    call_args = a.get("args")
    if call_args is None:
        call_args = TupleVariable([])
    call_args = tx.realize(call_args)
    if isinstance(call_args, TupleVariable):
        positional = list(call_args.items)
    else:  # a single argument that is not a tuple
        positional = [call_args]
    call_kwargs = a.get("kwargs")
    if call_kwargs is None or (call_kwargs.is_python_constant() and
                               call_kwargs.as_python_constant() is None):
        keyword: dict[str, VariableTracker] = {}
    else:
        keyword = dict(_dict_items(tx, call_kwargs))
    with tx.output.overriding_module_state(overrides):
        out = tx.call_function(module_var, positional, keyword)
    return out if out is not None else ConstantVariable(None)
