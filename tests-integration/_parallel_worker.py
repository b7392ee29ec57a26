"""The per-rank half of test_tensor_parallel.py and test_fsdp2.py (a module of its own for the
reason _ddp_worker.py gives: spawned children import the function they run by module name).

Each rank builds the same tiny transformer block from one seed, parallelizes two copies the
same way (tensor parallel with ``parallelize_module`` or FSDP2 with ``fully_shard``), compiles
one with kiln and trains both for a few SGD steps on its own data. The results (losses,
whether the full parameters agree, kiln's counters) go back to the parent through a queue."""

from __future__ import annotations

import copy
import gc
import os
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F

WORLD = 2
DIM, HEADS, SEQ, BATCH, STEPS = 16, 4, 6, 2, 3


class Attention(nn.Module):
    """Multi-head self-attention whose head count follows the projection's (local) width, so
    it runs unchanged on column-sharded q/k/v (HEADS / WORLD heads per rank)."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(DIM, DIM) for _ in range(3))
        self.o = nn.Linear(DIM, DIM)

    def forward(self, x):
        b, s, _ = x.shape
        hd = DIM // HEADS
        q, k, v = (p(x).view(b, s, -1, hd).transpose(1, 2) for p in (self.q, self.k, self.v))
        att = (q @ k.transpose(-2, -1) / hd**0.5).softmax(-1)
        return self.o((att @ v).transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn, self.mlp = Attention(), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Tiny(nn.Module):
    def __init__(self, layers: int = 2):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.head = nn.Linear(DIM, DIM)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def tensor_parallel(model: Tiny, mesh) -> Tiny:
    """Megatron-style: q/k/v and up column-parallel, o and down row-parallel."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    plan = {}
    for i in range(len(model.blocks)):
        for name in ("attn.q", "attn.k", "attn.v", "mlp.up"):
            plan[f"blocks.{i}.{name}"] = ColwiseParallel()
        for name in ("attn.o", "mlp.down"):
            plan[f"blocks.{i}.{name}"] = RowwiseParallel()
    return parallelize_module(model, mesh, plan)


def fsdp2(model: Tiny, mesh) -> Tiny:
    """FSDP2 as its docs recommend: each block its own group, then the root."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _full(p: torch.Tensor) -> torch.Tensor:
    return p.full_tensor() if hasattr(p, "full_tensor") else p


def train(rank: int, kind: str, mode: str) -> dict:
    """``kind``: "tp" or "fsdp2"; ``mode``: how kiln compiles (``whole``: the root module,
    ``fullgraph``: the root with fullgraph=True, ``blocks``: each block on its own)."""
    import kiln
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (WORLD,))
    torch.manual_seed(0)
    model = Tiny()
    ref = copy.deepcopy(model)
    wrap = tensor_parallel if kind == "tp" else fsdp2
    model, ref = wrap(model, mesh), wrap(ref, mesh)
    if mode == "blocks":
        for i, block in enumerate(model.blocks):
            model.blocks[i] = kiln.compile(block)
        compiled = model
    else:
        compiled = kiln.compile(model, fullgraph=(mode == "fullgraph"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    # tensor parallel: every rank sees the same batch; FSDP2: each rank its own
    gen = torch.Generator().manual_seed(100 + (rank if kind == "fsdp2" else 0))
    losses, ref_losses = [], []
    for _ in range(STEPS):
        x = torch.randn(BATCH, SEQ, DIM, generator=gen)
        y = torch.randn(BATCH, SEQ, DIM, generator=gen)
        for m, o, out in ((compiled, opt, losses), (ref, opt_ref, ref_losses)):
            o.zero_grad()
            loss = F.mse_loss(m(x), y)
            loss.backward()
            o.step()
            out.append(loss.item())
    s = kiln.stats()
    return {
        "losses": losses,
        "ref_losses": ref_losses,
        "losses_close": all(abs(a - b) <= 1e-5 + 1e-4 * abs(b)
                            for a, b in zip(losses, ref_losses, strict=True)),
        "params_close": all(
            torch.allclose(_full(p), _full(q), rtol=1e-4, atol=1e-5)
            for p, q in zip(model.parameters(), ref.parameters(), strict=True)),
        "dtensor_params": sum(type(p).__name__ == "DTensor" for p in model.parameters()),
        "params": len(list(model.parameters())),
        "graphs_compiled": s.graphs_compiled,
        "training_graphs": s.training_graphs,
        "backward": s.backward_graphs_compiled,
        "subclass_graphs": _subclass_graphs(),
        "eager_fallbacks": s.eager_fallbacks,
        "fallback_reasons": dict(s.fallback_reasons),
        "compile_failures": dict(s.compile_failures),
        "aten_fallbacks": dict(s.aten_fallbacks),
    }


def _subclass_graphs() -> int:
    from kiln.stats import counters

    return counters["subclass_graphs"]


def worker(rank: int, store_file: str, cache_dir: str, runs: list, results) -> None:
    """One rank: meets the other through a FileStore (no port to race for), runs each
    (kind, mode) of ``runs`` and puts one result per run on the queue."""
    os.environ["KILN_CACHE_DIR"] = cache_dir
    torch.set_num_threads(1)
    import torch.distributed as dist

    try:
        import kiln
        import kiln_frontend

        dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank,
                                world_size=WORLD)
        for kind, mode in runs:
            kiln_frontend.reset()
            kiln.reset_stats()
            try:
                results.put({"rank": rank, "kind": kind, "mode": mode,
                             **train(rank, kind, mode)})
            except Exception:  # noqa: BLE001 - reported to the parent, which fails the test
                results.put({"rank": rank, "kind": kind, "mode": mode,
                             "error": traceback.format_exc()})
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


def run_ranks(tmp_path, runs: list) -> list[dict]:
    """Spawn WORLD ranks running ``runs``; the results of every rank and run."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    try:
        mp.start_processes(worker, args=(str(tmp_path / "store"), str(tmp_path / "kiln-cache"),
                                         runs, results),
                           nprocs=WORLD, join=True, start_method="spawn")
    except mp.ProcessExitedException as e:
        reported = []
        while not results.empty():
            reported.append(results.get(timeout=5))
        raise AssertionError(f"{e}; what the ranks reported before: {reported}") from e
    return [results.get(timeout=30) for _ in range(WORLD * len(runs))]
