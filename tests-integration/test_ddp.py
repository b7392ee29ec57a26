"""DistributedDataParallel over a kiln-compiled model: 2 processes, CPU, gloo (issue 12).

Each rank trains ``DDP(kiln.compile(model))`` and an uncompiled ``DDP(model)`` copy from the
same seed on its own shard of data, 3 SGD steps; once with DDP's default 25 MB buckets (one
graph), once with 4 KB buckets, where kiln splits the graph at the bucket boundaries
(``kiln.ddp``) and compiles each piece's forward and backward on its own. After every step the grads of the compiled
model must equal the uncompiled DDP's (which are all-reduced: the same on both ranks), a
gradient hook on a parameter must have fired, and kiln must have compiled a forward and a
backward graph with no eager fallback. Results travel back through a queue; the test asserts
in the parent.
"""

from __future__ import annotations

import pytest
import torch.multiprocessing as mp
from _ddp_worker import CONFIGS, WORLD, _worker


@pytest.mark.timeout(120)
def test_ddp_compiled_model_matches_uncompiled_ddp(tmp_path):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    try:
        mp.start_processes(
            _worker,
            args=(str(tmp_path / "store"), str(tmp_path / "kiln-cache"), results),
            nprocs=WORLD,
            join=True,
            start_method="spawn",
        )
    except mp.ProcessExitedException as e:  # a crash: say how far each rank had got
        reported = []
        while not results.empty():
            reported.append(results.get(timeout=5))
        raise AssertionError(f"{e}; what the ranks reported before: {reported}") from e
    got = [results.get(timeout=30) for _ in range(WORLD * len(CONFIGS))]
    for r in got:
        assert "error" not in r, r.get("error")
    pieces_of = dict(CONFIGS)
    for r in sorted(got, key=lambda r: (r["bucket_cap_mb"], r["rank"])):
        print(r)
        pieces = pieces_of[r["bucket_cap_mb"]]
        assert r["ranks_agree"], r
        assert r["params_close"], r
        assert r["hook_calls"] == 3, r
        # one compiled forward and backward per piece (graph split at DDP bucket boundaries)
        assert r["training_graphs"] == pieces, r
        assert r["forward"] == pieces and r["backward"] == pieces, r
        assert r["eager_fallbacks"] == 0, r
