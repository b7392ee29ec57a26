"""``kiln.reset()``: like ``torch.compiler.reset()``, the next call compiles again."""

from __future__ import annotations

import kiln
import torch


def test_reset_forgets_compiled_code_and_counters():
    kiln.reset()  # counters start at zero whatever the tests before compiled
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(x):
        return x.sin() + 1

    compiled = kiln.compile(f, backend=backend)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), f(x))
    compiled(x)
    assert len(graphs) == 1
    from kiln.stats import counters

    counters["graphs_compiled"] += 1  # as if the kiln backend had compiled one
    assert kiln.stats().graphs_compiled == 1
    kiln.reset()
    assert kiln.stats().graphs_compiled == 0
    torch.testing.assert_close(compiled(x), f(x))
    assert len(graphs) == 2
