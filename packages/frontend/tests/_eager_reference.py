"""Test support (not a test module): run a small program eagerly, under torch.compile with a
counting backend (the reference for the graph count) and under kiln, and compare all three
ways of ending: the result, the exception escaping (type, message, attributes, ``__cause__``,
``__context__``), the global state after (grad mode, inference mode, autocast, default
dtype) and the arguments after (in-place mutations).

``check(fn, *args)`` asks torch.compile for its graphs; where TorchDynamo gives one graph
with no graph break kiln must too (kiln compiles with ``fullgraph=True``), else both compile
without it.  Either way kiln's graph count must equal TorchDynamo's."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from _counting_backend import CountingBackend


def global_state() -> dict[str, Any]:
    return {
        "grad": torch.is_grad_enabled(),
        "inference": torch.is_inference_mode_enabled(),
        "autocast_cpu": torch.is_autocast_enabled("cpu"),
        "autocast_cpu_dtype": torch.get_autocast_dtype("cpu"),
        "default_dtype": torch.get_default_dtype(),
    }


def _restore(state: dict[str, Any]) -> None:
    torch._C._set_grad_enabled(state["grad"])
    torch.set_autocast_enabled("cpu", state["autocast_cpu"])
    torch.set_autocast_dtype("cpu", state["autocast_cpu_dtype"])
    torch.set_default_dtype(state["default_dtype"])


class Outcome:
    def __init__(self, result: Any, exc: BaseException | None, state: dict, args: Any):
        self.result = result
        self.exc = exc
        self.state = state
        self.args = args


def run_once(fn, args: tuple) -> Outcome:
    args = copy.deepcopy(args)
    before = global_state()
    try:
        result, exc = fn(*args), None
    except Exception as e:  # noqa: BLE001 - the program's own exception is the outcome
        result, exc = None, e
    after = global_state()
    _restore(before)
    return Outcome(result, exc, after, args)


def same(actual: Any, expected: Any, what: str = "result") -> None:
    """Equal values, recursively: tensors with ``assert_close`` (and the same
    ``requires_grad``), objects by type and ``__dict__``."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), (what, actual)
        torch.testing.assert_close(actual, expected, msg=lambda m: f"{what}: {m}")
        assert actual.requires_grad == expected.requires_grad, (what, "requires_grad")
        return
    assert type(actual) is type(expected), (what, type(actual), type(expected))
    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), (what, actual, expected)
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            same(a, e, f"{what}[{i}]")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), (what, actual, expected)
        for k in expected:
            same(actual[k], expected[k], f"{what}[{k!r}]")
    elif isinstance(expected, BaseException):
        same_exception(actual, expected, what)
    elif isinstance(expected, float) and math.isnan(expected):
        assert math.isnan(actual), (what, actual)
    elif hasattr(expected, "__dict__") and not isinstance(expected, type) and \
            type(expected).__eq__ is object.__eq__:
        same(vars(actual), vars(expected), f"{what}.__dict__")
    else:
        assert actual == expected, (what, actual, expected)


def same_exception(actual: BaseException | None, expected: BaseException | None,
                   what: str = "exception") -> None:
    if expected is None:
        assert actual is None, f"{what}: unexpected {type(actual).__name__}: {actual}"
        return
    assert actual is not None, f"{what}: expected {type(expected).__name__}: {expected}"
    assert type(actual) is type(expected), (what, actual, expected)
    assert str(actual) == str(expected), (what, str(actual), str(expected))
    assert actual.args == expected.args, (what, actual.args, expected.args)
    same({k: v for k, v in vars(actual).items() if not k.startswith("__")},
         {k: v for k, v in vars(expected).items() if not k.startswith("__")}, f"{what} attrs")
    assert actual.__suppress_context__ == expected.__suppress_context__, what
    same_exception(actual.__cause__, expected.__cause__, f"{what}.__cause__")
    if not expected.__suppress_context__:
        same_exception(actual.__context__, expected.__context__, f"{what}.__context__")


def same_outcome(actual: Outcome, expected: Outcome, who: str) -> None:
    same_exception(actual.exc, expected.exc, f"{who}: exception")
    if expected.exc is None:
        same(actual.result, expected.result, f"{who}: result")
    assert actual.state == expected.state, (who, "state after", actual.state, expected.state)
    same(actual.args, expected.args, f"{who}: arguments after")


def reference(fn, args: tuple) -> tuple[bool, int, Outcome]:
    """torch.compile's answer: (one graph with no break, graph count, outcome).

    Asked without ``fullgraph=True`` and read from TorchDynamo's graph-break counter: a
    ``fullgraph=True`` compile that fails leaves TorchDynamo's eval-frame function
    installed (torch 2.13), and kiln then yields every later frame to it."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    backend = CountingBackend()
    out = run_once(torch.compile(fn, backend=backend), args)
    breaks = sum(counters["graph_break"].values())
    torch._dynamo.reset()
    return breaks == 0 and len(backend.graphs) == 1, len(backend.graphs), out


def check(fn, *args, fullgraph: bool | None = None, count: bool = True) -> CountingBackend:
    """``fn(*args)`` under kiln ends as eagerly and gives torch.compile's graph count.

    ``fullgraph`` forces kiln's flag (None: True exactly where torch.compile manages one
    graph); ``count=False`` checks the outcome only."""
    from kiln_frontend import compile as kiln_compile
    from kiln_frontend import reset

    eager = run_once(fn, args)
    ref_fullgraph, ref_graphs, ref_out = reference(fn, args)
    try:
        same_outcome(ref_out, eager, "torch.compile (the reference itself)")
        no_reference = None
    except AssertionError as e:
        no_reference = str(e)
    if no_reference is not None:
        # parity is undefined where this torch release's torch.compile is itself wrong (the
        # lent machine's 2.11 on some cases): kiln must still end as eagerly (run outside
        # the handler, so that kiln's exception has no __context__ of ours)
        reset()
        same_outcome(run_once(kiln_compile(fn, backend=CountingBackend()), args), eager, "kiln")
        reset()
        pytest.skip(f"torch {torch.__version__}'s torch.compile differs from eager here, so "
                    f"its graph count is no reference (kiln's outcome matched eager): "
                    f"{no_reference}")
    if fullgraph is None:
        fullgraph = ref_fullgraph
    reset()
    backend = CountingBackend()
    out = run_once(kiln_compile(fn, backend=backend, fullgraph=fullgraph), args)
    same_outcome(out, eager, "kiln")
    if count:
        assert len(backend.graphs) == ref_graphs, \
            (f"kiln made {len(backend.graphs)} graphs, torch.compile {ref_graphs}",
             [gm.code for gm in backend.graphs])
    reset()
    return backend
