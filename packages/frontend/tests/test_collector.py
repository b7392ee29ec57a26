"""While a frame compiles, the objects that existed before are frozen out of gen-2
collections (collector.py), and handed back after; a program's own freeze is left alone."""

from __future__ import annotations

import contextlib
import gc

import kiln_frontend
import torch


def _compiled_with_freeze_probe():
    seen = []

    def backend(gm, example_inputs):
        seen.append(gc.get_freeze_count())
        return gm.forward

    def f(x):
        return torch.sin(x) + 1

    return kiln_frontend.compile(f, backend=backend), seen


@contextlib.contextmanager
def _unfrozen_heap():
    """Some interpreters start with a frozen heap (a site hook's gc.freeze(): the lent GPU
    machine's Python 3.12 starts with 375 objects frozen); the test needs one that is not,
    and puts the start-up freeze back after."""
    frozen_at_start = gc.get_freeze_count()
    gc.unfreeze()
    try:
        yield
    finally:
        if frozen_at_start:
            gc.freeze()


def test_the_heap_is_frozen_while_a_frame_compiles_and_given_back_after():
    kiln_frontend.reset()
    with _unfrozen_heap():
        before = gc.get_objects()  # (keeps them alive: they must be frozen during the compile)
        assert gc.get_freeze_count() == 0
        f, seen = _compiled_with_freeze_probe()
        x = torch.randn(4)
        torch.testing.assert_close(f(x), torch.sin(x) + 1)
        assert len(seen) == 1 and seen[0] >= len(before) // 2
        assert gc.get_freeze_count() == 0


def test_a_programs_own_freeze_is_left_alone(monkeypatch):
    kiln_frontend.reset()
    _alive = gc.get_objects()  # (kept alive: the program's freeze holds them)
    gc.freeze()
    calls = []
    try:
        monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
        monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
        f, seen = _compiled_with_freeze_probe()
        x = torch.randn(4)
        torch.testing.assert_close(f(x), torch.sin(x) + 1)
        assert len(seen) == 1 and calls == []
    finally:
        monkeypatch.undo()
        gc.unfreeze()


def test_the_interpreters_own_frozen_objects_do_not_stop_the_freeze(monkeypatch):
    """CPython 3.12's collector moves the interpreter's immortal objects (375 at start-up) to
    the permanent generation itself: the heap is still frozen for the compile and given back
    after, as on 3.11 and 3.13, where the count starts at 0."""
    kiln_frontend.reset()
    calls = []
    monkeypatch.setattr(gc, "get_freeze_count", lambda: 375)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
    f, _ = _compiled_with_freeze_probe()
    x = torch.randn(4)
    torch.testing.assert_close(f(x), torch.sin(x) + 1)
    assert calls == ["freeze", "unfreeze"]
