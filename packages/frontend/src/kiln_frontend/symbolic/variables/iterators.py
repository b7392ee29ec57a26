"""Lazy iterators: generators, ``map``, ``filter``, ``zip``, ``enumerate``.

Each produces an item only when asked (``next_item``), so what producing it does (a
generator's body, a ``map`` function) runs where eager runs it: ``lst.extend(gen)`` whose
generator reads ``lst`` sees the items appended so far, ``any(gen)`` stops at the first true
item, ``next(m)`` on a ``map`` calls its function once."""

from __future__ import annotations

import types

from ...bytecode import BytecodeError, make_generator_resume_code
from ...exc import Unsupported
from ...layers import upper
from .base import BoundMethodVariable, VariableTracker
from .constant import ConstantVariable
from .containers import IteratorVariable, TupleVariable
from .exceptions import as_exception
from .handler_table import builtin_handler
from .misc import NullVariable
from .raising import TracedException, raise_traced


class GeneratorVariable(IteratorVariable):
    """A generator made by calling an inlined generator function: an inlining translator
    paused before its first instruction, run to its next ``yield`` per item; ``send``,
    ``throw`` and ``close`` resume it as CPython does (a value for the paused ``yield``, an
    exception raised at it)."""

    def __init__(self, gen_tx, fn_var: VariableTracker, args: list[VariableTracker],
                 kwargs: dict[str, VariableTracker]):
        super().__init__()
        self.gen_tx = gen_tx
        self.fn_var = fn_var
        self.args = list(args)
        self.kwargs = dict(kwargs)
        self.started = False
        self.finished = False
        self.paused_in_except = False
        #: what the body returned (``StopIteration.value``, ``yield from``'s result)
        self.return_value: VariableTracker = ConstantVariable(None)

    def python_type(self) -> type:
        return types.GeneratorType

    def children(self):
        if self.finished:
            return []
        if self.started:  # what rebuilding it paused passes in (``reconstruct``)
            if not getattr(self.gen_tx, "paused_at_yield", False):
                return []
            gen_tx = self.gen_tx
            return [self.fn_var, *gen_tx.stack,
                    *(gen_tx.symbolic_locals[n] for n in gen_tx.live_locals(gen_tx.ip))]
        return [self.fn_var, *self.args, *self.kwargs.values()]

    def next_item(self, tx) -> VariableTracker | None:
        return self.resume(tx)

    def resume(self, tx, sent: VariableTracker | None = None,
               exc: VariableTracker | None = None) -> VariableTracker | None:
        """Run the body to its next ``yield`` (``sent`` the paused ``yield``'s value, or
        ``exc`` raised at it): the yielded value, or None once the body returned
        (``return_value``). An exception escaping the body finishes the generator."""
        from .generator_ctx import resume_generator, throw_into_generator

        if self.finished:
            if exc is not None:
                raise TracedException(exc)
            return None
        started, self.started = self.started, True
        handling = len(_handled(tx))
        try:
            if exc is not None:
                value = throw_into_generator(self.gen_tx, exc, started)
            else:
                value = resume_generator(self.gen_tx, sent)
        except TracedException as e:
            self.finished = True  # a generator that raised is finished
            if issubclass(e.exc.cls, StopIteration):  # PEP 479
                raise_traced(RuntimeError, "generator raised StopIteration")
            raise
        except BaseException:
            self.finished = True
            raise
        if value is None:
            self.finished = True
            self.return_value = getattr(self.gen_tx, "return_value", None) or \
                ConstantVariable(None)
        #: paused inside an except body (more exceptions handled than when resumed)
        self.paused_in_except = value is not None and len(_handled(tx)) > handling
        return value

    def var_getattr(self, tx, name):
        if name in _GENERATOR_METHODS:
            return GeneratorMethodVariable(self, name)
        raise Unsupported(f"attribute {name!r} of a generator made while tracing")

    def reconstruct(self, codegen):
        if self.finished:
            codegen.build_tuple(0)
            codegen.get_iter()
            return
        if self.started:
            self._reconstruct_paused(codegen)
            return
        if self.kwargs:
            raise Unsupported("a generator with keyword arguments cannot be rebuilt")
        # not started: nothing of its body ran, so calling the function again is the same
        codegen.push_null()
        codegen(self.fn_var)
        for a in self.args:
            codegen(a)
        codegen.call_function(len(self.args))

    def _reconstruct_paused(self, codegen) -> None:
        """A generator paused at a ``yield`` rebuilt as a new generator of a continuation
        of its code (``make_generator_resume_code``) taking its stack and live locals,
        started once so that it is paused where this one is."""

        gen_tx = self.gen_tx
        code = gen_tx.code
        if not getattr(gen_tx, "paused_at_yield", False):
            raise Unsupported("a generator that is running cannot be rebuilt")
        if code.co_cellvars:
            # (torch.compile runs such a frame as is too: capturing it would make a graph
            # torch.compile does not)
            raise Unsupported("a paused generator with cell variables cannot be rebuilt")
        if self.paused_in_except:
            # its exception state is the generator's own (sys.exc_info(), a bare raise),
            # which a rebuilt one would not have
            raise Unsupported("a generator paused inside an except block cannot be rebuilt")
        live = gen_tx.live_locals(gen_tx.ip)
        stack_vars = [None if isinstance(v, NullVariable) else f"___kiln_gen_stack_{i}"
                      for i, v in enumerate(gen_tx.stack)]
        try:
            resume_code = make_generator_resume_code(
                code, gen_tx.instructions[gen_tx.ip - 1], stack_vars, live, code.co_name,
                qualname=code.co_qualname)
        except BytecodeError as e:
            raise Unsupported(f"cannot rebuild a paused generator: {e}") from e
        codegen.push_null()
        codegen.load_const_object(rebuilt_generator)
        codegen(self.fn_var)  # (its globals and closure cells)
        codegen.load_const_object(resume_code)
        # (paused in `yield from`: the delegate is the stack value below the yield; the
        # copied RESUME marks the pause as a delegation, so throw()/close() reach it)
        values = [v for v in gen_tx.stack if not isinstance(v, NullVariable)]
        values += [gen_tx.symbolic_locals[n] for n in live]
        for v in values:
            codegen(v)
        codegen.call_function(2 + len(values))

    def describe(self) -> str:
        return f"GeneratorVariable({self.fn_var.describe()})"


def rebuilt_generator(fn, code: types.CodeType, *args):
    """A generator of ``code`` (``make_generator_resume_code``'s, for the generator
    function ``fn``: its globals, closure, name) called with ``args`` and run to its own
    first yield, of None: it is then paused where the original generator was."""
    fn = getattr(fn, "__func__", fn)
    rebuilt = types.FunctionType(code, fn.__globals__, fn.__name__, None, fn.__closure__)
    rebuilt.__qualname__ = fn.__qualname__
    gen = rebuilt(*args)
    next(gen)
    return gen


def _handled(tx) -> list:
    """The exceptions the trace handles now (``handlers.exceptions.handled_exceptions``:
    one stack on the root translator)."""
    return getattr(tx.root(), "handled_exceptions", [])


_GENERATOR_METHODS = ("send", "throw", "close", "__next__", "__iter__")


def finishing_value(gen: GeneratorVariable, was_finished: bool) -> VariableTracker:
    """The ``StopIteration.value`` a resume of ``gen`` raises: what its body returned when
    this resume finished it, None when it was already finished (CPython's)."""
    return ConstantVariable(None) if was_finished else gen.return_value


def stop_iteration(value: VariableTracker) -> TracedException:
    """``StopIteration(value)`` as the traced code sees it (``e.value``)."""
    from .exceptions import ExceptionVariable

    exc = ExceptionVariable(StopIteration, [] if _is_none(value) else [value])
    exc.var_getattr = _stop_iteration_getattr(exc, value)
    return TracedException(exc)


def _stop_iteration_getattr(exc, value: VariableTracker):
    """``e.value`` of a StopIteration a generator's ``return`` raised: what it returned."""
    base = exc.var_getattr

    def var_getattr(tx, name):
        return value if name == "value" else base(tx, name)

    return var_getattr


def _is_none(v: VariableTracker) -> bool:
    return isinstance(v, ConstantVariable) and v.value is None


class GeneratorMethodVariable(BoundMethodVariable):
    """``gen.send`` / ``gen.throw`` / ``gen.close`` / ``gen.__next__`` of a traced
    generator."""

    owner_label = "generator"
    gen = property(lambda self: self.obj, doc="the GeneratorVariable it is bound to")

    def call_function(self, tx, args, kwargs):
        gen, name = self.gen, self.name
        if kwargs:
            raise Unsupported(f"generator.{name} with keyword arguments")
        if name == "__iter__" and not args:
            return gen
        if name in ("send", "__next__"):
            if len(args) != (1 if name == "send" else 0):
                raise Unsupported(f"generator.{name} with {len(args)} arguments")
            sent = tx.realize(args[0]) if args else ConstantVariable(None)
            if not gen.started and not _is_none(sent):
                raise_traced(TypeError, "can't send non-None value to a just-started generator")
            was_finished = gen.finished
            value = gen.resume(tx, sent if gen.started else None)
            if value is None:
                raise stop_iteration(finishing_value(gen, was_finished))
            return value
        if name == "throw" and len(args) == 1:
            was_finished = gen.finished
            value = gen.resume(tx, exc=as_exception(tx, args[0]))
            if value is None:
                raise stop_iteration(finishing_value(gen, was_finished))
            return value
        if name == "close" and not args:
            return close_generator(tx, gen)
        raise Unsupported(f"generator.{name} with {len(args)} arguments")


def close_generator(tx, gen: GeneratorVariable) -> VariableTracker:
    """``gen.close()``: GeneratorExit raised at the paused ``yield``; the body may run its
    ``finally``/``except GeneratorExit`` but must not yield again."""
    from .exceptions import ExceptionVariable

    if not gen.started or gen.finished:
        gen.started = gen.finished = True
        return ConstantVariable(None)
    try:
        value = gen.resume(tx, exc=ExceptionVariable(GeneratorExit, []))
    except TracedException as e:
        if issubclass(e.exc.cls, GeneratorExit):
            return ConstantVariable(None)
        raise
    if value is not None:
        raise_traced(RuntimeError, "generator ignored GeneratorExit")
    return ConstantVariable(None)


def pending_cleanup(gen: GeneratorVariable) -> bool:
    """Whether dropping ``gen`` runs code: paused at a ``yield`` inside ``try``/``finally``
    or ``with`` (CPython closes a dropped generator: GeneratorExit at that yield), or
    delegating with ``yield from`` to a generator that is."""
    if not gen.started or gen.finished or not getattr(gen.gen_tx, "paused_at_yield", False):
        return False
    gen_tx = gen.gen_tx
    entry = gen_tx.instructions[gen_tx.ip - 1].exn_tab_entry
    # 3.12+ covers the yield inside `yield from` with the delegation's own handler
    # (CLEANUP_THROW): what covers that handler is the user's code around `yield from`
    while entry is not None and entry.target.opname == "CLEANUP_THROW":
        entry = entry.target.exn_tab_entry
    # (3.12+ wraps a generator's body in a handler turning StopIteration into RuntimeError)
    if entry is not None and entry.target.opname != "CALL_INTRINSIC_1":
        return True
    return any(isinstance(v, GeneratorVariable) and pending_cleanup(v) for v in gen_tx.stack)


def _reachable(tx, roots: list[VariableTracker]) -> set[int]:
    """ids of the trackers reachable from ``roots``, from every live translator's locals
    and stack (up the inlining chain), and from what paused generators hold."""
    seen: set[int] = set()
    pending = list(roots)
    t = tx
    while t is not None:
        pending += list(t.symbolic_locals.values()) + list(t.stack)
        t = t.parent
    while pending:
        v = pending.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        pending += v.children()
        realized = getattr(v, "realized", None)
        if realized is not None:
            pending.append(realized)
        if isinstance(v, GeneratorVariable):
            pending += list(v.gen_tx.symbolic_locals.values()) + list(v.gen_tx.stack)
    return seen


def close_dropped_generators(tx, roots: list[VariableTracker], *,
                             only: GeneratorVariable | None = None,
                             frame_end: bool = False) -> None:
    """Close (``close_generator``, traced here) each generator with a pending cleanup
    that nothing reaches any more, as CPython does when its last reference goes. At the
    frame's end its own locals no longer count; two or more such generators would run
    their cleanups in an order this cannot know: a graph break (the frame runs as is).
    What the cleanup raises is dropped, as CPython's unraisable hook does."""
    candidates = [only] if only is not None else list(tx.output.generators)
    candidates = [g for g in candidates if pending_cleanup(g)]
    if not candidates:
        return
    if frame_end:
        seen: set[int] = set()
        pending = list(roots)
        while pending:  # only what the return value and the side effects hold
            v = pending.pop()
            if id(v) not in seen:
                seen.add(id(v))
                pending += v.children()
    else:
        seen = _reachable(tx, roots)
    dropped = [g for g in candidates if id(g) not in seen]
    if len(dropped) > 1:
        raise Unsupported(f"{len(dropped)} generators paused inside try/finally or with "
                          "are dropped together")
    for gen in dropped:
        try:
            close_generator(tx, gen)
        except TracedException:
            pass  # CPython reports it to sys.unraisablehook; it is not raised


class _BuiltinIterator(IteratorVariable):
    """A builtin iterator over other iterators: rebuilt as ``cls(*parts)``."""

    cls: type = object

    def __init__(self, parts: list[VariableTracker]):
        super().__init__()
        self.parts = parts
        self.exhausted = False

    def python_type(self) -> type:
        return self.cls

    def children(self):
        return list(self.parts)

    def reconstruct(self, codegen):
        codegen.push_null()
        codegen.load_const_object(self.cls)
        for p in self.parts:
            codegen(p)
        codegen.call_function(len(self.parts))

    def describe(self) -> str:
        return f"{type(self).__name__}({len(self.parts)})"


class MapVariable(_BuiltinIterator):
    """``map(fn, *iterables)``."""

    cls = map

    def next_item(self, tx):
        if self.exhausted:
            return None
        fn, *its = self.parts
        items = []
        for it in its:
            item = it.next_item(tx)
            if item is None:
                self.exhausted = True
                return None
            items.append(item)
        return tx.call_function(fn, items, {})


class FilterVariable(_BuiltinIterator):
    """``filter(fn, iterable)`` (``fn`` None: the items' truth)."""

    cls = filter

    def next_item(self, tx):
        fn, it = self.parts
        while not self.exhausted:
            item = it.next_item(tx)
            if item is None:
                self.exhausted = True
                return None
            none = fn.is_python_constant() and fn.as_python_constant() is None
            keep = item if none else tx.call_function(fn, [item], {})
            if tx.realize(keep).truth_value(tx):
                return item
        return None


def _arguments(n: int) -> str:
    return "argument 1" if n == 1 else f"arguments 1-{n}"


class ZipVariable(_BuiltinIterator):
    """``zip(*iterables, strict=...)``: an item from each, left to right; with ``strict``
    unequal lengths raise ValueError where eager does."""

    cls = zip

    def __init__(self, parts, strict: bool):
        super().__init__(parts)
        self.strict = strict

    def next_item(self, tx):
        if self.exhausted or not self.parts:
            return None
        items = []
        for i, it in enumerate(self.parts):
            item = it.next_item(tx)
            if item is None:
                self.exhausted = True
                if self.strict:
                    self._check_strict(tx, i)
                return None
            items.append(item)
        return TupleVariable(items)

    def _check_strict(self, tx, i: int) -> None:
        if i > 0:
            raise_traced(ValueError, f"zip() argument {i + 1} is shorter than "
                                     f"{_arguments(i)}")
        for j, it in enumerate(self.parts[1:], start=1):
            if it.next_item(tx) is not None:
                raise_traced(ValueError, f"zip() argument {j + 1} is longer than "
                                         f"{_arguments(j)}")

    def reconstruct(self, codegen):
        if self.strict:
            raise Unsupported("rebuilding zip(..., strict=True)")
        super().reconstruct(codegen)


class EnumerateVariable(_BuiltinIterator):
    """``enumerate(iterable, start)``."""

    cls = enumerate

    def __init__(self, it: VariableTracker, start: int):
        super().__init__([it])
        self.count = start

    def next_item(self, tx):
        item = None if self.exhausted else self.parts[0].next_item(tx)
        if item is None:
            self.exhausted = True
            return None
        self.count += 1
        return TupleVariable([ConstantVariable(self.count - 1), item])

    def reconstruct(self, codegen):
        codegen.push_null()
        codegen.load_const_object(enumerate)
        codegen(self.parts[0])
        codegen.load_const(self.count)
        codegen.call_function(2)


def _register_consumers() -> None:
    """``set(it)`` / ``frozenset(it)`` of a traced iterator (a generator expression...):
    its items are produced one by one, as eager consumes it, then the builtin folds over
    them like over a tuple (constants; anything else stays a graph break)."""
    def consume(fn):
        def handler(tx, args, kwargs):
            if kwargs or len(args) != 1:
                return None
            it = tx.realize(args[0])
            if not isinstance(it, IteratorVariable):
                return None
            items = [tx.realize(v) for v in it.unpack_var_sequence(tx)]
            return upper.BuiltinVariable(fn).call_function(tx, [TupleVariable(items)], {})

        return handler

    for fn in (set, frozenset):
        builtin_handler(fn)(consume(fn))


_register_consumers()
