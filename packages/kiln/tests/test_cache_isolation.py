"""conftest's ``kiln_cache_dir``: every test compiles in its own empty ``KILN_CACHE_DIR``, so
a test that counts compiles cannot pass on what an earlier test (or session) stored."""

from __future__ import annotations

import kiln
import kiln.cache
import kiln_runtime
import pytest
import torch
from kiln.backend import kiln_backend


def _f(x):
    return (x.sin() + 1).sum(0)


@pytest.mark.parametrize("run", ["first", "second"])
def test_each_test_compiles_in_its_own_empty_cache(run, kiln_cache_dir, monkeypatch, needs_cpp):
    """The second run compiles the graph the first stored and still misses: the graph cache
    is on and only the folder differs."""
    monkeypatch.setenv("KILN_GRAPH_CACHE", "1")
    assert kiln_runtime.cache_dir() == kiln_cache_dir
    x = torch.randn(4, 3)
    before = kiln.stats()
    compiled = kiln_backend(torch.fx.symbolic_trace(_f), [x])
    kiln.cache.flush()
    torch.testing.assert_close(compiled(x), _f(x))
    after = kiln.stats()
    assert (after.graph_cache_hits - before.graph_cache_hits,
            after.graph_cache_misses - before.graph_cache_misses) == (0, 1)
