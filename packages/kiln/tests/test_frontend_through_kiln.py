"""The frontend's cases that need the kiln backend behind it (moved from the frontend's tests,
which install the frontend alone): data-dependent graphs compile or run eagerly with eager's
answers, and kiln.compile of a function calling a torch.compile'd one."""

from __future__ import annotations

import logging
import time
import warnings

import kiln
import pytest
import torch
from kiln_frontend import reset
from kiln_frontend.eval_frame import counters
from torch.testing import assert_close


def test_kiln_backend_answers_are_right():
    """The kiln backend compiles these graphs or runs them eagerly with a warning: either
    way the answers are eager's."""

    def scale(x):
        return x * x.sum().item()

    def positives(x):
        return x[x > 0] * 2

    for fn in (scale, positives):
        reset()
        compiled = kiln.compile(fn, fullgraph=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(2):
                x = torch.randn(16)
                torch.testing.assert_close(compiled(x), fn(x))


@pytest.mark.parametrize("torch_backend", ["eager", "aot_eager"])
def test_kiln_package_compile_calls_torch_compiled_function(torch_backend, caplog):
    caplog.set_level(logging.INFO, logger="kiln.internal_errors")
    internal_errors = counters["internal_errors"]

    @torch.compile(backend=torch_backend)
    def g(x):
        return torch.relu(x) - 0.5

    def f(x):
        return g(x + 1).sum(0) * 2

    x = torch.randn(3, 4)
    t0 = time.perf_counter()
    out = kiln.compile(f)(x)
    assert time.perf_counter() - t0 < 60  # kiln's own compile of two small graphs
    assert_close(out, f(x))
    assert counters["internal_errors"] == internal_errors  # none, and none logged:
    assert not [r for r in caplog.records if r.name == "kiln.internal_errors"]
