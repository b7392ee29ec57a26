"""``convert_frame``: what the eval-frame callback calls for a frame it has not seen.

It runs the symbolic interpreter over the frame's bytecode (restarting when a graph break
has to happen at an earlier instruction than where the problem showed), compiles the graph
with the backend, assembles the transformed code and builds the guard check function.

A failure of kiln itself in any of these steps (anything but ``Unsupported`` and
``BackendCompilerFailed``) becomes an ``InternalError`` naming the step and the user's
frame: it is printed on ``kiln.internal_errors`` as kiln's bug, told to the observers, and
the frame runs eagerly (raised instead when ``config.suppress_errors`` is off).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import time
import traceback
import types
from collections.abc import Callable
from typing import Any

import torch.fx

from . import config
from .bytecode import assemble
from .collector import user_heap_frozen
from .exc import InternalError, KilnError, Unsupported
from .guards import Guard, GuardKind, build_check_fn
from .logging_utils import INTERNAL_ERRORS, counters, emit
from .symbolic import (
    InstructionTranslator,
    RefusalRestart,
    RequiresGradRestart,
    RestartAnalysis,
)
from .symbolic.translator import num_argument_slots

log = logging.getLogger("kiln.capture")

_GEN_FLAGS = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
              | inspect.CO_ITERABLE_COROUTINE)

#: graph breaks one frame may need before we give up on it
MAX_RESTARTS = 16


@dataclasses.dataclass
class CompiledFrame:
    """One cache entry: ``check_fn(*args)`` says whether ``fn(*args)`` may run instead of
    the frame (``args``: the frame's argument slots, positional, keyword-only, ``*args``,
    ``**kwargs``)."""

    check_fn: Callable[..., bool]
    fn: types.FunctionType
    graphs: list[torch.fx.GraphModule]
    code: types.CodeType
    #: the graph break taken in this frame (at most one: the rest runs in resume functions)
    graph_breaks: list[Unsupported] = dataclasses.field(default_factory=list)
    #: names of the globals installed in the frame's globals (compiled fns, resume fns)
    installed_globals: list[str] = dataclasses.field(default_factory=list)
    #: the frame made no graph: ``fn`` is the frame's own bytecode, kept under guards so a
    #: call that fails them (other types, a tensor where there was none) is traced anew
    runs_as_is: bool = False

    @property
    def guards(self) -> list[Guard]:
        return list(self.check_fn.guards)  # type: ignore[attr-defined]


#: callables told about every frame ``convert_frame`` looks at:
#: ``observer(frame_info, compiled, reason, seconds)``: ``compiled`` is the CompiledFrame or
#: None, ``reason`` (an ``Unsupported``, a string or None) says why a frame was not
#: captured, ``seconds`` how long converting took; ``explain()`` uses this
observers: list[Callable[[Any, CompiledFrame | None, Any, float], None]] = []


def _notify(frame_info: Any, compiled: CompiledFrame | None, reason: Any,
            seconds: float) -> None:
    for observer in list(observers):
        observer(frame_info, compiled, reason, seconds)


def convert_frame(frame_info: Any, *, compiler_fn: Callable, nopython: bool,
                  frame_state: dict | None = None,
                  dynamic: bool | None = None) -> CompiledFrame | None:
    """Capture ``frame_info`` (``.code``, ``.func``, ``.globals``, ``.builtins``, ``.args``,
    ``.closure``).  Returns None when there is nothing worth compiling (or, without
    ``nopython``, when the frame cannot be captured at all); raises ``exc.Unsupported`` with
    ``nopython`` when a graph break would be needed, and ``exc.BackendCompilerFailed`` when
    the backend fails.  ``dynamic``: True (symbolic sizes everywhere), False (static
    sizes), None (automatic: sizes that changed since the last compile are symbolic; it
    reads and updates ``frame_state``).  See shapes.py."""
    reasons: list[Any] = []
    start = time.perf_counter()
    try:
        try:
            # (collector.py: gen-2 collections scan the compile's objects)
            with user_heap_frozen(), _user_saved_tensors_hooks_set_aside():
                compiled = _convert_frame(frame_info, compiler_fn, nopython, frame_state,
                                          dynamic, reasons)
        except KilnError:
            raise
        except Exception as e:  # a bug of ours outside the steps that name their phase
            raise InternalError(_frame_name(frame_info.code), "compiling", e) from e
    except InternalError as e:
        _report_internal_error(e)
        if observers:
            _notify(frame_info, None, e, time.perf_counter() - start)
        if not config.suppress_errors:
            raise
        return None
    except Exception as e:
        if observers:
            _notify(frame_info, None, e, time.perf_counter() - start)
        raise
    if observers:
        _notify(frame_info, compiled, reasons[-1] if reasons else None,
                time.perf_counter() - start)
    return compiled


@contextlib.contextmanager
def _user_saved_tensors_hooks_set_aside():
    """The user's saved-tensor hooks (``torch.utils.checkpoint``, ``save_on_cpu()``) do not
    see what capturing and compiling save: those are fake tensors, not the program's."""
    prior = torch._C._autograd._saved_tensors_hooks_set_tracing(True)
    try:
        yield
    finally:
        torch._C._autograd._saved_tensors_hooks_set_tracing(prior)


def _frame_name(code: types.CodeType, tracer: InstructionTranslator | None = None) -> str:
    """``qualname (file:line)``: the line being traced when known, else the def line."""
    inst = getattr(tracer, "current_inst", None)
    line = getattr(inst, "lineno", None) or code.co_firstlineno
    return f"{code.co_qualname} ({code.co_filename}:{line})"


def _report_internal_error(error: InternalError) -> None:
    """One log line on kiln.internal_errors, always printed (the traceback with
    KILN_VERBOSE / KILN_DEBUG): the frame runs eagerly, so nothing else would say so."""
    from .debug_print import debug_enabled

    counters["internal_errors"] += 1
    message = f"{error} The frame runs eagerly."
    if config.verbose or debug_enabled():
        message += "\n" + "".join(traceback.format_exception(error.inner))
    emit(INTERNAL_ERRORS, message, show=True)


def _verify_guards(check_fn: Callable[..., bool], frame_info: Any,
                   code: types.CodeType) -> None:
    """A fresh entry's guards must pass on the inputs it was traced with: tracing does not
    run the frame, so a guard failing here can never pass (an identity guard on an object
    that is new at every access) and would recompile on every call.  That is kiln's bug:
    the frame runs eagerly, with the failing guard named."""
    args = getattr(frame_info, "args", None)
    if args is None or check_fn(*args):
        return
    reason = check_fn.failure_reason(*args)  # type: ignore[attr-defined]
    raise InternalError(_frame_name(code), "verifying the guards of",
                        AssertionError(f"a guard fails on the inputs it was compiled for: "
                                       f"{reason}"))


def _convert_frame(frame_info: Any, compiler_fn: Callable, nopython: bool,
                   frame_state: dict | None, dynamic: bool | None,
                   reasons: list[Any]) -> CompiledFrame | None:
    from .shapes import NeedsShapeEnv, shape_checks

    code: types.CodeType = frame_info.code
    if code.co_flags & _GEN_FLAGS:
        if nopython:
            raise Unsupported(f"{code.co_filename}:{code.co_firstlineno}: generators and "
                              f"coroutines are not captured ({code.co_name})")
        reasons.append(f"{code.co_filename}:{code.co_firstlineno}: generators and "
                       f"coroutines are not captured ({code.co_name})")
        return None
    if frame_state is not None:
        frame_state.setdefault("compiles", 0)
        frame_state["compiles"] += 1

    break_points: dict[int, Unsupported] = {}
    tracer: InstructionTranslator | None = None
    use_shape_env = dynamic is True
    refuse_requires_grad_ = False
    refused: frozenset[str] = frozenset()
    for _attempt in range(MAX_RESTARTS + 1):
        tracer = InstructionTranslator(frame_info, compiler_fn=compiler_fn, nopython=nopython,
                                       break_points=break_points, dynamic=dynamic,
                                       frame_state=frame_state, use_shape_env=use_shape_env,
                                       refuse_requires_grad_=refuse_requires_grad_,
                                       refused=refused)
        try:
            tracer.run()
        except NeedsShapeEnv:
            if use_shape_env:  # pragma: no cover - cannot happen twice
                raise
            use_shape_env = True
            continue
        except RequiresGradRestart as restart:
            if refuse_requires_grad_:  # pragma: no cover - would loop
                reasons.append(restart.reason)
                return None
            log.debug("graph break in %s: %s", code.co_name, restart.reason)
            refuse_requires_grad_ = True
            continue
        except RefusalRestart as restart:
            if restart.feature in refused:  # pragma: no cover - would loop
                reasons.append(restart.reason)
                return None
            log.debug("graph break in %s: %s", code.co_name, restart.reason)
            refused = refused | {restart.feature}
            continue
        except RestartAnalysis as restart:
            if restart.index in break_points:  # pragma: no cover - would loop
                log.debug("not capturing %s: %s", code.co_name, restart.reason)
                reasons.append(restart.reason)
                return None
            log.debug("graph break in %s: %s", code.co_name, restart.reason)
            break_points[restart.index] = restart.reason
            continue
        except Unsupported as e:
            if nopython:
                raise
            log.debug("not capturing %s: %s", code.co_name, e)
            reasons.append(e)
            return None
        except KilnError:
            raise
        except Exception as e:
            raise InternalError(_frame_name(code, tracer), "tracing", e) from e
        break
    else:
        log.debug("not capturing %s: too many graph breaks", code.co_name)
        reasons.append(f"too many graph breaks in {code.co_qualname}")
        return None

    assert tracer is not None
    nslots = num_argument_slots(code)
    flags = code.co_flags & ~(inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    runs_as_is = tracer.output_instructions is None
    if runs_as_is and not nopython:
        # no op traced: skipped for good, as torch.compile does (its SkipFrame); only a
        # fullgraph compile keeps the frame under guards (below)
        reasons.append(f"no op traced in {code.co_qualname}")
        return None
    if runs_as_is:
        # no graph under fullgraph: as torch.compile does, a guarded entry runs the frame's
        # own bytecode (a copy taking the argument slots: the hook needs a code of its
        # own), so a later call that fails the guards (a tensor where a constant was) is
        # traced again instead of the code being skipped for good
        new_code = code.replace(co_argcount=nslots, co_posonlyargcount=0,
                                co_kwonlyargcount=0, co_flags=flags)
    else:
        try:
            new_code = assemble(tracer.output_instructions, code, co_argcount=nslots,
                                co_posonlyargcount=0, co_kwonlyargcount=0, co_flags=flags)
        except Exception as e:  # BytecodeError: the generated code does not build
            raise InternalError(_frame_name(code), "assembling the bytecode of", e) from e
    fn = types.FunctionType(new_code, frame_info.globals, code.co_name, None,
                            frame_info.closure)
    fn.__qualname__ = code.co_qualname
    fn.__kwdefaults__ = None
    if tracer.output.shape_state is not None:
        for check in shape_checks(tracer.output.shape_state):
            tracer.output.guards.add(Guard(None, GuardKind.SHAPE_ENV, check))
    try:
        check_fn = build_check_fn(tracer.output.guards, tracer.arg_names, frame_info.globals,
                                  name=f"check_{code.co_name}" if code.co_name.isidentifier()
                                  else "check")
    except Exception as e:
        raise InternalError(_frame_name(code), "building the guards of", e) from e
    _verify_guards(check_fn, frame_info, code)
    from .debug_print import debug_enabled, print_frame

    if debug_enabled():
        print_frame(code, new_code, check_fn.guards)  # type: ignore[attr-defined]
    return CompiledFrame(
        check_fn=check_fn,
        fn=fn,
        graphs=list(tracer.output.graphs),
        code=new_code,
        graph_breaks=list(tracer.graph_breaks),
        installed_globals=list(tracer.output.installed_globals),
        runs_as_is=runs_as_is,
    )


__all__ = ["CompiledFrame", "convert_frame"]
