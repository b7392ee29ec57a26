"""Loads and stores: locals, constants, globals, cells, attributes."""

from __future__ import annotations

from ...exc import Unsupported
from ..registry import handler
from ..variables import ConstantVariable, NullVariable
from ..variables.misc import DeletedVariable, GetAttrVariable, LazyVariable, SavedCellVariable
from ..variables.raising import TracedException


@handler("LOAD_FAST", "LOAD_FAST_CHECK", versions=((3, 11), (3, 12)))
def LOAD_FAST(tx, inst):
    _load_fast(tx, inst.argval)


@handler("LOAD_FAST", "LOAD_FAST_CHECK", versions=(3, 13))
def LOAD_FAST_313(tx, inst):
    """3.13 loads a cell for a closure with LOAD_FAST of its slot (3.11/3.12: LOAD_CLOSURE)."""
    if _is_cell_slot(tx, inst.argval) and inst.argval not in tx.plain_slots:
        tx.push(tx.load_closure(inst.argval))
    else:
        _load_fast(tx, inst.argval)


def _is_cell_slot(tx, name: str) -> bool:
    return name in tx.fresh_cells or _is_cell_variable(tx, name)


def _is_cell_variable(tx, name: str) -> bool:
    return name in tx.code.co_cellvars or name in tx.code.co_freevars


@handler("LOAD_FAST_LOAD_FAST", versions=(3, 13))
def LOAD_FAST_LOAD_FAST(tx, inst):
    first, second = inst.argval
    _load_fast(tx, first)
    _load_fast(tx, second)


@handler("STORE_FAST_LOAD_FAST", versions=(3, 13))
def STORE_FAST_LOAD_FAST(tx, inst):
    first, second = inst.argval
    _store_fast(tx, first)
    _load_fast(tx, second)


@handler("STORE_FAST_STORE_FAST", versions=(3, 13))
def STORE_FAST_STORE_FAST(tx, inst):
    first, second = inst.argval
    _store_fast(tx, first)
    _store_fast(tx, second)


def _load_fast(tx, name: str) -> None:
    value = tx.symbolic_locals.get(name)
    if value is None or isinstance(value, DeletedVariable):
        raise Unsupported(f"UnboundLocalError: local variable {name!r} read before assignment")
    if isinstance(value, LazyVariable):
        value = value.realize(tx)
        tx.symbolic_locals[name] = value
    tx.push(value)


@handler("LOAD_FAST_AND_CLEAR", versions=((3, 12), (3, 13)))
def LOAD_FAST_AND_CLEAR(tx, inst):
    name = inst.argval
    value = tx.symbolic_locals.pop(name, None)
    if isinstance(value, LazyVariable):
        value = value.realize(tx)
    value = value if value is not None else DeletedVariable()
    if _is_cell_variable(tx, name) and name not in tx.fresh_cells and \
            name not in tx.plain_slots:
        value = SavedCellVariable(value)  # (the slot held the function's cell)
    tx.push(value)


@handler("STORE_FAST")
def STORE_FAST(tx, inst):
    _store_fast(tx, inst.argval)


def _store_fast(tx, name: str) -> None:
    value = tx.pop()
    tx.fresh_cells.pop(name, None)  # the slot holds a value again, not that cell
    if isinstance(value, SavedCellVariable):  # the function's cell put back
        tx.plain_slots.discard(name)
        value = value.value
    elif _is_cell_variable(tx, name):
        tx.plain_slots.add(name)
    if isinstance(value, DeletedVariable):
        tx.symbolic_locals.pop(name, None)
    else:
        tx.symbolic_locals[name] = value


@handler("DELETE_FAST")
def DELETE_FAST(tx, inst):
    if inst.argval not in tx.symbolic_locals:
        raise Unsupported(f"UnboundLocalError: cannot delete {inst.argval!r}")
    del tx.symbolic_locals[inst.argval]


@handler("LOAD_CONST")
def LOAD_CONST(tx, inst):
    tx.push(ConstantVariable.create(inst.argval))


@handler("LOAD_GLOBAL", versions=((3, 11), (3, 12)))
def LOAD_GLOBAL(tx, inst):
    value = tx.load_global(inst.argval)
    if (inst.arg or 0) & 1:
        tx.push(NullVariable())
    tx.push(value)


@handler("LOAD_GLOBAL", versions=(3, 13))
def LOAD_GLOBAL_313(tx, inst):
    """3.13: the NULL of a call goes above the callable."""
    tx.push(tx.load_global(inst.argval))
    if (inst.arg or 0) & 1:
        tx.push(NullVariable())


@handler("STORE_GLOBAL")
def STORE_GLOBAL(tx, inst):
    # replayed after the graph (symbolic/side_effects.py)
    tx.output.side_effects.store_global(tx, inst.argval, tx.realize(tx.pop()))


@handler("DELETE_GLOBAL")
def DELETE_GLOBAL(tx, inst):
    raise Unsupported(f"deleting global {inst.argval!r}")


@handler("MAKE_CELL", "COPY_FREE_VARS")
def MAKE_CELL(tx, inst):
    # cells are modelled by name: a cell variable lives in the symbolic locals; a
    # MAKE_CELL after the prologue (3.12's inlined comprehension) makes a new cell
    if inst.opname == "MAKE_CELL" and _after_prologue(tx):
        from ..variables.misc import FreshCellVariable

        value = tx.symbolic_locals.pop(inst.argval, None)
        if isinstance(value, LazyVariable):
            value = value.realize(tx)
        if isinstance(value, DeletedVariable):
            value = None
        tx.fresh_cells[inst.argval] = FreshCellVariable(inst.argval, value)


def _after_prologue(tx) -> bool:
    """The running instruction comes after the code's RESUME."""
    for i in range(tx.ip - 1):
        if tx.instructions[i].opname == "RESUME":
            return True
    return False


@handler("LOAD_DEREF")
def LOAD_DEREF(tx, inst):
    value = tx.load_deref(inst.argval)
    if isinstance(value, LazyVariable):
        value = value.realize(tx)
        if inst.argval in tx.symbolic_locals:
            tx.symbolic_locals[inst.argval] = value
    tx.push(value)


@handler("STORE_DEREF")
def STORE_DEREF(tx, inst):
    tx.store_deref(inst.argval, tx.pop())


@handler("DELETE_DEREF")
def DELETE_DEREF(tx, inst):
    raise Unsupported("deleting a cell variable")


@handler("LOAD_CLOSURE")
def LOAD_CLOSURE(tx, inst):
    tx.push(tx.load_closure(inst.argval))


def _load_attr(tx, obj, name):
    try:
        return tx.getattr(obj, name)
    except TracedException:
        raise  # the lookup raised (AttributeError...): in the traced code, where eager does
    except Unsupported as e:
        if not _may_defer(tx):
            raise
        return GetAttrVariable(tx.realize(obj), name, e)


def _may_defer(tx) -> bool:
    """Whether a lookup that cannot be traced may run later, where its value is used
    (GetAttrVariable): not when the value is dropped (``o.attr`` run for its effect or its
    AttributeError), nor inside a ``try`` here or in a caller being traced (the lookup's
    exception would escape the handler that eager runs it under)."""
    following = tx.instructions[tx.ip] if tx.ip < len(tx.instructions) else None
    if following is not None and following.opname == "POP_TOP":
        return False
    t = tx
    while t is not None:
        inst = t.current_inst
        if inst is not None and getattr(inst, "exn_tab_entry", None) is not None:
            return False
        t = t.parent
    return True


@handler("LOAD_ATTR", versions=(3, 11))
def LOAD_ATTR_311(tx, inst):
    obj = tx.pop()
    tx.push(_load_attr(tx, obj, inst.argval))


@handler("LOAD_ATTR", versions=(3, 12))
def LOAD_ATTR_312(tx, inst):
    obj = tx.pop()
    value = _load_attr(tx, obj, inst.argval)
    if (inst.arg or 0) & 1:
        # method form: [NULL, bound attribute] is equivalent to [method, self] for CALL
        tx.push(NullVariable())
    tx.push(value)


@handler("LOAD_ATTR", versions=(3, 13))
def LOAD_ATTR_313(tx, inst):
    obj = tx.pop()
    tx.push(_load_attr(tx, obj, inst.argval))
    if (inst.arg or 0) & 1:
        # method form: [bound attribute, NULL] is equivalent to [method, self] for CALL
        tx.push(NullVariable())


@handler("LOAD_METHOD", versions=(3, 11))
def LOAD_METHOD(tx, inst):
    obj = tx.pop()
    value = _load_attr(tx, obj, inst.argval)
    tx.push(NullVariable())
    tx.push(value)


@handler("STORE_ATTR")
def STORE_ATTR(tx, inst):
    obj = tx.realize(tx.pop())
    value = tx.realize(tx.pop())
    store = getattr(obj, "store_attr", None)
    if store is None:  # an object from the frame: replayed after the graph
        return tx.output.side_effects.store_attr(tx, obj, inst.argval, value)
    store(tx, inst.argval, value)


@handler("DELETE_ATTR")
def DELETE_ATTR(tx, inst):
    tx.output.side_effects.delete_attr(tx, tx.realize(tx.pop()), inst.argval)


def _super_attr(tx, inst):
    from ..variables.functions import SuperVariable

    obj = tx.realize(tx.pop())
    cls = tx.realize(tx.pop())
    tx.pop()  # the global ``super``
    try:
        klass = cls.as_python_constant()
    except Exception:  # noqa: BLE001
        raise Unsupported("super() with a non-constant class") from None
    return tx.getattr(SuperVariable(klass, obj), inst.argval)


@handler("LOAD_SUPER_ATTR", versions=(3, 12))
def LOAD_SUPER_ATTR(tx, inst):
    value = _super_attr(tx, inst)
    if (inst.arg or 0) & 1:
        tx.push(NullVariable())
    tx.push(value)


@handler("LOAD_SUPER_ATTR", versions=(3, 13))
def LOAD_SUPER_ATTR_313(tx, inst):
    """3.13: the method form's NULL goes above the attribute."""
    tx.push(_super_attr(tx, inst))
    if (inst.arg or 0) & 1:
        tx.push(NullVariable())


def _imported(name: str):
    import sys

    module = sys.modules.get(name)
    if module is None:
        raise Unsupported(f"import of {name!r}, which is not imported yet (it would run code)")
    return module


@handler("IMPORT_NAME")
def IMPORT_NAME(tx, inst):
    """``import a.b`` / ``from a import b`` of modules already in ``sys.modules``."""
    import importlib.util

    fromlist = tx.realize(tx.pop()).as_python_constant()
    level = tx.realize(tx.pop()).as_python_constant()
    name = inst.argval
    if level:
        package = tx.f_globals.get("__package__") or tx.f_globals.get("__name__", "")
        name = importlib.util.resolve_name("." * level + name, package)
    module = _imported(name)
    if not fromlist and "." in name:
        module = _imported(name.partition(".")[0])  # ``import a.b`` binds ``a``
    # pinned, so that what the frame reads from it (``math.sqrt``) is guarded
    tx.push(tx.wrap_value(module, tx.output.pinned_source(module)))


@handler("IMPORT_FROM")
def IMPORT_FROM(tx, inst):
    import types

    module_var = tx.realize(tx.peek())
    module = module_var.as_python_constant()
    if not isinstance(module, types.ModuleType):
        raise Unsupported("IMPORT_FROM on a non-module")
    if hasattr(module, inst.argval):
        tx.push(tx.getattr(module_var, inst.argval))
    else:
        sub = _imported(f"{module.__name__}.{inst.argval}")
        tx.push(tx.wrap_value(sub, tx.output.pinned_source(sub)))
