"""The recording backend the frontend tests compile with, and ``one_graph`` (one place for
every test file; ``conftest.py`` puts this folder on ``sys.path``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: the torch release the parity tests' exact graph counts and their xfails are written
#: against (the one the nox sessions pin). On another release (the lent GPU machine's 2.11)
#: torch.compile breaks graphs in other places: kiln may then make fewer graphs than it, never
#: more, and an xfail that passes there is not an error
REFERENCE_TORCH = "2.13"
ON_REFERENCE_TORCH = torch.__version__.startswith(REFERENCE_TORCH + ".")


class CountingBackend:
    """Records every GraphModule and its example inputs and runs it as is (like the
    ``eager`` backend); ``transform(gm)``, when given, edits each graph first."""

    def __init__(self, transform: Callable[[torch.fx.GraphModule], Any] | None = None):
        self.graphs: list[torch.fx.GraphModule] = []
        self.example_inputs: list[list[Any]] = []
        self.transform = transform

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]):
        self.graphs.append(gm)
        self.example_inputs.append(list(example_inputs))
        if self.transform is not None:
            self.transform(gm)
        return gm.forward

    def call_targets(self, i: int = 0) -> list[Any]:
        """The targets of graph ``i``'s call nodes, in order."""
        return [n.target for n in self.graphs[i].graph.nodes
                if n.op in ("call_function", "call_method", "call_module")]

    def __repr__(self) -> str:
        return f"CountingBackend({len(self.graphs)} graphs)"


def one_graph(fn: Callable[..., Any], *args: Any) -> torch.fx.GraphModule:
    """Compile ``fn`` with ``fullgraph=True``, check the result against eager and that
    exactly one graph was captured; returns that graph."""
    from kiln_frontend import compile as kiln_compile

    backend = CountingBackend()
    expected = fn(*args)
    actual = kiln_compile(fn, backend=backend, fullgraph=True)(*args)
    torch.testing.assert_close(actual, expected)
    assert len(backend.graphs) == 1, [gm.code for gm in backend.graphs]
    return backend.graphs[0]


def check_calls(fn: Callable[..., Any], *calls: tuple, graphs: int = 1,
                fullgraph: bool = True) -> list[torch.fx.GraphModule]:
    """``fn`` compiled agrees with eager on every argument tuple in ``calls``, in ``graphs``
    graphs; returns them."""
    from kiln_frontend import compile as kiln_compile

    backend = CountingBackend()
    compiled = kiln_compile(fn, backend=backend, fullgraph=fullgraph)
    for args in calls:
        torch.testing.assert_close(compiled(*args), fn(*args))
    assert len(backend.graphs) == graphs, [gm.code for gm in backend.graphs]
    return backend.graphs


def assert_kiln_still_captures() -> None:
    """After torch.compile ran in this process, kiln still captures: TorchDynamo's
    eval-frame function may stay installed (torch 2.11 leaves it after every compile, 2.13
    after a failed one), and kiln must stand aside only while a torch.compile'd call runs,
    never for good (every later kiln call then ran uncompiled, silently)."""
    from kiln_frontend import compile as kiln_compile
    from kiln_frontend import reset

    def canary(x):
        return x * 2 + 1

    reset()
    backend = CountingBackend()
    x = torch.arange(3.0)
    torch.testing.assert_close(kiln_compile(canary, backend=backend)(x), canary(x))
    assert len(backend.graphs) == 1, \
        f"kiln captured {len(backend.graphs)} graphs after torch.compile ran (expected 1)"
    reset()
