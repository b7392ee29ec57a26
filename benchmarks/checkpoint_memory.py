"""What a training step keeps alive for the backward, on the CPU: eager, ``torch.compile``
and ``kiln.compile`` in one run, with and without activation checkpointing.

The CPU proxy of ``checkpoint_gpu.py``'s peak memory (issue 28 item 4). Measured with the
CPU allocator's own record (``torch.profiler`` with ``profile_memory=True``: every
allocation and free with its size and time), on a warm step (after the compile and two
steps), gradients set to None before it:

- ``kept_mb``: bytes the forward allocated and had not freed when it returned: what the
  step keeps alive until the backward (saved activations, checkpoint inputs, the outputs);
- ``saved_mb``: ``kept_mb`` less the forward's outputs (loss, logits): the bytes kept *for
  the backward* (the table's column);
- ``peak_mb``: the step's peak above its start (forward, then backward with the grads);
- ``hook_saved_mb``: unique storages packed by ``torch.autograd.graph.saved_tensors_hooks``
  during the forward that are not parameters or inputs (a cross-check for the compiled
  rows: a compiled forward saves through one autograd.Function; eager's non-reentrant
  checkpoint keeps its inputs in a closure that the hooks never see);
- loss and gradients against eager's (``torch.testing.assert_close``, float32).

Workloads: HF ``GPT2LMHeadModel`` from a ``GPT2Config`` (float32, dropout off) without
checkpointing, with ``gradient_checkpointing_enable()`` (non-reentrant and reentrant), and
with selective checkpointing (``create_selective_checkpoint_contexts``, a policy saving
matmuls); and a plain PyTorch pre-norm transformer calling ``torch.utils.checkpoint``
directly (reentrant and not).

    python benchmarks/checkpoint_memory.py            # the sizes below, ~15 min on 2 cores
    python benchmarks/checkpoint_memory.py --smoke    # tiny sizes, ~3 min
    python benchmarks/checkpoint_memory.py --only gpt2_ckpt --compilers kiln

Writes benchmarks/results/checkpoint-memory-cpu.json (``--smoke``: ``..._smoke.json``;
``$OUT`` when set) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
MB = 2**20

# ------------------------------------------------------------------------------ workloads


def _save_matmuls(ctx, op, *args, **kwargs):
    """The selective policy: keep matmul outputs, recompute the rest."""
    if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
              torch.ops.aten.bmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context():
    return create_selective_checkpoint_contexts(_save_matmuls)


def _gpt2(a, checkpointing: str | None):
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests-integration"))
    import _torchvision_shim

    _torchvision_shim.install()
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=a.layers, n_embd=a.width, n_head=a.heads, vocab_size=a.vocab,
                     n_positions=max(1024, a.seq), resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg)
    if checkpointing is not None:
        kwargs = {"use_reentrant": checkpointing == "reentrant"}
        if checkpointing == "selective":
            kwargs["context_fn"] = _selective_context
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False
    model.train()
    torch.manual_seed(1)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq))

    def step(m):
        out = m(input_ids=ids, labels=ids)
        return out.loss, (out.logits,)

    return model, step


class Block(nn.Module):
    """A pre-norm transformer block (SDPA attention, GELU MLP)."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    """Blocks each under ``torch.utils.checkpoint`` (``reentrant``: True, False, or None for
    no checkpointing), as user code writes it without HF's helper."""

    def __init__(self, d: int, heads: int, layers: int, reentrant: bool | None):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.reentrant = reentrant

    def forward(self, x):
        for blk in self.blocks:
            if self.reentrant is None:
                x = blk(x)
            else:
                x = checkpoint(blk, x, use_reentrant=self.reentrant)
        return self.norm(x).float().pow(2).mean()


def _plain(a, reentrant: bool | None):
    torch.manual_seed(0)
    model = Transformer(a.width, a.heads, a.layers, reentrant).train()
    torch.manual_seed(1)
    x = torch.randn(a.batch, a.seq, a.width, requires_grad=True)

    def step(m):
        return m(x), ()

    return model, step


WORKLOADS: dict[str, Callable] = {
    "gpt2": lambda a: _gpt2(a, None),
    "gpt2_ckpt": lambda a: _gpt2(a, "non_reentrant"),
    "gpt2_ckpt_reentrant": lambda a: _gpt2(a, "reentrant"),
    "gpt2_selective_mm": lambda a: _gpt2(a, "selective"),
    "plain": lambda a: _plain(a, None),
    "plain_ckpt": lambda a: _plain(a, False),
    "plain_ckpt_reentrant": lambda a: _plain(a, True),
}

# ------------------------------------------------------------------------------ compilers


def _kiln(m):
    import kiln

    return kiln.compile(m)


COMPILERS: dict[str, Callable] = {
    "eager": lambda m: m,
    "torch_compile": lambda m: torch.compile(m),
    "kiln": _kiln,
}


def _reset() -> None:
    import kiln

    torch._dynamo.reset()
    kiln.reset()


# ---------------------------------------------------------------------------- measurement


def _alloc_timeline(prof) -> list[int]:
    """The allocator's byte deltas (allocations +, frees -) in time order."""
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    return [e.nbytes() for e in events]


def _net_and_peak(deltas: list[int]) -> tuple[int, int]:
    total = peak = 0
    for d in deltas:
        total += d
        peak = max(peak, total)
    return total, peak


def _storages(tensors) -> dict[int, int]:
    out = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.layout == torch.strided:
            s = t.untyped_storage()
            out[s.data_ptr()] = s.nbytes()
    return out


def measure(model, compiled, step) -> dict:
    """One warm step of ``compiled`` (section 'measurement' of the module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    model.zero_grad(set_to_none=True)
    alive = _storages([*model.parameters(), *model.buffers()])
    packed: dict[int, int] = {}

    def pack(t):
        if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.device.type != "meta":
            s = t.untyped_storage()
            if s.data_ptr() not in alive and s.nbytes():
                packed[s.data_ptr()] = s.nbytes()
        return t

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as fw_prof:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss, outputs = step(compiled)
    kept, fw_peak = _net_and_peak(_alloc_timeline(fw_prof))
    out_bytes = sum(_storages([loss, *outputs]).values())
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as bw_prof:
        loss.backward()
    _, bw_peak = _net_and_peak(_alloc_timeline(bw_prof))
    rec = {
        "kept_mb": kept / MB,
        "outputs_mb": out_bytes / MB,
        "saved_mb": (kept - out_bytes) / MB,
        "hook_saved_mb": sum(packed.values()) / MB,
        "peak_mb": max(fw_peak, kept + bw_peak) / MB,
    }
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return rec, (loss.detach(), grads)


def one_row(a, workload: str, compiler: str) -> tuple[dict, tuple | None]:
    row: dict = {"workload": workload, "compiler": compiler}
    try:
        model, step = WORKLOADS[workload](a)
        _reset()
        compiled = COMPILERS[compiler](model)
        t0 = time.perf_counter()
        for _ in range(3):  # the compile, then two warm steps
            model.zero_grad(set_to_none=True)
            loss, _ = step(compiled)
            loss.backward()
        row["warmup_s"] = round(time.perf_counter() - t0, 1)
        rec, result = measure(model, compiled, step)
        row.update(rec)
        if compiler == "kiln":
            import kiln

            stats = kiln.stats()
            row["kiln_graphs"] = stats.graphs_compiled
            row["kiln_partition_saved_mb"] = stats.saved_bytes / MB
        return row, result
    except Exception as e:  # noqa: BLE001  (one failing row must not stop the run)
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        traceback.print_exc(limit=6)
        return row, None


def check(row: dict, got, want) -> None:
    """Loss and gradients against eager's."""
    if got is None or want is None:
        return
    (loss, grads), (ref_loss, ref_grads) = got, want
    try:
        torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5)
        assert grads.keys() == ref_grads.keys(), "different parameters got grads"
        for name, ref in ref_grads.items():
            torch.testing.assert_close(grads[name], ref, rtol=1e-3, atol=1e-4,
                                       msg=lambda m, name=name: f"{name}: {m}")
        row["matches_eager"] = True
    except AssertionError as e:
        row["matches_eager"] = False
        row["mismatch"] = str(e).splitlines()[0][:300]


def table(rows: list[dict]) -> str:
    by = {}
    for r in rows:
        by.setdefault(r["workload"], {})[r["compiler"]] = r
    head = ("workload | eager saved MB | torch.compile saved MB | kiln saved MB | kiln/tc | "
            "eager peak | tc peak | kiln peak | kiln grads = eager")
    lines = [head, "|".join("---" for _ in head.split("|"))]

    def cell(r, k, fmt="{:.2f}"):
        if r is None:
            return "-"
        if "error" in r:
            return "error"
        v = r.get(k)
        return "-" if v is None else fmt.format(v)

    for w, rs in by.items():
        e, t, k = rs.get("eager"), rs.get("torch_compile"), rs.get("kiln")
        ratio = "-"
        if t and k and "saved_mb" in t and "saved_mb" in k and t["saved_mb"] > 0:
            ratio = f"{k['saved_mb'] / t['saved_mb']:.2f}"
        lines.append(" | ".join([
            w, cell(e, "saved_mb"), cell(t, "saved_mb"), cell(k, "saved_mb"), ratio,
            cell(e, "peak_mb"), cell(t, "peak_mb"), cell(k, "peak_mb"),
            str(k.get("matches_eager", "-")) if k else "-"]))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes")
    for name, default in (("layers", 4), ("width", 256), ("heads", 4), ("vocab", 50257),
                          ("batch", 2), ("seq", 256)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--only", nargs="*", choices=list(WORKLOADS), default=None)
    p.add_argument("--compilers", nargs="*", choices=list(COMPILERS), default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.smoke:
        a.layers, a.width, a.heads, a.vocab, a.batch, a.seq = 2, 64, 4, 1024, 2, 64
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    t0 = time.perf_counter()
    rows = []
    compilers = ["eager", *[c for c in (a.compilers or COMPILERS) if c != "eager"]]
    for w in a.only or WORKLOADS:
        reference = None
        for c in compilers:
            print(f"{w} / {c} ...", flush=True)
            row, result = one_row(a, w, c)
            if c == "eager":
                reference = result
            else:
                check(row, result, reference)
            rows.append(row)
            print("  ", json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                    for k, v in row.items()}), flush=True)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=HERE).stdout.strip()
    except OSError:
        commit = None
    result = {"rows": rows, "meta": {
        "torch": torch.__version__, "threads": torch.get_num_threads(), "smoke": a.smoke,
        "config": {k: getattr(a, k) for k in ("layers", "width", "heads", "vocab", "batch",
                                              "seq")},
        "command": " ".join(["python", *sys.argv]), "commit": commit,
        "wall_s": round(time.perf_counter() - t0, 1)}}
    name = "checkpoint-memory-cpu_smoke.json" if a.smoke else "checkpoint-memory-cpu.json"
    out = a.out or os.path.join(os.environ.get("OUT") or os.path.join(HERE, "results"), name)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(table(rows))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
