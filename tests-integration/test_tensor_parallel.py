"""Tensor parallel (``parallelize_module``, Colwise/Rowwise on a transformer block's attention
and MLP) over a kiln-compiled model: 2 processes, CPU, gloo (issue 29).

Each rank trains the kiln-compiled model and an uncompiled copy parallelized the same way,
3 SGD steps on the same batch; losses and the full (all-gathered) parameters must agree within
fp32 tolerance, and kiln must have compiled training graphs over DTensor parameters (forward
and backward) with no eager fallback and no failed compile. Twice: compiling the root module
(``whole``), and with ``fullgraph=True``, where the hooks ``parallelize_module`` installs
(``DTensor.from_local``, ``redistribute``, ``to_local``) are traced into the one graph, its
collectives (all-reduce, wait) extern calls, differentiated at the DTensor level (docs/tensor-subclasses.md)."""

from __future__ import annotations

import pytest
from _parallel_worker import WORLD, run_ranks


@pytest.mark.timeout(240)
def test_tensor_parallel_training_matches_uncompiled(tmp_path):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    got = run_ranks(tmp_path, [("tp", "whole"), ("tp", "fullgraph")])
    assert len(got) == 2 * WORLD
    for r in sorted(got, key=lambda r: (r.get("mode", ""), r["rank"])):
        print(r)
        assert "error" not in r, r["error"]
        assert r["dtensor_params"] == 2 * 6 * 2, r  # weight and bias of 6 linears a block
        assert r["losses_close"], r
        assert r["params_close"], r
        assert r["training_graphs"] >= 1 and r["backward"] >= 1, r
        # the linears' DTensor weights reach compiled graphs through the subclass boundary
        assert r["subclass_graphs"] >= 1, r
        assert r["eager_fallbacks"] == 0 and not r["compile_failures"], r
        if r["mode"] == "fullgraph":  # the whole model, hooks included: one training graph
            assert r["training_graphs"] == 1 and r["subclass_graphs"] == 1, r
