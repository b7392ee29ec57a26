"""DDP benchmark: eager DDP vs torch.compile DDP vs kiln DDP, 2 processes (issue 14).

    python benchmarks/ddp.py --device cpu          # 2 processes, gloo, a tiny model (CI-sized)
    python benchmarks/ddp.py --device cuda         # 2 GPUs, NCCL, d_model 512, 4 layers
    bash scripts/device_tests.sh bench_ddp         # the same on the lent 2-GPU machine

Each of ``--world`` processes (one per GPU under CUDA) trains a small transformer (token
embedding, pre-norm encoder blocks with ``F.scaled_dot_product_attention``, layernorm, GELU
MLP; fp32) for ``--steps`` SGD steps, wrapped in ``DistributedDataParallel``, once per variant in
the same process group, each time from the same initial weights (seed 0) and the same
per-rank batches (seed 1000 + rank):

- ``eager``: ``DDP(model)``, the reference;
- ``torch.compile``: ``torch.compile(DDP(model))`` (dynamo's DDP optimizer splits at buckets);
- ``kiln``: ``kiln.compile(DDP(model))`` (kiln splits its graph at DDP's bucket boundaries,
  ``kiln/ddp.py``);
- ``kiln-inner``: ``DDP(kiln.compile(model))``, the form docs/training.md documents (its
  first step reuses the ``kiln`` variant's on-disk cache: not a cold compile).

Checks, on rank 0, against eager DDP: every step's loss (``assert_close`` rtol=1e-4,
atol=1e-5: one fp32 loss of order log(vocab), only kernel order differs) and every final
parameter after all steps (rtol=1e-3, atol=1e-4: 20 steps of SGD carry the fp32 rounding
differences of different kernel orders (typically a few 1e-5..1e-4 relative), and atol covers
parameters near zero; the same tolerance as benchmarks/train.py's grads). Every variant's
final parameters must also be bitwise the same on every rank (DDP's all-reduce). A failing
variant is reported (error or max abs diff) and the run goes on.

Reports: median step time over the steps after the 3 warm-up steps (CUDA-synchronized), the first
step's time (cold compile, with fresh on-disk caches) separately, kiln.stats() graph counts.
Writes ``$OUT/ddp.json`` when ``$OUT`` is set, else ``benchmarks/results/ddp-<device>.json``.
A hang cannot eat the GPU budget: each variant has an alarm, the process group a timeout,
and the parent kills the workers at ``--timeout`` seconds and still writes what it got.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import queue
import signal
import socket
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _common import RESULTS_DIR, first_line, fresh_cache_dirs  # noqa: E402
from _models import PreNormBlock  # noqa: E402

VARIANTS = ("eager", "torch.compile", "kiln", "kiln-inner")
#: (rtol, atol) of the per-step losses and of the final parameters, against eager DDP
LOSS_TOL = (1e-4, 1e-5)
PARAM_TOL = (1e-3, 1e-4)


@dataclasses.dataclass(frozen=True)
class Config:
    """Model and run sizes (one per device; CPU is tiny so CI and gloo stay fast)."""

    vocab: int
    d_model: int
    heads: int
    layers: int
    seq: int
    batch: int  # per rank
    steps: int
    warmup: int  # steps left out of the median (the first one compiles)
    lr: float
    bucket_cap_mb: float  # DDP's bucket size: kiln splits its graph where buckets end


CONFIGS = {
    # 4 x 12.6 MB of blocks + 4 MB of embeddings: DDP's default 25 MB buckets cut it in 3
    "cuda": Config(vocab=2048, d_model=512, heads=8, layers=4, seq=128, batch=16, steps=20,
                   warmup=3, lr=0.05, bucket_cap_mb=25.0),
    # 2 x 0.8 MB blocks in 1 MB buckets, so kiln still splits at bucket boundaries (dynamo's
    # DDP optimizer refuses buckets under DDP's 1 MB first bucket)
    "cpu": Config(vocab=128, d_model=128, heads=4, layers=2, seq=16, batch=4, steps=20,
                  warmup=3, lr=0.05, bucket_cap_mb=1.0),
}


# ------------------------------------------------------------------------------ the model


class Encoder(nn.Module):
    """Token + position embeddings, ``layers`` blocks, a final layernorm and a vocab head."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.randn(cfg.seq, cfg.d_model) * 0.02)
        self.blocks = nn.ModuleList(PreNormBlock(cfg.d_model, cfg.heads) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, tokens):
        x = self.tok(tokens) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def make_batches(cfg: Config, rank: int, device: torch.device) -> list[tuple]:
    """``cfg.steps`` (tokens, targets) batches of this rank, the same for every variant."""
    gen = torch.Generator().manual_seed(1000 + rank)
    out = []
    for _ in range(cfg.steps):
        tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=gen)
        targets = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=gen)
        out.append((tokens.to(device), targets.to(device)))
    return out


# ------------------------------------------------------------------------------ setup


def nccl_env(environ: dict | None = None) -> dict:
    """Keep NVLink multicast off (``NCCL_NVLS_ENABLE=0``); every other NCCL variable stays as
    the machine set it. Mutates and returns ``environ`` (``os.environ`` by default)."""
    environ = os.environ if environ is None else environ
    environ["NCCL_NVLS_ENABLE"] = "0"
    return environ


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_for(device: str) -> str:
    return {"cuda": "nccl", "cpu": "gloo"}[device]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=tuple(CONFIGS), default="cpu")
    p.add_argument("--world", type=int, default=2, help="processes (GPUs under cuda)")
    p.add_argument("--steps", type=int, help="training steps per variant (default 20)")
    p.add_argument("--only", default="", help=f"comma-separated variants of {VARIANTS}")
    p.add_argument("--bucket-cap-mb", type=float, help="DDP bucket size (default per device)")
    p.add_argument("--timeout", type=float, help="seconds for the whole run (cuda 450, cpu 600)")
    p.add_argument("--variant-timeout", type=float, help="seconds per variant (cuda 200, cpu 300)")
    args = p.parse_args(argv)
    only = {x for x in args.only.split(",") if x}
    if only - set(VARIANTS):
        p.error(f"--only: unknown variants {sorted(only - set(VARIANTS))}; known: {VARIANTS}")
    args.variants = [v for v in VARIANTS if not only or v in only]
    if "eager" not in args.variants:
        args.variants.insert(0, "eager")  # the reference of every check
    if args.timeout is None:
        args.timeout = 450.0 if args.device == "cuda" else 600.0
    if args.variant_timeout is None:
        args.variant_timeout = 200.0 if args.device == "cuda" else 300.0
    cfg = CONFIGS[args.device]
    overrides = {"steps": args.steps, "bucket_cap_mb": args.bucket_cap_mb}
    args.config = dataclasses.replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    if args.config.steps <= args.config.warmup:
        p.error(f"--steps must be more than the {args.config.warmup} warm-up steps")
    return args


def check_devices(device: str, world: int) -> None:
    """Fail early, with the reason, where the machine cannot run ``world`` ranks."""
    import torch.distributed as dist

    if not dist.is_available():
        raise SystemExit("torch.distributed is not available in this torch build")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no CUDA device is available")
        if torch.cuda.device_count() < world:
            raise SystemExit(f"--device cuda: {world} ranks need {world} GPUs, "
                             f"found {torch.cuda.device_count()}")
        if not dist.is_nccl_available():
            raise SystemExit("--device cuda: NCCL is not available in this torch build")
    elif not dist.is_gloo_available():
        raise SystemExit("--device cpu: gloo is not available in this torch build")


def log(msg: str) -> None:
    print(f"[{datetime.datetime.now(datetime.UTC):%H:%M:%S}] {msg}", flush=True)


# ------------------------------------------------------------------------------ one rank


class _Timeout(Exception):
    pass


def _alarm(seconds: float) -> None:
    def on_alarm(signum, frame):
        raise _Timeout(f"variant took longer than {seconds:.0f} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _ddp(model: nn.Module, device: torch.device, cfg: Config) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    return DDP(model, device_ids=ids, bucket_cap_mb=cfg.bucket_cap_mb)


def _fresh_kiln():
    import kiln
    import kiln_frontend

    kiln_frontend.reset()
    kiln.reset_stats()
    return kiln


def _torch_compile(ddp: nn.Module) -> nn.Module:
    import torch._dynamo

    torch._dynamo.reset()
    return torch.compile(ddp)


#: variant -> how it wraps a fresh model in DDP (and compiles it), run in this order
WRAPPERS = {
    "eager": lambda model, device, cfg: _ddp(model, device, cfg),
    "torch.compile": lambda model, device, cfg: _torch_compile(_ddp(model, device, cfg)),
    "kiln": lambda model, device, cfg: _fresh_kiln().compile(_ddp(model, device, cfg)),
    "kiln-inner": lambda model, device, cfg: _ddp(_fresh_kiln().compile(model), device, cfg),
}


assert tuple(WRAPPERS) == VARIANTS


def wrap(variant: str, model: nn.Module, device: torch.device, cfg: Config) -> nn.Module:
    """``model`` under DDP, compiled as ``variant`` says (fresh compiler state each time)."""
    if variant not in WRAPPERS:
        raise ValueError(f"unknown variant {variant!r}; known: {tuple(WRAPPERS)}")
    return WRAPPERS[variant](model, device, cfg)


def train(variant: str, cfg: Config, batches: list, device: torch.device) -> tuple[dict, nn.Module]:
    """``cfg.steps`` SGD steps of ``variant``: per-step losses and times, and the model."""
    torch.manual_seed(0)
    model = Encoder(cfg).to(device)
    ddp = wrap(variant, model, device, cfg)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    losses, times = [], []
    for tokens, targets in batches:
        _sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(tokens).flatten(0, 1), targets.flatten())
        loss.backward()
        opt.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    steady = times[cfg.warmup:]
    result = {
        "losses": losses,
        "first_step_s": times[0],
        "step_s": statistics.median(steady),
        "step_s_min": min(steady),
        "step_s_max": max(steady),
    }
    return result, model


def kiln_graph_counts() -> dict:
    import kiln
    from kiln.stats import counters

    s = kiln.stats()
    return {
        "training_graphs": s.training_graphs,
        "forward_graphs": s.forward_graphs_compiled,
        "backward_graphs": s.backward_graphs_compiled,
        "ddp_split_graphs": counters["ddp_split_graphs"],
        "eager_fallbacks": s.eager_fallbacks,
        "fallback_reasons": dict(s.fallback_reasons),
        "interpreter_fallbacks": s.interpreter_fallbacks,
        "saved_bytes": s.saved_bytes,
        "graph_cache_hits": s.graph_cache_hits,
    }


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def ranks_agree(model: nn.Module, world: int) -> bool:
    """Whether every rank holds bitwise the same parameters (DDP keeps them in sync)."""
    import torch.distributed as dist

    flat = flat_params(model)
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    return all(torch.equal(gathered[0], g) for g in gathered)


def compare(result: dict, model: nn.Module, ref: dict) -> dict:
    """Losses and final parameters of one variant against eager DDP's (rank 0)."""
    losses = torch.tensor(result["losses"], dtype=torch.float64)
    ref_losses = torch.tensor(ref["losses"], dtype=torch.float64)
    out: dict[str, Any] = {
        "loss_max_abs_diff": (losses - ref_losses).abs().max().item(),
        "param_max_abs_diff": 0.0,
        "param_max_rel_diff": 0.0,
    }
    errors = []
    try:
        torch.testing.assert_close(losses, ref_losses, rtol=LOSS_TOL[0], atol=LOSS_TOL[1])
    except AssertionError as e:
        errors.append(f"losses: {e}")
    for (name, p), q in zip(model.named_parameters(), ref["params"], strict=True):
        p = p.detach().cpu()
        diff = (p - q).abs()
        out["param_max_abs_diff"] = max(out["param_max_abs_diff"], diff.max().item())
        rel = (diff.max() / q.abs().max().clamp_min(1e-12)).item()
        out["param_max_rel_diff"] = max(out["param_max_rel_diff"], rel)
        try:
            torch.testing.assert_close(p, q, rtol=PARAM_TOL[0], atol=PARAM_TOL[1])
        except AssertionError as e:
            errors.append(f"param {name}: {first_line(e, 300)}")
    out["ok"] = not errors
    if errors:
        out["check_errors"] = errors[:5]
    return out


def run_variant(variant: str, cfg: Config, batches, device, world, rank, ref, timeout) -> dict:
    """One variant, timed and checked; an error is recorded, never raised."""
    r: dict[str, Any] = {"variant": variant, "rank": rank}
    try:
        _alarm(timeout)
        result, model = train(variant, cfg, batches, device)
        r.update(result)
        r["ranks_agree"] = ranks_agree(model, world)
        if variant.startswith("kiln"):
            r["kiln"] = kiln_graph_counts()
        if variant == "eager":
            ref["losses"] = result["losses"]
            ref["params"] = [p.detach().cpu().clone() for p in model.parameters()]
            r["ok"] = r["ranks_agree"]
        elif ref:
            r.update(compare(result, model, ref))
            r["ok"] = r["ok"] and r["ranks_agree"]
        else:
            r.update(ok=False, error="no eager reference (eager DDP failed)")
        if "kiln" in r and not r["kiln"]["backward_graphs"]:
            r.update(ok=False, error=f"kiln compiled no backward graph: {r['kiln']}")
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        r.update(ok=False, error=first_line(e, 300), traceback=traceback.format_exc(limit=6))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return r


def worker(rank: int, args: argparse.Namespace, port: int, results) -> None:
    """One rank: join the process group, run every variant, send rank 0's results back."""
    device_kind = args.device
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device_kind == "cuda":
        nccl_env()
    fresh_cache_dirs(f"kiln-ddp-rank{rank}-")  # cold compiles, no race between the ranks
    import torch.distributed as dist

    try:
        if device_kind == "cuda":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
            torch.backends.cuda.matmul.allow_tf32 = False  # fp32 checks: no TF32 anywhere
            torch.backends.cudnn.allow_tf32 = False
        else:
            torch.set_num_threads(1)
            device = torch.device("cpu")
        dist.init_process_group(
            backend_for(device_kind), rank=rank, world_size=args.world,
            timeout=datetime.timedelta(seconds=min(args.variant_timeout, 300)),
        )
        cfg = args.config
        batches = make_batches(cfg, rank, device)
        ref: dict = {}
        for variant in args.variants:
            if rank == 0:
                log(f"{variant}: start ({cfg.steps} steps)")
            r = run_variant(variant, cfg, batches, device, args.world, rank, ref,
                            args.variant_timeout)
            if rank == 0 or "error" in r:
                results.put(r)
            if rank == 0:
                log(f"{variant}: {summary_line(r)}")
            elif "error" in r:
                log(f"rank {rank} {variant}: {r['error']}")
    except BaseException:
        results.put({"rank": rank, "variant": "setup", "ok": False,
                     "error": traceback.format_exc(limit=6)})
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# ------------------------------------------------------------------------------ the parent


def summary_line(r: dict) -> str:
    if "error" in r and "step_s" not in r:
        return f"ERROR {r['error']}"
    parts = [f"ok={r.get('ok')}", f"step {r['step_s'] * 1e3:.2f} ms",
             f"first step {r['first_step_s']:.2f} s"]
    if "loss_max_abs_diff" in r:
        parts += [f"loss max|diff| {r['loss_max_abs_diff']:.2e}",
                  f"param max|diff| {r['param_max_abs_diff']:.2e}"]
    parts.append(f"ranks agree={r.get('ranks_agree')}")
    if "kiln" in r:
        k = r["kiln"]
        parts.append(f"kiln fwd/bwd graphs {k['forward_graphs']}/{k['backward_graphs']}, "
                     f"ddp split {k['ddp_split_graphs']}, fallbacks {k['eager_fallbacks']}")
    if "error" in r:
        parts.append(f"ERROR {r['error']}")
    if "check_errors" in r:
        parts.append(f"check: {r['check_errors'][0][:200]}")
    return "; ".join(parts)


def spawn_and_collect(args: argparse.Namespace) -> tuple[list[dict], str | None]:
    """Run the ranks, kill them at ``args.timeout``; the results they sent, and why the run
    ended early (None when it did not)."""
    if args.device == "cuda":
        nccl_env()  # the children inherit it (and set it again)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = mp.start_processes(worker, args=(args, free_port(), results), nprocs=args.world,
                               join=False, start_method="spawn")
    got: list[dict] = []
    deadline = time.monotonic() + args.timeout
    problem = None
    while True:
        _drain(results, got)
        try:
            if procs.join(timeout=2):
                break
        except Exception as e:  # a rank died: the others were terminated by join
            problem = f"a worker failed: {first_line(e, 300)}"
            break
        if time.monotonic() > deadline:
            problem = f"timed out after {args.timeout:.0f} s: workers killed"
            for p in procs.processes:
                if p.is_alive():
                    p.kill()
            break
    time.sleep(0.5)
    _drain(results, got)
    return got, problem


def _drain(results, got: list) -> None:
    while True:
        try:
            got.append(results.get_nowait())
        except queue.Empty:
            return
        except (EOFError, OSError):
            return


def machine() -> dict:
    info = {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    try:  # never lose the results over a missing detail
        if torch.cuda.is_available():
            info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            info["cuda"] = torch.version.cuda
            info["nccl"] = str(torch.cuda.nccl.version())
    except Exception as e:
        info["gpu_info_error"] = first_line(e)
    info["nccl_env"] = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    return info


def output_path(device: str) -> Path:
    out = os.environ.get("OUT")
    return Path(out) / "ddp.json" if out else RESULTS_DIR / f"ddp-{device}.json"


def print_table(rows: dict[str, dict]) -> None:
    eager = rows.get("eager", {}).get("step_s")
    print(f"\n{'variant':<14} {'ok':<6} {'ms/step':>9} {'vs eager':>9} {'first step s':>13} "
          f"{'loss max|diff|':>15} {'param max|diff|':>16}")
    for name, r in rows.items():
        step = r.get("step_s")
        print(f"{name:<14} {str(r.get('ok')):<6} "
              f"{step * 1e3 if step else float('nan'):>9.2f} "
              f"{eager / step if eager and step else float('nan'):>8.2f}x "
              f"{r.get('first_step_s', float('nan')):>13.2f} "
              f"{r.get('loss_max_abs_diff', 0.0):>15.2e} {r.get('param_max_abs_diff', 0.0):>16.2e}")
        if "error" in r:
            print(f"    error: {r['error']}")
    for name, r in rows.items():
        if "kiln" in r:
            print(f"{name} graphs: {r['kiln']}")


def main(argv=None) -> int:
    args = parse_args(argv)
    check_devices(args.device, args.world)
    cfg = args.config
    log(f"ddp benchmark: {args.world} ranks, {backend_for(args.device)}, {cfg}")
    t0 = time.perf_counter()
    got, problem = spawn_and_collect(args)
    rows = {r["variant"]: r for r in got if r.get("rank") == 0 and r["variant"] in VARIANTS}
    other_errors = [r for r in got if r not in rows.values()]
    for v in args.variants:
        rows.setdefault(v, {"variant": v, "ok": False, "error": problem or "no result"})
    eager_step = rows["eager"].get("step_s")
    for r in rows.values():
        if "first_step_s" in r and eager_step:
            r["cold_compile_s"] = max(r["first_step_s"] - eager_step, 0.0)
    print_table(rows)
    for r in other_errors:
        print(f"rank {r.get('rank')} {r['variant']}: {r['error']}")
    report = {
        "command": " ".join(["python", "benchmarks/ddp.py", *(sys.argv[1:] if argv is None else argv)]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        "device": args.device,
        "backend": backend_for(args.device),
        "world": args.world,
        "config": dataclasses.asdict(cfg),
        "tolerance": {"loss": LOSS_TOL, "params": PARAM_TOL},
        "wall_s": time.perf_counter() - t0,
        "problem": problem,
        "variants": rows,
        "other_errors": other_errors,
    }
    path = output_path(args.device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str))
    log(f"results in {path} ({report['wall_s']:.0f} s)")
    return 0 if all(r.get("ok") for r in rows.values()) and not problem else 1


if __name__ == "__main__":
    raise SystemExit(main())
