"""``@contextlib.contextmanager`` context managers (issue 10).

``with cm(...) as v:`` where ``cm`` is a generator function wrapped by
``contextlib.contextmanager``: entering runs the inlined generator up to its ``yield`` (``v``
is the yielded value), leaving runs it on to its end, exactly where Python runs each part.
The generator is an inlining translator paused at its ``yield`` (``inline_call(...,
suspended=True)``).  A graph break inside the block cannot rebuild a paused generator, so
the whole ``with`` block then runs in Python."""

from __future__ import annotations

import contextlib

from ...exc import Unsupported
from ...layers import upper
from .base import VariableTracker
from .ctx_managers import ContextExitVariable, ContextManagerVariable
from .deepcopy import register_python_function


def resume_generator(gen_tx, sent: VariableTracker | None = None) -> VariableTracker | None:
    """Run a paused generator translator to its next ``yield`` (``sent``: what the paused
    ``yield`` evaluates to, None by default): the yielded value, or None when it
    returned."""
    from .constant import ConstantVariable

    if getattr(gen_tx, "paused_at_yield", False):
        gen_tx.paused_at_yield = False
        gen_tx.push(sent if sent is not None else ConstantVariable(None))
    return _run_to_yield(gen_tx)


def _run_to_yield(gen_tx) -> VariableTracker | None:
    before = len(gen_tx.yielded)
    gen_tx.done = False
    gen_tx.run()
    if len(gen_tx.yielded) > before:
        return gen_tx.yielded[-1]
    return None


def throw_into_generator(gen_tx, exc, started: bool) -> VariableTracker | None:
    """``gen.throw(exc)``: ``exc`` raised at the paused ``yield`` (at the start of a
    generator not started yet), to the body's handler for it, then on to the next
    ``yield``; with no handler it propagates (TracedException)."""
    from .raising import TracedException

    error = TracedException(exc)
    if not started or not getattr(gen_tx, "paused_at_yield", False):
        raise error
    at = gen_tx.instructions[gen_tx.ip - 1]  # the YIELD_VALUE it is paused after
    if gen_tx.ip >= 2 and gen_tx.instructions[gen_tx.ip - 2].opname == "SEND":
        raise Unsupported("throw()/close() into a generator paused in `yield from`")
    gen_tx.paused_at_yield = False
    if not gen_tx.jump_to_handler(at, error):
        raise error
    return _run_to_yield(gen_tx)


class GeneratorContextVariable(ContextManagerVariable):
    """``contextlib._GeneratorContextManager(func, args, kwds)`` made while tracing."""

    def __init__(self, func: VariableTracker, args: list[VariableTracker],
                 kwargs: dict[str, VariableTracker]):
        super().__init__()
        self.func = func
        self.args = list(args)
        self.kwargs = dict(kwargs)
        self.gen_tx = None

    @classmethod
    def construct(cls, tx, klass, args, kwargs):
        if kwargs or len(args) != 3:
            return None
        func, fargs, fkwargs = (tx.realize(a) for a in args)
        from .containers import ConstDictVariable

        if not isinstance(fkwargs, ConstDictVariable):
            return None
        special = _special_generator_contexts().get(getattr(func, "fn", None))
        if special is not None:  # torch's own: graph nodes, not its generator's code
            return special(tx, tx.unpack_sequence(fargs), dict(fkwargs.items))
        return cls(func, tx.unpack_sequence(fargs), dict(fkwargs.items))

    def children(self):
        return [self.func, *self.args, *self.kwargs.values()]

    def enter(self, tx) -> VariableTracker:
        if self.gen_tx is not None:
            raise Unsupported("entering a @contextmanager object twice")
        if not hasattr(self.func, "get_code"):
            raise Unsupported(f"@contextmanager of {self.func.describe()}")
        self.gen_tx = tx.inline_call(self.func, self.args, self.kwargs, suspended=True)
        value = resume_generator(self.gen_tx)
        if value is None:
            raise Unsupported("@contextmanager generator didn't yield")
        return value

    def exit(self, tx) -> None:
        if self.gen_tx is None:
            raise Unsupported("leaving a @contextmanager object that was not entered")
        if resume_generator(self.gen_tx) is not None:
            raise Unsupported("@contextmanager generator didn't stop")

    def exit_on_exception(self, tx, exc) -> bool:
        """``gen.throw(exc)`` at the paused ``yield``, as ``_GeneratorContextManager``'s
        ``__exit__`` does: suppressed (True) when the generator handles it and stops; not
        (False) when it propagates unchanged (a ``finally`` runs on the way)."""
        from .exceptions import ExceptionVariable
        from .raising import TracedException

        exc = tx.realize(exc) if exc is not None else None
        gen_tx = self.gen_tx
        if gen_tx is None or not isinstance(exc, ExceptionVariable):
            raise Unsupported("throwing into a @contextmanager generator")
        at = gen_tx.instructions[gen_tx.ip - 1]
        if at.opname != "YIELD_VALUE" or (
                gen_tx.ip >= 2 and gen_tx.instructions[gen_tx.ip - 2].opname == "SEND"):
            raise Unsupported("throwing into a @contextmanager generator not paused at its "
                              "own yield")
        gen_tx.paused_at_yield = False
        if not gen_tx.jump_to_handler(at, TracedException(exc)):
            return False  # no handler around the yield: it propagates as it is
        try:
            if resume_generator(gen_tx) is not None:
                raise Unsupported("@contextmanager generator didn't stop after throw()")
        except TracedException as e:
            if e.exc is exc:
                return False  # re-raised (a finally ran): not suppressed
            raise
        return True

    def undo_real(self) -> None:
        pass  # nothing real was switched: the generator's effects are traced

    def call_function(self, tx, args, kwargs):
        """``@cm(...)`` on a function (``ContextDecorator.__call__``): the function that
        runs each call inside a fresh manager of the same generator function."""
        if len(args) != 1 or kwargs or self.gen_tx is not None:
            raise Unsupported(f"call to {self.describe()}")
        return ContextDecoratedFunctionVariable(self, tx.realize(args[0]))

    def python_type(self) -> type:
        return contextlib._GeneratorContextManager

    def reconstruct(self, codegen):
        raise Unsupported("a @contextmanager generator paused at its yield cannot be rebuilt")

    def describe(self) -> str:
        name = getattr(getattr(self.func, "fn", None), "__qualname__", "?")
        return f"GeneratorContextVariable({name})"


class ContextDecoratedFunctionVariable(VariableTracker):
    """A function decorated in the frame with a ``@contextmanager`` manager object: each
    call is ``with cm._recreate_cm(): return fn(...)`` (``ContextDecorator.inner``), a new
    manager of the same generator function and arguments, entered around the inlined call;
    an exception from the call is thrown into the generator, and when it is suppressed the
    call returns None, as ``inner`` does."""

    def __init__(self, cm: GeneratorContextVariable, fn: VariableTracker):
        super().__init__()
        self.cm = cm
        self.fn = fn

    def children(self):
        return [self.cm, self.fn]

    def call_function(self, tx, args, kwargs):
        from .constant import ConstantVariable
        from .raising import TracedException

        fresh = GeneratorContextVariable(self.cm.func, self.cm.args, self.cm.kwargs)
        fresh.enter(tx)
        try:
            result = tx.call_function(self.fn, list(args), dict(kwargs))
        except TracedException as e:
            if fresh.exit_on_exception(tx, e.exc):
                return ConstantVariable(None)
            raise
        fresh.exit(tx)
        return result

    def reconstruct(self, codegen):
        raise Unsupported("cannot rebuild a function decorated with a @contextmanager object "
                          "in the frame")

    def describe(self) -> str:
        return f"ContextDecoratedFunctionVariable({self.fn.describe()})"


def _special_generator_contexts() -> dict:
    """``@contextmanager`` generator functions of torch captured as graph nodes (their
    bodies switch global flags through C calls): generator function -> factory(tx, args,
    kwargs)."""
    if not _SPECIAL:
        import torch.nn.attention as attention

        from .ctx_managers import SdpaKernelVariable

        _SPECIAL[attention.sdpa_kernel.__wrapped__] = SdpaKernelVariable.create
    return _SPECIAL


_SPECIAL: dict = {}


def _through_class_slot(name: str):
    """``_GeneratorContextManager.<name>(cm, ...)`` called through the class (what
    ``ExitStack.enter_context`` does: ``type(cm).__enter__(cm)``, then ``__exit__`` bound
    with ``types.MethodType``): on a manager made while tracing it is the tracker's own
    enter/exit; on a real one, contextlib's code inlined as before."""
    fn = getattr(contextlib._GeneratorContextManager, name)

    def handler(tx, args, kwargs):
        cm = tx.realize(args[0]) if args else None
        if isinstance(cm, GeneratorContextVariable) and not kwargs:
            if name == "__enter__" and len(args) == 1:
                return cm.enter(tx)
            if name == "__exit__" and len(args) == 4:
                return ContextExitVariable(cm).call_function(tx, args[1:], {})
        return tx.inline_call(upper.UserFunctionVariable(fn), args, kwargs)

    register_python_function(fn, handler)


_through_class_slot("__enter__")
_through_class_slot("__exit__")
