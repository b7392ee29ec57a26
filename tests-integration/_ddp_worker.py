"""The per-rank half of test_ddp.py, in a module of its own: spawned processes import the
function they run by module name, and pytest's importlib mode gives test files names a child
cannot import (``tests-integration.test_ddp``); conftest.py puts this folder on sys.path, which
spawned children inherit."""

from __future__ import annotations

import copy
import gc
import os
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

WORLD = 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 3)

    def forward(self, x):
        return self.fc3(torch.tanh(self.fc2(F.relu(self.fc1(x)))))


#: (DDP bucket_cap_mb, pieces kiln must compile): 25 MB (DDP's default) holds the whole model,
#: 4 KB buckets end after fc1, fc2 and fc3 so kiln splits the graph in 3
CONFIGS = [(25.0, 1), (0.004, 3)]


def _worker(rank: int, store_file: str, cache_dir: str, results) -> None:
    """One rank. The ranks meet through a file (``FileStore``), not a TCP store: no port to
    race other tests for, and no store server in rank 0 that can go away while rank 1 still
    tears down. Both ranks leave together (a barrier, then the group destroyed, with the DDP
    objects collected first) and the results are on the queue's pipe before the process ends."""
    os.environ["KILN_CACHE_DIR"] = cache_dir
    torch.set_num_threads(1)
    import torch.distributed as dist

    try:
        import kiln
        import kiln_frontend

        dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=WORLD)
        for bucket_cap_mb, _ in CONFIGS:
            kiln_frontend.reset()
            kiln.reset_stats()
            results.put(
                {"rank": rank, "bucket_cap_mb": bucket_cap_mb, **_train(rank, bucket_cap_mb)}
            )
        gc.collect()
        dist.barrier()
    except BaseException:
        results.put({"rank": rank, "error": traceback.format_exc()})
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        results.close()
        results.join_thread()


def _train(rank: int, bucket_cap_mb: float) -> dict:
    import kiln
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    compiled = DDP(kiln.compile(model), bucket_cap_mb=bucket_cap_mb)
    eager = DDP(ref, bucket_cap_mb=bucket_cap_mb)
    hook_calls = []
    model.fc1.weight.register_hook(lambda g: hook_calls.append(g.shape))
    opt = torch.optim.SGD(compiled.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(eager.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    max_diff = 0.0
    for _ in range(3):
        x = torch.randn(8, 12, generator=gen)
        y = torch.randn(8, 3, generator=gen)
        for m, o in ((compiled, opt), (eager, opt_ref)):
            o.zero_grad()
            F.mse_loss(m(x), y).backward()
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
            max_diff = max(max_diff, (p.grad - q.grad).abs().max().item())
        opt.step()
        opt_ref.step()
    # all-reduced grads are the same on every rank
    grad = model.fc1.weight.grad.clone()
    gathered = [torch.empty_like(grad) for _ in range(WORLD)]
    dist.all_gather(gathered, grad)
    s = kiln.stats()
    return {
        "max_diff": max_diff,
        "ranks_agree": all(torch.equal(gathered[0], g) for g in gathered),
        "hook_calls": len(hook_calls),
        "forward": s.forward_graphs_compiled,
        "backward": s.backward_graphs_compiled,
        "eager_fallbacks": s.eager_fallbacks,
        "training_graphs": s.training_graphs,
        "params_close": all(
            torch.allclose(p, q, rtol=1e-4, atol=1e-5)
            for p, q in zip(model.parameters(), ref.parameters(), strict=True)
        ),
    }
