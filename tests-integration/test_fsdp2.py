"""FSDP2 (``fully_shard`` on each transformer block, then the root) over kiln: 2 processes,
CPU, gloo (issue 29).

Each rank trains a kiln-compiled model and an uncompiled copy sharded the same way, 3 SGD
steps on its own data (FSDP2 reduce-scatters the grads), once compiling each block on its own
(FSDP2's all-gather before a block's forward and reduce-scatter after its backward run as its
hooks schedule them, around the compiled block) and once compiling the root module. Losses and
the full parameters must agree within fp32 tolerance, with compiled training graphs (forward
and backward) and no eager fallback."""

from __future__ import annotations

import pytest
from _parallel_worker import WORLD, run_ranks

MODES = ["blocks", "whole"]


@pytest.mark.timeout(300)
def test_fsdp2_training_matches_uncompiled(tmp_path):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    got = run_ranks(tmp_path, [("fsdp2", mode) for mode in MODES])
    assert len(got) == WORLD * len(MODES)
    for r in sorted(got, key=lambda r: (r.get("mode", ""), r["rank"])):
        print(r)
        assert "error" not in r, r["error"]
        # FSDP2 keeps sharded DTensor parameters between steps
        assert r["dtensor_params"] == r["params"], r
        assert r["losses_close"], r
        assert r["params_close"], r
        assert r["training_graphs"] >= 1 and r["backward"] >= 1, r
        assert r["eager_fallbacks"] == 0 and not r["compile_failures"], r
