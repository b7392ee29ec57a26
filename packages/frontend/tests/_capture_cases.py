"""The shared case convention of the ``test_capture_*.py`` modules (not a test module).

A module may hold a module-level ``CASES`` list of ``(name, family, fn, args)``:
``family`` is a short word the features table groups by (``"recompiles"``,
``"builtins"``...), ``args`` is either one call's argument tuple or a ``Calls`` (a list of
argument tuples: a sequence of calls, for recompile counts).  ``benchmarks/capture.py
--features`` collects them; ``run_case`` runs one case under eager, kiln and torch.compile
and gives what both compilers did, so a test can assert kiln's counts equal torch's."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from _counting_backend import ON_REFERENCE_TORCH, CountingBackend, assert_kiln_still_captures


class Calls(list):
    """A sequence of calls: each item is one call's argument tuple."""


def calls_of(args: Any) -> list[tuple]:
    return list(args) if isinstance(args, Calls) else [tuple(args)]


@dataclasses.dataclass
class Outcome:
    results: list[Any]      # one (result, args after the call) per call
    graphs: int             # GraphModules the backend got
    entries: int            # cache entries of fn's own code (1 + its recompiles)
    error: BaseException | None = None


def _run(compiled: Callable, fn: Callable, calls: list[tuple], entries: Callable) -> Outcome:
    backend = CountingBackend()
    f = compiled(fn, backend)
    results = []
    try:
        for args in calls:
            args = copy.deepcopy(args)
            results.append((f(*args), args))
    except Exception as e:  # noqa: BLE001 - reported, compared by the caller
        return Outcome(results, len(backend.graphs), entries(fn), e)
    return Outcome(results, len(backend.graphs), entries(fn))


def _code(fn: Callable) -> Any:
    return getattr(fn, "__code__", None) or fn.forward.__code__


def run_eager(fn: Callable, args: Any) -> list[Any]:
    out = []
    for a in calls_of(args):
        a = copy.deepcopy(a)
        out.append((fn(*a), a))
    return out


def run_kiln(fn: Callable, args: Any, *, fullgraph: bool = False) -> Outcome:
    import kiln_frontend
    from kiln_frontend.eval_frame import cache_entries

    kiln_frontend.reset()
    return _run(lambda f, b: kiln_frontend.compile(f, backend=b, fullgraph=fullgraph), fn,
                calls_of(args), lambda f: len(cache_entries(_code(f))))


def run_torch(fn: Callable, args: Any) -> Outcome:
    """torch.compile's counts: the reference (tests and the benchmark only)."""
    import torch._dynamo
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    torch._dynamo.reset()
    try:
        outcome = _run(lambda f, b: torch.compile(f, backend=b), fn, calls_of(args),
                       lambda f: len(_debug_get_cache_entry_list(_code(f))))
    finally:
        torch._dynamo.reset()
    assert_kiln_still_captures()
    return outcome


def assert_same(actual: Any, expected: Any, path: str = "") -> None:
    """Results and the arguments' final state agree: tensors with assert_close, containers
    item by item, plain objects by their attributes, modules by their state, the rest
    with ``==``."""
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), \
            f"{path}: {actual!r} != {expected!r}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert type(actual) is type(expected) and list(actual) == list(expected), \
            f"{path}: {actual!r} != {expected!r}"
        for k in expected:
            assert_same(actual[k], expected[k], f"{path}[{k!r}]")
    elif isinstance(expected, torch.nn.Module):
        assert_same(actual.state_dict(), expected.state_dict(), f"{path}.state_dict()")
    elif type(expected).__eq__ is object.__eq__ and hasattr(expected, "__dict__") \
            and not isinstance(expected, type) and not callable(expected):
        assert type(actual) is type(expected), f"{path}: {actual!r} != {expected!r}"
        assert_same(vars(actual), vars(expected), f"{path}.__dict__")
    else:
        assert type(actual) is type(expected) and (actual == expected or actual is expected
                                                    or actual != actual), \
            f"{path}: {actual!r} != {expected!r}"


def check_case(fn: Callable, args: Any, *, fullgraph: bool = True) -> tuple[Outcome, Outcome]:
    """``fn`` under kiln gives eager's results and final state, and the same number of
    graphs and cache entries as torch.compile (computed here, never hard-coded)."""
    expected = run_eager(fn, args)
    # kiln first: a failed TorchDynamo run can leave state behind that kiln defers to
    got = run_kiln(fn, args, fullgraph=fullgraph)
    ref = run_torch(fn, args)
    if got.error is not None:
        raise got.error
    assert_same(got.results, expected)
    if ref.error is not None:  # torch.compile itself fails: no count to match
        return got, ref
    # kiln may do better than torch.compile on one call, never worse: one graph under
    # fullgraph where torch.compile breaks the graph or captures nothing (over a sequence
    # of calls the counts must be equal: fewer there can mean kiln stopped compiling)
    better = fullgraph and not isinstance(args, Calls) and got.graphs == got.entries == 1
    got_counts = (ref.graphs, ref.entries) if better else (got.graphs, got.entries)
    assert got_counts == (ref.graphs, ref.entries), \
        f"kiln graphs/entries {got.graphs}/{got.entries}, torch.compile " \
        f"{ref.graphs}/{ref.entries}"
    return got, ref


def check_results_match_eager(fn: Callable, args: Any) -> None:
    """kiln without ``fullgraph`` gives eager's results and final state, whatever its counts
    (also for the xfailed cases: never a wrong result)."""
    got = run_kiln(fn, args)
    if got.error is not None:
        raise got.error
    assert_same(got.results, run_eager(fn, args))


def case_params(cases: list[tuple], xfail: dict[str, str] | None = None) -> list[Any]:
    """``pytest.mark.parametrize`` values for ``CASES`` (ids are the names); ``xfail``
    maps a name to the precise cause it still fails for (strict)."""
    import pytest

    xfail = xfail or {}
    return [pytest.param(name, fn, args, id=name,
                         marks=[pytest.mark.xfail(strict=ON_REFERENCE_TORCH, reason=xfail[name])]
                         if name in xfail else [])
            for name, _family, fn, args in cases]
