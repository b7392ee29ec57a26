"""The Python side of kiln's PEP 523 hook: the callback that `optimize` installs.

The C extension (`kiln_frontend._evalframe`) calls ``CompileCallback.__call__(frame_info)`` for
a frame whose code has no matching cache entry.  The callback

1. returns None (the frame runs as is and its code is marked "skip") for frames we never
   capture: code in torch, kiln_frontend or another kiln package, the standard library
   (``config.skip_stdlib``), FX-generated code (``<eval_with_key>``) and ``__compiled_fn*``
   -- except the *capture roots* (``add_capture_root``: the code of what the user compiled,
   e.g. torch's ``Sequential.forward``); each skip is counted, logged on ``kiln.skips``
   (printed under ``config.debug``) with its reason and told to ``skip_observers``. Code
   ``exec``'d for such a module (a torch dataclass's ``__init__``) is skipped with it. Torch's
   own compiler (``trace_rules.TORCH_COMPILER_SOURCES``) and the wrapper ``torch.compile``
   made are marked SKIP_TREE: they and their callees run unseen, as torch compiled them;
2. returns False (run this frame as is, no skip mark) for a call under a torch.func
   transform (vmap, grad, ...): a later plain call of the same code still compiles;
3. returns None, after one warning naming the function, once the code already has
   ``config.cache_size_limit`` entries (the frame runs eagerly from then on, until ``reset``);
4. on a guard miss with existing entries, logs why (logger ``kiln.recompiles``; printed with
   ``config.log_recompiles`` / ``KILN_LOGS=recompiles``) from the old entries'
   ``check_fn.failure_reason(*args)``;
5. calls ``convert_frame(frame_info, compiler_fn=..., nopython=..., frame_state=...,
   dynamic=...)`` and returns ``(compiled.check_fn, compiled.fn)`` or None.

Errors: ``Unsupported`` under nopython propagates to the user's call.  Anything else
(``BackendCompilerFailed`` included) warns once per code and returns None (eager) while
``config.suppress_errors`` is true; otherwise it propagates.

Test seam: ``convert_frame_fn`` (module attribute). None means "use
``kiln_frontend.convert.convert_frame``"; tests may set it to any function with the same
signature returning None or, like ``convert.CompiledFrame``, an object with ``.check_fn`` and
``.fn``.

Also here: ``run_without_hook(fn)`` (a C callable that runs ``fn`` with this thread's hook
off; compiled graphs are wrapped with it), ``hook(callback)`` (a context manager that installs
a callback for the current thread), ``on_reset(fn)`` (register state to clear in
``kiln_frontend.reset()``) and ``counters``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import sysconfig
import traceback
import weakref
from collections.abc import Callable, Iterator
from types import CodeType
from typing import Any

from . import config
from .exc import Unsupported
from .frame_relevance import may_use_torch
from .logging_utils import RECOMPILES, SKIPS, counters, emit, reset_warnings, warn_once

try:
    from . import _evalframe as _C
except ImportError as e:  # pragma: no cover - only without a built extension
    raise ImportError(
        "kiln_frontend's C extension _evalframe is not built. Install the package with "
        "`pip install ./packages/frontend` (or `pip install -e`), or build it in place with "
        "`python packages/frontend/hatch_build.py --inplace`."
    ) from e
from .direct_entry import direct_call  # noqa: E402 - needs the extension checked above

set_eval_frame = _C.set_eval_frame
get_eval_frame = _C.get_eval_frame
skip_code = _C.skip_code
unskip_code = _C.unskip_code
is_skipped = _C.is_skipped
skip_code_tree = _C.skip_code_tree
cache_entries = _C.cache_entries
clear_cache = _C.clear_cache
TensorGuard = _C.TensorGuard
FrameInfo = _C.FrameInfo
with_callback = _C.with_callback

#: Test seam: replaces kiln_frontend.convert.convert_frame when not None.
convert_frame_fn: Callable[..., Any] | None = None



def run_without_hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Return a callable that calls ``fn`` with this thread's eval-frame hook off.

    Implemented in C (no Python frame of its own); compiled graphs installed as
    ``__compiled_fn_<n>`` globals are wrapped with it.  ``.__wrapped__`` is ``fn``.
    """
    return _C.run_without_hook(fn)


_TORCH_RULE_APPLIED: list[bool] = []


def _skip_what_torch_keeps_from_dynamo() -> None:
    """What torch tells TorchDynamo not to trace into (``torch._disable_dynamo``) runs as
    plain Python under kiln too, with everything it calls: the forward and the recomputation
    of ``torch.utils.checkpoint`` (a region compiled in the forward but recomputed eagerly in
    the backward saves other tensors, and checkpoint refuses the mismatch), a dispatch mode's
    ``__torch_dispatch__``, optimizer internals. Every such function is a closure of one
    wrapper code object; marking it is a standing rule (kept across ``reset()``), and a
    kiln-compiled call inside still compiles, as inside ``kiln.disable``. Applied at the first
    frame the callback sees once torch is imported (kiln_frontend itself needs no torch),
    which is before any frame the user's compiled code calls."""
    _TORCH_RULE_APPLIED.append(True)
    import torch

    skip_code_tree(torch._disable_dynamo(lambda: None).__code__)


def _disables_compilation_below(func: Any) -> bool:
    """Is ``func`` the wrapper ``@torch.compiler.disable`` made (recursive, the default)? The
    decorator marks the function object it returns; its frame and what it calls then run as
    plain Python under kiln too, as the user asked of torch.compile."""
    return getattr(func, "_torchdynamo_disable", False) is True and \
        getattr(func, "_torchdynamo_disable_recursive", False) is True


def _runs_torch_compiler(frame: Any) -> bool:
    """Is this frame torch's own compiler (``trace_rules.TORCH_COMPILER_SOURCES``), or the
    wrapper ``torch.compile`` made (it carries ``_torchdynamo_orig_callable``; an
    ``OptimizedModule``'s forward is one)? Then it and everything it calls run as plain
    Python, never seen by kiln: a ``torch.compile``'d callee runs as torch compiled it, with
    TorchDynamo's own eval-frame callback, and kiln traces none of torch's compiler. The one
    exception is ``torch.compiler.disable(recursive=False)``'s wrapper: what it calls is
    still compiled."""
    func = frame.func
    if getattr(func, "_torchdynamo_disable", False) is True and \
            getattr(func, "_torchdynamo_disable_recursive", True) is False:
        return False
    if getattr(func, "_torchdynamo_orig_callable", None) is not None:
        return True
    from .trace_rules import in_torch_compiler, runs_torch_compiler

    filename = frame.code.co_filename
    if not filename.startswith("<"):
        return runs_torch_compiler(filename)
    globals_ = frame.globals
    return isinstance(globals_, dict) and in_torch_compiler(globals_.get("__name__"))


@contextlib.contextmanager
def hook(callback: Any) -> Iterator[None]:
    """Install ``callback`` (None, False or a callable) for this thread inside the block."""
    prev = set_eval_frame(callback)
    try:
        yield
    finally:
        set_eval_frame(prev)


# ----------------------------------------------------------------------------------------
# Which files are never captured
# ----------------------------------------------------------------------------------------

_SKIP_PACKAGES = (
    "torch",
    "kiln_frontend",
    "kiln",
    "kiln_aotgrad",
    "kiln_loopir",
    "kiln_runtime",
    "kiln_codegen_cpp",
    "kiln_codegen_triton",
)
_extra_skip_dirs: list[str] = []


def _package_dirs(names: tuple[str, ...]) -> list[str]:
    dirs = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            continue
        for loc in spec.submodule_search_locations:
            dirs.append(os.path.join(os.path.realpath(loc), ""))
    return dirs


def _stdlib_dirs() -> tuple[list[str], list[str]]:
    paths = sysconfig.get_paths()
    std = {os.path.join(os.path.realpath(paths[k]), "") for k in ("stdlib", "platstdlib") if k in paths}
    site = {os.path.join(os.path.realpath(paths[k]), "") for k in ("purelib", "platlib") if k in paths}
    return sorted(std), sorted(site)


_skip_dirs_cache: list[str] | None = None
_STDLIB_DIRS, _SITE_DIRS = _stdlib_dirs()


def add_skip_dir(path: str) -> None:
    """Never capture frames of files under ``path`` (e.g. a backend's own package)."""
    global _skip_dirs_cache
    _extra_skip_dirs.append(os.path.join(os.path.realpath(path), ""))
    _skip_dirs_cache = None


def _skip_dirs() -> list[str]:
    global _skip_dirs_cache
    if _skip_dirs_cache is None:
        _skip_dirs_cache = _package_dirs(_SKIP_PACKAGES) + list(_extra_skip_dirs)
    return _skip_dirs_cache


_realpath_cache: dict[str, str] = {}


def _real(filename: str) -> str:
    real = _realpath_cache.get(filename)
    if real is None:
        real = os.path.realpath(filename)
        _realpath_cache[filename] = real
    return real


#: code objects captured even though their file is skipped: the root of what the user
#: asked to compile (``compile(nn.Sequential(...))`` runs torch's ``Sequential.forward``)
#: (keyed by id: equal code objects of different files compare equal; the code is kept, so
#: its id stays valid)
_capture_roots: dict[int, tuple[CodeType, str]] = {}


def add_capture_root(code: CodeType, what: str) -> None:
    """Always capture frames of ``code`` (``what`` names the compiled object, for logs).

    Only for code the file rules skip (user code is captured anyway, and its skip mark,
    e.g. from ``cache_size_limit``, stays).  Clears the skip mark an earlier frame of it
    left; kept across ``reset()``, since the compiled object still exists."""
    if id(code) in _capture_roots or _skip_reason(code) is None:
        return
    _capture_roots[id(code)] = (code, what)
    unskip_code(code)


#: the code of every function (or module forward) the user compiled: always traced, even
#: called with no tensor (frame_relevance.py); weak, as the compiled object may die
_root_codes: dict[int, weakref.ref[CodeType]] = {}


def add_root_code(code: CodeType) -> None:
    """``code`` is the root of something the user compiled (kept across ``reset()``)."""
    key = id(code)
    _root_codes[key] = weakref.ref(code, lambda _r, key=key: _root_codes.pop(key, None))


def is_root_code(code: CodeType) -> bool:
    ref = _root_codes.get(id(code))
    return ref is not None and ref() is code


def capture_roots() -> dict[CodeType, str]:
    """The codes registered with ``add_capture_root`` (code -> what was compiled)."""
    return dict(_capture_roots.values())


def _skip_reason(code: CodeType) -> tuple[str, str] | None:
    """(short reason, detail in words) why ``code`` is never captured, or None."""
    name = code.co_name
    if name.startswith("__compiled_fn"):
        return "compiled graph", "a graph kiln compiled"
    if name.startswith("__kiln_reenter_at_"):
        return "generated code", "a re-entered grad-mode block's call (translator.py)"
    if id(code) in _capture_roots:
        return None
    filename = code.co_filename
    if filename.startswith("<"):
        if filename.startswith(("<eval_with_key>", "<frozen ", "<kiln")):
            return "generated code", f"generated code ({filename})"
        return None
    return _file_skip_reason(filename)


def _generated_skip_reason(code: CodeType, globals_: Any) -> tuple[str, str] | None:
    """Why code generated at run time (``exec``'d, file ``<string>``) is never captured: the
    module it was made for is. A dataclass's ``__init__``/``__eq__``/``__hash__`` are
    ``exec``'d in the globals of the class's module, so the ``__init__`` of one of torch's
    dataclasses (``CompileId``, ``ShapeEnvSettings``, ``DTensorSpec``...) is torch's code,
    not the user's."""
    if not code.co_filename.startswith("<") or id(code) in _capture_roots or \
            not isinstance(globals_, dict):
        return None
    filename = globals_.get("__file__")
    if not isinstance(filename, str) or filename.startswith("<"):
        return None
    reason = _file_skip_reason(filename)
    if reason is None:
        return None
    return reason[0], f"{reason[1]} (generated for {globals_.get('__name__', filename)})"


def _file_skip_reason(filename: str) -> tuple[str, str] | None:
    real = _real(filename)
    for d in _skip_dirs():
        if real.startswith(d):
            from .trace_rules import captures_frames_of

            if captures_frames_of(real):  # torch code inlined like user code (trace_rules)
                return None
            return "library code", f"in {_package_of_dir(d)}'s own files"
    if config.skip_stdlib and any(real.startswith(d) for d in _STDLIB_DIRS):
        if not any(real.startswith(d) for d in _SITE_DIRS) and "-packages" + os.sep not in real:
            return "standard library", "in the standard library (config.skip_stdlib)"
    return None


def _package_of_dir(d: str) -> str:
    return os.path.basename(os.path.dirname(d)) or d


def should_skip(code: CodeType) -> str | None:
    """Why this code is never captured (a short reason), or None if it may be."""
    reason = _skip_reason(code)
    return None if reason is None else reason[0]


def skip_detail(code: CodeType) -> str | None:
    """Why this code is never captured, in words ("in torch's own files"), or None."""
    reason = _skip_reason(code)
    return None if reason is None else reason[1]


#: callables told about every frame the callback declines to capture because of its
#: file: ``observer(code, detail)``; ``explain()`` uses this
skip_observers: list[Callable[[CodeType, str], None]] = []


def _under_functorch_transform() -> bool:
    """Is a torch.func transform (vmap, grad, jvp, functionalize) running? Its inputs are
    wrapped tensors (BatchedTensor, GradTrackingTensor) that capture and tracing do not
    handle; kiln leaves such calls to Python."""
    functorch = sys.modules.get("torch._C._functorch")
    return functorch is not None and functorch.peek_interpreter_stack() is not None


def _report_skip(code: CodeType, detail: str) -> None:
    counters["skipped"] += 1
    emit(SKIPS, f"not capturing {_where(code)}: {detail}", show=config.debug)
    for observer in list(skip_observers):
        observer(code, detail)


# ----------------------------------------------------------------------------------------
# Per-code state shared across recompiles (frame_state) and reset hooks
# ----------------------------------------------------------------------------------------

_frame_states: dict[int, tuple[weakref.ref[CodeType], dict[str, Any]]] = {}


def frame_state_for(code: CodeType) -> dict[str, Any]:
    """The dict handed to convert_frame as ``frame_state`` for every compile of ``code``."""
    key = id(code)
    hit = _frame_states.get(key)
    if hit is not None and hit[0]() is code:
        return hit[1]
    state: dict[str, Any] = {}
    ref = weakref.ref(code, lambda _r, key=key: _frame_states.pop(key, None))
    _frame_states[key] = (ref, state)
    return state


_reset_hooks: list[Callable[[], None]] = []


def on_reset(fn: Callable[[], None]) -> Callable[[], None]:
    """Register ``fn`` to be called by ``kiln_frontend.reset()`` (usable as a decorator)."""
    if fn not in _reset_hooks:
        _reset_hooks.append(fn)
    return fn


def reset() -> None:
    """Drop every cache entry, skip mark, frame state, counter and one-time warning."""
    _C.reset()
    _frame_states.clear()
    counters.clear()
    reset_warnings()
    for fn in list(_reset_hooks):
        fn()


# ----------------------------------------------------------------------------------------
# The callback
# ----------------------------------------------------------------------------------------


def _default_convert_frame() -> Callable[..., Any]:
    from .convert import convert_frame

    return convert_frame


def _where(code: CodeType) -> str:
    return f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"


def _failure_reasons(entries: list[tuple[Any, Any]], args: tuple[Any, ...]) -> list[str]:
    reasons = []
    for i, (check_fn, *_) in enumerate(entries):
        explain = getattr(check_fn, "failure_reason", None)
        reason = None
        if explain is not None:
            try:
                reason = explain(*args)
            except Exception as e:  # a broken explanation must not break compiling
                reason = f"<failure_reason raised {type(e).__name__}: {e}>"
        reasons.append(f"entry {i}: {reason if reason is not None else 'guard check failed'}")
    return reasons


def _own_lifetime(frame: Any, compiled: Any) -> None:
    """The new entry keeps the globals its code and guards read, and goes when an object
    its guards fix by identity dies (entry_lifetime.py)."""
    code = getattr(compiled, "code", None)
    guards = getattr(compiled.check_fn, "guards", None)
    if not isinstance(code, CodeType) or guards is None:
        return  # (a test's stand-in entry)
    from . import entry_lifetime

    entry_lifetime.claim(code, guards, frame.globals)
    arg_names = frame.code.co_varnames[:len(frame.args)]
    keys = entry_lifetime.identity_objects(guards, arg_names, frame.args, frame.globals,
                                           frame.closure)
    entry_lifetime.hold_weakly(compiled.check_fn, frame.code, keys)


_interned_callbacks: dict[tuple, CompileCallback] = {}


def compile_callback(
    compiler_fn: Callable[..., Any],
    *,
    nopython: bool = False,
    dynamic: bool | None = None,
    backend_name: str | None = None,
) -> CompileCallback:
    """The one ``CompileCallback`` for (backend, options, nopython, dynamic).

    The C cache runs an entry only for the callback that compiled it (its BACKEND_MATCH), so
    two ``compile(f)`` calls with the same backend and options share compiled code, while a
    different backend, options or ``fullgraph`` compiles its own instead of reusing another's.
    """
    if isinstance(compiler_fn, functools.partial):  # compile(options=...) wraps the backend
        backend_key: tuple = (id(compiler_fn.func), compiler_fn.args,
                              repr(sorted(compiler_fn.keywords.items())))
    else:
        backend_key = (id(compiler_fn),)
    key = (backend_key, nopython, dynamic)
    callback = _interned_callbacks.get(key)
    if callback is None:  # the callback holds compiler_fn, so the ids in `key` stay valid
        callback = CompileCallback(
            compiler_fn, nopython=nopython, dynamic=dynamic, backend_name=backend_name
        )
        _interned_callbacks[key] = callback
    return callback


on_reset(_interned_callbacks.clear)


class CompileCallback:
    """What ``optimize(backend, nopython, dynamic)`` installs as the eval-frame callback."""

    def __init__(
        self,
        compiler_fn: Callable[..., Any],
        *,
        nopython: bool = False,
        dynamic: bool | None = None,
        backend_name: str | None = None,
    ):
        self.compiler_fn = compiler_fn
        self.nopython = nopython
        self.dynamic = dynamic
        self.backend_name = backend_name or getattr(compiler_fn, "__name__", repr(compiler_fn))

    def __repr__(self) -> str:
        return (
            f"CompileCallback(backend={self.backend_name!r}, nopython={self.nopython}, "
            f"dynamic={self.dynamic})"
        )

    def __call__(self, frame: Any) -> tuple[Any, Any] | None:
        code = frame.code
        counters["frames"] += 1
        if not _TORCH_RULE_APPLIED and "torch" in sys.modules:
            _skip_what_torch_keeps_from_dynamo()
        skipped = _skip_reason(code) or _generated_skip_reason(code, frame.globals)
        if skipped is not None:
            if _disables_compilation_below(frame.func) or _runs_torch_compiler(frame):
                skip_code_tree(code)  # (this frame already runs so: the C hook re-reads it)
            _report_skip(code, skipped[1])
            return None
        if _under_functorch_transform():
            _report_skip(code, "called under a torch.func transform (vmap, grad, jacrev, ...); "
                               "it runs as plain Python there and compiles when called outside")
            return False  # not now: no skip mark, so a later plain call still compiles
        entries = cache_entries(code)
        if not is_root_code(code) and not may_use_torch(frame):
            if entries:  # traced before: keep its entries, run this call as is
                return False
            _report_skip(code, "no tensor, module or torch/NumPy global in the frame")
            return None
        if entries:
            limit = config.cache_size_limit
            if len(entries) >= limit:
                counters["cache_limit"] += 1
                reasons = _failure_reasons(entries[-1:], frame.args)
                warn_once(
                    ("cache_size_limit", id(code)),
                    f"kiln: {_where(code)} hit config.cache_size_limit ({limit}); it runs "
                    f"eagerly from now on. Last guard failure: {reasons[0]}. "
                    "Run with KILN_LOGS=recompiles to see every recompile's reason.",
                    stacklevel=2,  # the caller of the user's function
                )
                return None
            counters["recompiles"] += 1
            reasons = _failure_reasons(entries, frame.args)
            emit(
                RECOMPILES,
                f"Recompiling function {_where(code)}\n"
                "    triggered by the following guard failure(s):\n"
                + "\n".join(f"    - {r}" for r in reasons),
                show=config.log_recompiles,
            )
        return self._convert(frame)

    def _convert(self, frame: Any) -> tuple[Any, Any] | None:
        code = frame.code
        convert = convert_frame_fn
        try:
            if convert is None:
                convert = _default_convert_frame()
            counters["converts"] += 1
            from . import entry_lifetime  # (imports torch: kiln_frontend itself does not)

            with entry_lifetime.capturing():  # (names no entry reads go when it ends)
                compiled = convert(
                    frame,
                    compiler_fn=self.compiler_fn,
                    nopython=self.nopython,
                    frame_state=frame_state_for(code),
                    dynamic=self.dynamic,
                )
                if compiled is not None:
                    _own_lifetime(frame, compiled)
        except Unsupported as e:
            if self.nopython:
                raise
            return self._suppressed(code, e)
        except Exception as e:  # BackendCompilerFailed, InternalError, a backend's own error
            return self._suppressed(code, e)
        if compiled is None:
            return None
        counters["compiles"] += 1
        # a one-graph frame's graph is called by the hook itself (direct_entry)
        return (compiled.check_fn, compiled.fn, direct_call(compiled.fn))

    def _suppressed(self, code: CodeType, error: BaseException | None) -> None:
        if not config.suppress_errors:
            assert error is not None
            raise error
        counters["failures"] += 1
        detail = (
            "".join(traceback.format_exception(error)) if config.verbose else f"{type(error).__name__}: {error}"
        )
        warn_once(
            ("compile_failed", id(code)),
            f"kiln: compiling {_where(code)} with backend {self.backend_name!r} failed; it runs "
            f"eagerly. {detail}\n(set kiln_frontend.config.suppress_errors = False to raise; "
            "KILN_VERBOSE=1 for the full traceback)",
            stacklevel=4,  # _suppressed <- _convert <- __call__ <- caller of the user's function
        )
        return None


__all__ = [
    "CompileCallback",
    "FrameInfo",
    "TensorGuard",
    "add_capture_root",
    "add_root_code",
    "add_skip_dir",
    "capture_roots",
    "cache_entries",
    "clear_cache",
    "convert_frame_fn",
    "counters",
    "frame_state_for",
    "get_eval_frame",
    "hook",
    "is_root_code",
    "is_skipped",
    "on_reset",
    "reset",
    "run_without_hook",
    "set_eval_frame",
    "should_skip",
    "skip_detail",
    "skip_observers",
    "skip_code",
    "unskip_code",
    "with_callback",
]
