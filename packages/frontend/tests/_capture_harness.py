"""Test support for the capture tests (not a test module).

``Capture`` is a small Python stand-in for the C eval-frame hook, so capture can be tested
without ``kiln_frontend._evalframe``: it binds a call's arguments to the frame's argument
slots as the hook does, keeps a per-code cache of ``CompiledFrame`` entries checked with
``check_fn``, and captures the resume functions the transformed code calls (they are
installed as globals; while a transformed function runs they are swapped for wrappers that
go through the same cache)."""

from __future__ import annotations

import inspect
import types
from typing import Any

from _counting_backend import CountingBackend
from kiln_frontend.convert import CompiledFrame, convert_frame


def slot_values(fn: types.FunctionType, args: tuple, kwargs: dict) -> tuple:
    bound = inspect.signature(fn).bind(*args, **kwargs)
    bound.apply_defaults()
    code = fn.__code__
    n = code.co_argcount + code.co_kwonlyargcount + int(_has_varargs(code)) + \
        int(_has_varkw(code))
    # the frame's slot order: positional, keyword-only, *args, **kwargs
    return tuple(bound.arguments[name] for name in code.co_varnames[:n])


def _has_varargs(code: types.CodeType) -> bool:
    return bool(code.co_flags & inspect.CO_VARARGS)


def _has_varkw(code: types.CodeType) -> bool:
    return bool(code.co_flags & inspect.CO_VARKEYWORDS)


#: the recording backend of the capture tests (conftest.py puts its module on sys.path)
Backend = CountingBackend


def frame_info(fn: types.FunctionType, slots: tuple) -> types.SimpleNamespace:
    builtins = fn.__globals__.get("__builtins__", __builtins__)
    if isinstance(builtins, types.ModuleType):
        builtins = builtins.__dict__
    return types.SimpleNamespace(code=fn.__code__, func=fn, globals=fn.__globals__,
                                 builtins=builtins, args=tuple(slots), closure=fn.__closure__)


class Capture:
    def __init__(self, compiler_fn, *, nopython: bool = False):
        self.compiler_fn = compiler_fn
        self.nopython = nopython
        self.cache: dict[types.CodeType, list[CompiledFrame]] = {}
        self.frames: list[CompiledFrame] = []
        self.skipped: set[types.CodeType] = set()
        self.calls = 0

    def __call__(self, fn, *args, **kwargs) -> Any:
        if not isinstance(fn, (types.FunctionType, types.MethodType)) and hasattr(fn, "forward"):
            fn = fn.forward  # an nn.Module: its forward frame is what the hook sees
        if isinstance(fn, types.MethodType):
            args = (fn.__self__, *args)
            fn = fn.__func__
        return self.run(fn, slot_values(fn, args, kwargs))

    def run(self, fn: types.FunctionType, slots: tuple) -> Any:
        self.calls += 1
        code = fn.__code__
        if code in self.skipped:
            return fn(*slots) if not _has_star(code) else _call_slots(fn, slots)
        for cf in self.cache.get(code, []):
            if cf.check_fn(*slots):
                return self._call(cf, slots)
        cf = convert_frame(frame_info(fn, slots), compiler_fn=self.compiler_fn,
                           nopython=self.nopython, frame_state={})
        if cf is None:
            self.skipped.add(code)
            return _call_slots(fn, slots)
        self.cache.setdefault(code, []).append(cf)
        self.frames.append(cf)
        return self._call(cf, slots)

    def _call(self, cf: CompiledFrame, slots: tuple) -> Any:
        g = cf.fn.__globals__
        saved = {}
        for name in cf.installed_globals:
            if name.startswith("__resume_at_") and not getattr(g[name], "_harness", False):
                orig = g[name]
                saved[name] = orig

                def wrapper(*a, _orig=orig):
                    return self.run(_orig, a)

                wrapper._harness = True
                g[name] = wrapper
        try:
            return cf.fn(*slots)
        finally:
            g.update(saved)


def _has_star(code: types.CodeType) -> bool:
    return bool(code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS))


def _call_slots(fn: types.FunctionType, slots: tuple) -> Any:
    """Call ``fn`` with its argument slots (positional, keyword-only, *args, **kwargs)."""
    code = fn.__code__
    n = code.co_argcount
    names = code.co_varnames
    args = list(slots[:n])
    kw = {names[n + i]: slots[n + i] for i in range(code.co_kwonlyargcount)}
    k = n + code.co_kwonlyargcount
    if code.co_flags & inspect.CO_VARARGS:
        args += list(slots[k])
        k += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kw.update(slots[k])
    return fn(*args, **kw)


