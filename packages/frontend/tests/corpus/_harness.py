"""The corpus harness: one function that checks a feature case end to end.

``check_case(fn, args, expected_graphs)`` runs ``fn`` eagerly and under
``kiln_frontend.optimize`` (the real eval-frame hook, a graph-counting ``eager``-style
backend), each on its own deep copy of ``args``, and checks

* the results are equal (``torch.testing.assert_close`` on tensors; containers, dataclasses
  and plain objects compared item by item);
* the final state of the inputs is equal (tensors mutated in place, lists/dicts/objects
  mutated, module parameters and buffers), or ``mutate_check(args)`` when given;
* the number of graphs handed to the backend is ``expected_graphs``;
* a second call on the same objects compiles nothing new (no new ``convert_frame`` call and
  no new graph) and still agrees with eager.

Returns a ``CaseResult`` (the graphs, the backend's example inputs) for extra assertions.
"""

from __future__ import annotations

import copy
import dataclasses
import types
from collections.abc import Callable
from typing import Any

import kiln_frontend
import torch
from _counting_backend import CountingBackend
from kiln_frontend import eval_frame


@dataclasses.dataclass
class CaseResult:
    backend: CountingBackend
    result: Any
    eager_result: Any
    #: the compiled side's copy of the arguments (after both calls)
    args: tuple = ()

    @property
    def graphs(self) -> list[torch.fx.GraphModule]:
        return self.backend.graphs


def _copy_args(args: tuple) -> tuple:
    """A deep copy; tensors keep ``requires_grad`` (leaf tensors copy as leaves)."""
    return copy.deepcopy(tuple(args))


def _fresh_tensors(value: Any) -> Any:
    """The same argument structure with NEW tensors (floating ones doubled, others cloned),
    so a second call that reused values of the first one (a stale closure, a constant
    folded from a tensor) shows up.  Modules and other objects are kept (their identity is
    guarded)."""
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        new = value.detach().clone()
        if new.is_floating_point():
            new = new * 2
        return new.requires_grad_(value.requires_grad)
    if type(value) in (list, tuple):
        return type(value)(_fresh_tensors(v) for v in value)
    if type(value) is dict:
        return {k: _fresh_tensors(v) for k, v in value.items()}
    return value


def state_of(value: Any, _seen: set[int] | None = None) -> Any:
    """A comparable snapshot of everything mutable reachable from ``value``: tensors (cloned),
    list/tuple/dict items, module parameters/buffers/training flags, object ``__dict__``s."""
    seen = set() if _seen is None else _seen
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (int, float, bool, str, bytes, complex, type(None), torch.dtype,
                          torch.device, torch.Size)):
        return value
    if id(value) in seen:
        return "<cycle>"
    seen.add(id(value))
    if isinstance(value, torch.nn.Module):
        return {"training": value.training,
                "state": {k: v.detach().clone() for k, v in value.state_dict().items()},
                "attrs": {k: state_of(v, seen) for k, v in vars(value).items()
                          if not k.startswith("_") and not callable(v)}}
    if isinstance(value, (list, tuple)):
        return type(value).__name__, [state_of(v, seen) for v in value]
    if isinstance(value, dict):
        return {k: state_of(v, seen) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return value
    if callable(value) and not hasattr(value, "__dict__"):
        return "<callable>"
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return type(value).__name__, {k: state_of(v, seen) for k, v in vars(value).items()
                                      if not callable(v)}
    return repr(value) if not callable(value) else "<callable>"


def assert_same(actual: Any, expected: Any, what: str = "result") -> None:
    """Recursive equality: tensors with assert_close (dtype, device and shape included)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{what}: expected a tensor, got {actual!r}"
        torch.testing.assert_close(actual, expected, msg=lambda m: f"{what}: {m}")
        assert actual.requires_grad == expected.requires_grad, (
            f"{what}: requires_grad {actual.requires_grad} != {expected.requires_grad}")
        return
    if dataclasses.is_dataclass(expected) and not isinstance(expected, type):
        assert type(actual) is type(expected), f"{what}: {type(actual)} != {type(expected)}"
        for f in dataclasses.fields(expected):
            assert_same(getattr(actual, f.name), getattr(expected, f.name), f"{what}.{f.name}")
        return
    if isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected), f"{what}: {type(actual)} != {type(expected)}"
        assert len(actual) == len(expected), f"{what}: length {len(actual)} != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{what}[{i}]")
        return
    if isinstance(expected, dict):
        assert type(actual) is type(expected), f"{what}: {type(actual)} != {type(expected)}"
        assert list(actual) == list(expected), f"{what}: keys {list(actual)} != {list(expected)}"
        for k in expected:
            assert_same(actual[k], expected[k], f"{what}[{k!r}]")
        return
    if isinstance(expected, (types.FunctionType, types.MethodType)):
        # a function made by the frame: a new object each call; same code is what matters
        assert type(actual) is type(expected) and \
            actual.__code__ is expected.__code__, f"{what}: {actual!r} != {expected!r}"
        return
    if isinstance(expected, float) and expected != expected:
        assert isinstance(actual, float) and actual != actual, f"{what}: {actual!r} != nan"
        return
    if hasattr(expected, "__dict__") and not isinstance(expected, type) and \
            not callable(expected) and type(expected).__eq__ is object.__eq__:
        assert type(actual) is type(expected), f"{what}: {type(actual)} != {type(expected)}"
        assert_same(vars(actual), vars(expected), f"{what}.__dict__")
        return
    assert type(actual) is type(expected) and actual == expected, \
        f"{what}: {actual!r} != {expected!r}"


def check_case(fn: Callable[..., Any], args: tuple | list, expected_graphs: int | None, *,
               fullgraph: bool = False, mutate_check: Callable[[tuple], Any] | None = None,
               kwargs: dict[str, Any] | None = None,
               fresh_inputs: bool = False) -> CaseResult:
    """Run ``fn(*args, **kwargs)`` eagerly and compiled (on deep copies of the arguments),
    twice, and check results, final input state, graph count and cache reuse.

    ``expected_graphs``: graphs the backend gets on the first call (None: do not check);
    ``fullgraph``: compile with ``nopython=True`` (any graph break raises);
    ``mutate_check(args) -> value``: what to compare after each call instead of the default
    snapshot of every tensor/container/object reachable from the arguments;
    ``fresh_inputs``: the second call gets NEW tensors with other values (floating ones
    doubled) instead of the same objects — catches a compiled frame that kept values of the
    first call (not for cases whose guards specialize on tensor values, like ``.item()``)."""
    kwargs = dict(kwargs or {})
    snapshot = mutate_check if mutate_check is not None else state_of
    kiln_frontend.reset()
    backend = CountingBackend()
    eager_fn = fn
    if isinstance(fn, torch.nn.Module):
        # each side gets its own copy of the module (its state may change)
        eager_fn, fn = copy.deepcopy(fn), copy.deepcopy(fn)
    compiled = kiln_frontend.optimize(backend, nopython=fullgraph)(fn)

    eager_args = _copy_args(args)
    eager_kwargs = copy.deepcopy(kwargs)
    comp_args = _copy_args(args)
    comp_kwargs = copy.deepcopy(kwargs)

    first_result = None
    eager_first = None
    for call in (1, 2):
        if call == 2 and fresh_inputs:
            # new tensors with other values, same for both sides
            eager_args = tuple(_fresh_tensors(a) for a in eager_args)
            comp_args = tuple(_fresh_tensors(a) for a in comp_args)
        converts_before = eval_frame.counters["converts"]
        graphs_before = len(backend.graphs)
        expected = eager_fn(*eager_args, **eager_kwargs)
        actual = compiled(*comp_args, **comp_kwargs)
        assert_same(actual, expected, f"call {call} result")
        assert_same(snapshot(comp_args), snapshot(eager_args), f"call {call} input state")
        if isinstance(fn, torch.nn.Module):
            assert_same(state_of(fn), state_of(eager_fn), f"call {call} module state")
        if call == 1:
            first_result, eager_first = actual, expected
            if expected_graphs is not None:
                assert len(backend.graphs) == expected_graphs, (
                    f"expected {expected_graphs} graph(s), got {len(backend.graphs)}:\n"
                    + "\n".join(str(g.graph) for g in backend.graphs))
        else:
            assert len(backend.graphs) == graphs_before, (
                f"second call compiled {len(backend.graphs) - graphs_before} new graph(s)")
            assert eval_frame.counters["converts"] == converts_before, (
                "second call converted a frame again (a guard failed on the same inputs)")
    kiln_frontend.reset()
    return CaseResult(backend=backend, result=first_result, eager_result=eager_first,
                      args=comp_args)




@dataclasses.dataclass
class Case:
    """One corpus entry: ``fn(*args)`` should give ``graphs`` graphs."""

    fn: Callable[..., Any]
    args: tuple
    graphs: int | None
    fullgraph: bool = False
    kwargs: dict[str, Any] | None = None
    mutate_check: Callable[[tuple], Any] | None = None
    name: str | None = None
    #: pytest marks for this case (e.g. a strict xfail naming a known bug)
    marks: tuple = ()
    fresh_inputs: bool = False

    @property
    def id(self) -> str:
        return self.name or getattr(self.fn, "__name__", type(self.fn).__name__)

    def check(self) -> CaseResult:
        return check_case(self.fn, self.args, self.graphs, fullgraph=self.fullgraph,
                          mutate_check=self.mutate_check, kwargs=self.kwargs,
                          fresh_inputs=self.fresh_inputs)


def case_params(cases: list[Case]):
    """``pytest.mark.parametrize`` arguments for a list of cases (ids: function names)."""
    import pytest

    return pytest.mark.parametrize(
        "case", [pytest.param(c, marks=c.marks, id=c.id) for c in cases])


__all__ = ["Case", "CaseResult", "CountingBackend", "assert_same", "case_params", "check_case",
           "state_of"]
