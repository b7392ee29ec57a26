"""Corpus: context managers (grad mode, autocast, user classes) captured into graphs, and
``with``/``try`` blocks around graph breaks."""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch
from _harness import Case as _Case
from _harness import case_params, check_case

#: every case here also runs a second time on new tensor values
Case = functools.partial(_Case, fresh_inputs=True)


def _t(*shape, grad=False):
    return torch.randn(*shape, requires_grad=grad)


def no_grad_block(x, w):
    with torch.no_grad():
        y = x @ w
    z = x @ w
    return y, z, y.requires_grad


def nested_grad_modes(x, w):
    with torch.no_grad():
        a = x * w
        with torch.enable_grad():
            b = x * w
        c = x + w
    return a, b, c


def set_grad_enabled_block(x, w):
    with torch.set_grad_enabled(False):
        a = x * w
    with torch.set_grad_enabled(True):
        b = x * w
    return a, b


def set_grad_enabled_call(x, w):
    torch.set_grad_enabled(False)
    a = x * w
    torch.set_grad_enabled(True)
    return a, x * w


def return_inside_with(x, w):
    with torch.no_grad():
        return x * w + 1


@torch.no_grad()
def _decorated_helper(x, w):
    return x * w


def decorated_no_grad_helper(x, w):
    return _decorated_helper(x, w) + x * w


class _Doubler:
    def __init__(self, k):
        self.k = k

    def __enter__(self):
        return self.k * 2

    def __exit__(self, *exc):
        return False


def user_context_manager(x):
    with _Doubler(3) as k:
        y = x * k
    return y


def user_context_manager_from_input(x, cm):
    with cm as k:
        y = x + k
    return y


def autocast_cpu(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        z = torch.relu(y)
    return z, z.dtype, (x @ w).dtype


def autocast_disabled_inside(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = x @ w
        with torch.autocast("cpu", enabled=False):
            b = x @ w
    return a, b


def try_finally_no_exception(x):
    try:
        y = x * 2
    finally:
        z = 1
    return y + z


def try_except_no_exception(x):
    try:
        y = x.sin()
    except RuntimeError:
        y = x.cos()
    return y


def break_inside_no_grad(x, w):
    a = x * w
    with torch.no_grad():
        b = a * 2
        print("graph break inside a with block")
        c = b + w
    return a + 1, c, c.requires_grad


def break_inside_try(x):
    y = x * 2
    try:
        print("graph break inside try")
        z = y + 1
    finally:
        y = y - 1
    return y * z


@contextlib.contextmanager
def _scaled():
    yield 3.0


def contextlib_manager(x):
    y = x + 1
    with _scaled() as s:
        z = y * s
    return z


CASES = [
    Case(no_grad_block, (_t(2, 3, grad=True), _t(3, 3, grad=True)), 1, fullgraph=True),
    Case(nested_grad_modes, (_t(3, grad=True), _t(3, grad=True)), 1, fullgraph=True),
    Case(set_grad_enabled_block, (_t(3, grad=True), _t(3)), 1, fullgraph=True),
    Case(set_grad_enabled_call, (_t(3, grad=True), _t(3)), 1, fullgraph=True),
    Case(return_inside_with, (_t(3, grad=True), _t(3)), 1, fullgraph=True),
    Case(decorated_no_grad_helper, (_t(3, grad=True), _t(3)), 1, fullgraph=True),
    Case(user_context_manager, (_t(3),), 1, fullgraph=True),
    Case(user_context_manager_from_input, (_t(3), _Doubler(1.5)), 1, fullgraph=True),
    Case(autocast_cpu, (_t(4, 4), _t(4, 4)), 1, fullgraph=True),
    Case(autocast_disabled_inside, (_t(4, 4), _t(4, 4)), 1, fullgraph=True),
    Case(try_finally_no_exception, (_t(3),), 1, fullgraph=True),
    Case(try_except_no_exception, (_t(3),), 1, fullgraph=True),
    # the graph so far ends with the mode as before the block, the break runs in Python
    # inside the mode, a second graph goes on inside the block (as torch.compile: 2 graphs)
    Case(break_inside_no_grad, (_t(3, grad=True), _t(3)), 2),
    # the block runs whole in Python after the graph of what comes before it
    Case(break_inside_try, (_t(3),), 1),
    Case(contextlib_manager, (_t(3),), 1),
]


@case_params(CASES)
def test_context_case(case):
    case.check()


def test_grad_mode_nodes_recorded():
    res = check_case(no_grad_block, (_t(2, 3, grad=True), _t(3, 3, grad=True)), 1,
                     fullgraph=True)
    targets = res.backend.call_targets(0)
    assert targets.count(torch._C._set_grad_enabled) == 2


def test_autocast_nodes_recorded():
    from torch.amp.autocast_mode import _enter_autocast, _exit_autocast

    res = check_case(autocast_cpu, (_t(4, 4), _t(4, 4)), 1, fullgraph=True)
    targets = res.backend.call_targets(0)
    assert _enter_autocast in targets and _exit_autocast in targets


def test_grad_mode_restored_after_break_in_with():
    check_case(break_inside_no_grad, (_t(3, grad=True), _t(3)), None)
    assert torch.is_grad_enabled()


def test_break_inside_with_fullgraph_raises():
    import kiln_frontend

    with pytest.raises(kiln_frontend.Unsupported, match="test_corpus_context.py"):
        check_case(break_inside_no_grad, (_t(3, grad=True), _t(3)), 1, fullgraph=True)
    assert torch.is_grad_enabled()
