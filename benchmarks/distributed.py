"""DDP, FSDP2 and tensor parallel training: eager vs torch.compile vs kiln, 2 ranks (issue 29).

    python benchmarks/distributed.py            # 2 GPUs, NCCL, bf16 (the lent nvidia-h200-x2)
    python benchmarks/distributed.py --smoke    # 2 processes, CPU, gloo, tiny fp32 (CI-sized)

Each of ``--world`` processes (spawned as torchrun would: one rank per GPU) trains each
workload once per variant, in the same process group, from the same initial weights (seed 0):

- ``ddp``: a GPT-2-shaped model (token + position embeddings, pre-norm blocks with SDPA, GELU
  MLP) under ``DistributedDataParallel``; each rank its own batch (seed 1000 + rank);
- ``fsdp2``: the same model, ``fully_shard`` on each block and on the root; compiled per block
  (``torch.compile``/``kiln.compile`` of each block, FSDP2's hooks around it);
- ``tp``: ``--tp-blocks`` MLP blocks (d -> 4d -> d, residual) with ``ColwiseParallel`` up and
  ``RowwiseParallel`` down (``parallelize_module``); every rank the same batch.

Variants: ``eager`` (the reference), ``torch.compile`` and ``kiln`` (each with fresh compiler
state). Checks on rank 0 against eager: every step's loss (fp32 rtol 1e-4; bf16 rtol 2e-2) and
kiln's counters (graphs compiled, eager fallbacks, compile failures). Reports the median step
time after the warm-up steps (CUDA-synchronized) and the first step (the compile).
Writes ``benchmarks/results/distributed_2gpu.json`` (``distributed_smoke.json`` with
``--smoke``; ``$OUT/distributed.json`` when ``$OUT`` is set) and prints a table. The parent
kills the ranks at ``--timeout`` seconds and still writes what it got.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import queue
import socket
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _common import RESULTS_DIR, first_line, fresh_cache_dirs, markdown_table  # noqa: E402
from _models import PreNormBlock  # noqa: E402

WORKLOADS = ("ddp", "fsdp2", "tp")
VARIANTS = ("eager", "torch.compile", "kiln")


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int
    d_model: int
    heads: int
    layers: int
    seq: int
    batch: int  # per rank
    tp_d: int  # tensor parallel: MLP width d (hidden 4d)
    tp_blocks: int
    tp_tokens: int
    steps: int
    warmup: int
    dtype: torch.dtype
    loss_rtol: float


CONFIGS = {
    # the shapes: GPT-2-sized 6 layers, seq 512, batch 8 per rank; TP 4 x 4096->16384
    "gpu": Config(vocab=50304, d_model=768, heads=12, layers=6, seq=512, batch=8, tp_d=4096,
                  tp_blocks=4, tp_tokens=4096, steps=20, warmup=5, dtype=torch.bfloat16,
                  loss_rtol=2e-2),
    "smoke": Config(vocab=64, d_model=32, heads=4, layers=2, seq=8, batch=2, tp_d=16,
                    tp_blocks=2, tp_tokens=8, steps=4, warmup=1, dtype=torch.float32,
                    loss_rtol=1e-4),
}


class GPT(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.randn(cfg.seq, cfg.d_model) * 0.02)
        self.blocks = nn.ModuleList(PreNormBlock(cfg.d_model, cfg.heads, causal=True)
                                    for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class MLPBlock(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x)))


class MLPStack(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.blocks = nn.ModuleList(MLPBlock(cfg.tp_d) for _ in range(cfg.tp_blocks))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


# ------------------------------------------------------------------------------ one rank


def _fresh(variant: str):
    if variant == "kiln":
        import kiln
        import kiln_frontend

        kiln_frontend.reset()
        kiln.reset_stats()
        return kiln.compile
    if variant == "torch.compile":
        import torch._dynamo

        torch._dynamo.reset()
        return torch.compile
    return None


def build(workload: str, variant: str, cfg: Config, device, mesh):
    """(module to call, module whose parameters train) for one workload and variant."""
    compile_fn = _fresh(variant)
    torch.manual_seed(0)
    if workload == "tp":
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        model = MLPStack(cfg).to(device, cfg.dtype)
        plan = {}
        for i in range(cfg.tp_blocks):
            plan[f"blocks.{i}.up"], plan[f"blocks.{i}.down"] = ColwiseParallel(), RowwiseParallel()
        model = parallelize_module(model, mesh, plan)
        return (compile_fn(model) if compile_fn else model), model
    model = GPT(cfg).to(device, cfg.dtype)
    if workload == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        return (compile_fn(ddp) if compile_fn else ddp), ddp
    from torch.distributed.fsdp import fully_shard

    for i, block in enumerate(model.blocks):
        fully_shard(block, mesh=mesh)
        if compile_fn:
            model.blocks[i] = compile_fn(block)
    fully_shard(model, mesh=mesh)
    return model, model


def batches(workload: str, cfg: Config, rank: int, device) -> list:
    gen = torch.Generator().manual_seed(1000 + (0 if workload == "tp" else rank))
    out = []
    for _ in range(cfg.steps):
        if workload == "tp":
            x = torch.randn(cfg.tp_tokens, cfg.tp_d, generator=gen)
            out.append((x.to(device, cfg.dtype), None))
        else:
            t = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=gen)
            out.append((t[:, :-1].to(device), t[:, 1:].to(device)))
    return out


def loss_of(workload: str, out, target):
    if workload == "tp":
        return out.float().square().mean()
    return F.cross_entropy(out.float().flatten(0, 1), target.flatten())


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_one(workload: str, variant: str, cfg: Config, rank: int, device, mesh) -> dict:
    call, owner = build(workload, variant, cfg, device, mesh)
    opt = torch.optim.SGD(owner.parameters(), lr=0.01)
    losses, times = [], []
    for x, y in batches(workload, cfg, rank, device):
        _sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_of(workload, call(x), y)
        loss.backward()
        opt.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    r = {"losses": losses, "first_step_s": times[0],
         "median_step_ms": 1e3 * statistics.median(times[cfg.warmup:])}
    if variant == "kiln":
        import kiln

        s = kiln.stats()
        r["kiln"] = {"graphs_compiled": s.graphs_compiled, "training_graphs": s.training_graphs,
                     "eager_fallbacks": s.eager_fallbacks,
                     "compile_failures": dict(s.compile_failures),
                     "aten_fallbacks": dict(s.aten_fallbacks)}
    return r


def worker(rank: int, args, port: int, results) -> None:
    cfg = CONFIGS["smoke" if args.smoke else "gpu"]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(args.world), LOCAL_RANK=str(rank), NCCL_NVLS_ENABLE="0")
    fresh_cache_dirs(f"kiln-dist-{rank}-")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if args.smoke:
        torch.set_num_threads(1)
        device, backend = torch.device("cpu"), "gloo"
    else:
        device, backend = torch.device("cuda", rank), "nccl"
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(backend, rank=rank, world_size=args.world)
        mesh = init_device_mesh(device.type, (args.world,))
        for workload in args.workloads:
            for variant in args.variants:
                try:
                    r = run_one(workload, variant, cfg, rank, device, mesh)
                except Exception as e:  # noqa: BLE001 - reported, the run goes on
                    r = {"error": first_line(e, 300), "traceback": traceback.format_exc()}
                if rank == 0:
                    results.put({"workload": workload, "variant": variant, **r})
                dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        results.close()
        results.join_thread()


def check(rows: list[dict], cfg: Config) -> None:
    """Each variant's losses against eager's, in place (``losses_match``)."""
    ref = {r["workload"]: r.get("losses") for r in rows if r["variant"] == "eager"}
    for r in rows:
        want, got = ref.get(r["workload"]), r.get("losses")
        r["losses_match"] = bool(want and got) and all(
            abs(a - b) <= cfg.loss_rtol * abs(b) + 1e-5 for a, b in zip(got, want, strict=True))


def print_table(rows: list[dict]) -> None:
    body = []
    for r in rows:
        if "error" in r:
            body.append([r["workload"], r["variant"], "error", "", r["error"][:80]])
            continue
        k = r.get("kiln")
        note = "" if k is None else (f"{k['graphs_compiled']} graphs, {k['eager_fallbacks']} "
                                     f"eager fallbacks, {sum(k['compile_failures'].values())} "
                                     "compile failures")
        body.append([r["workload"], r["variant"], f"{r['median_step_ms']:.2f} ms",
                     f"{r['first_step_s']:.1f} s", ("losses equal" if r["losses_match"]
                                                    else "LOSSES DIFFER") + ("; " + note if note else "")])
    print(markdown_table(["workload", "variant", "median step", "first step", "check"], body))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny fp32 models")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--timeout", type=float, default=540.0, help="seconds for the whole run")
    args = p.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.variants = ["eager"] + [v for v in args.variants.split(",") if v and v != "eager"]
    if set(args.workloads) - set(WORKLOADS) or set(args.variants) - set(VARIANTS):
        p.error(f"workloads are {WORKLOADS}, variants {VARIANTS}")
    if not args.smoke and torch.cuda.device_count() < args.world:
        raise SystemExit(f"{args.world} ranks need {args.world} GPUs "
                         f"(found {torch.cuda.device_count()}); --smoke runs on CPU")
    cfg = CONFIGS["smoke" if args.smoke else "gpu"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = mp.start_processes(worker, args=(args, port, results), nprocs=args.world,
                               join=False, start_method="spawn")
    rows: list[dict] = []
    deadline = time.monotonic() + args.timeout
    expected = len(args.workloads) * len(args.variants)
    while len(rows) < expected and time.monotonic() < deadline:
        try:
            rows.append(results.get(timeout=5))
        except queue.Empty:
            if not any(p.is_alive() for p in procs.processes):
                break
    for proc in procs.processes:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    check(rows, cfg)
    print_table(rows)
    out = {"config": {k: str(v) for k, v in dataclasses.asdict(cfg).items()},
           "world": args.world, "torch": torch.__version__, "python": platform.python_version(),
           "device": torch.cuda.get_device_name(0) if not args.smoke else "cpu",
           "complete": len(rows) == expected, "rows": rows}
    path = (Path(os.environ["OUT"]) / "distributed.json" if os.environ.get("OUT") else
            RESULTS_DIR / ("distributed_smoke.json" if args.smoke else "distributed_2gpu.json"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")
    return 0 if out["complete"] and all("error" not in r and r["losses_match"] for r in rows) \
        else 1


if __name__ == "__main__":
    raise SystemExit(main())
