"""GPT-2 training with activation checkpointing: eager, ``torch.compile`` and ``kiln.compile``
in one run. HF ``GPT2LMHeadModel`` from a ``GPT2Config`` (124M shape: 12 layers, 768 wide,
12 heads), ``model.gradient_checkpointing_enable()`` (every block a
``torch.utils.checkpoint`` region), batch 8, sequence 512, bf16 autocast, AdamW.

For each compiler: step time (forward, backward, AdamW step; CUDA events, median after
warm-up), peak memory (``torch.cuda.max_memory_allocated`` after a reset, over the timed
steps; also what the steps add above the weights and optimizer state), and one step's loss
and gradients against eager's from the same weights (bf16 tolerances). And how kiln captured
it: graphs and graph breaks, checkpoint regions in the graph (nodes torch's way tagged
``recompute``), and the partitioner's choice on the joint graph (ops recomputed in the
backward, matmuls among them, bytes saved for the backward: of graph inputs, and of values
the forward computes), with checkpointing and, with ``--compare-unchecked``, without it.

    python benchmarks/checkpoint_gpu.py                    # H200: the sizes above
    python benchmarks/checkpoint_gpu.py --smoke            # tiny GPT-2 on the CPU, < 3 min
    python benchmarks/checkpoint_gpu.py --compare-unchecked --reentrant

Dropout is off (``*_pdrop=0``) so compiled and eager gradients are comparable. Writes JSON
to ``$OUT/checkpoint_gpu.json`` when ``$OUT`` is set, else benchmarks/results/
(``--smoke``: ``checkpoint_gpu_smoke.json``), and prints a table.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import traceback
import warnings

import torch

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))


# ------------------------------------------------------------------------------- the model


def _torchvision_importable() -> None:
    """transformers imports torchvision, which needs the test shim beside the CPU build of
    torch (docs/testing.md); a CUDA machine's torchvision imports as is."""
    if torch.cuda.is_available():
        return
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests-integration"))
    import _torchvision_shim

    _torchvision_shim.install()


def make_model(a, device: str, checkpointing: bool = True):
    _torchvision_importable()
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=a.layers, n_embd=a.width, n_head=a.heads, vocab_size=a.vocab,
                     n_positions=max(1024, a.seq), resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0)
    cfg._attn_implementation = a.attn
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).to(device)
    if checkpointing:
        model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": a.reentrant})
    model.config.use_cache = False
    return model.train()


def loss_of(run, ids, device: str, amp: bool):
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
        return run(input_ids=ids, labels=ids).loss


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def attempt(record: dict, key: str, fn):
    """Run ``fn``; on failure record the error under ``key`` and return None."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001  (one failing compiler must not stop the run)
        record[key] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        traceback.print_exc(limit=4)
        if device_of(record) == "cuda":
            torch.cuda.empty_cache()
        return None


def device_of(record: dict) -> str:
    return record.get("_device", "cpu")


# ------------------------------------------------------------------------------- measurements


def one_step_grads(model, run, ids, device: str, amp: bool):
    """Loss and gradients (by parameter name) of one forward/backward, no optimizer step."""
    model.zero_grad(set_to_none=True)
    loss = loss_of(run, ids, device, amp)
    loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach().float(), grads


def compare(rec: dict, key: str, got, want, tol: float) -> None:
    """Loss and gradients of ``key`` against eager's: max abs differences, the worst
    relative error of a gradient's norm-scaled difference, and pass/fail at ``tol``."""
    if got is None or want is None:
        return
    (loss, grads), (ref_loss, ref_grads) = got, want
    rec[f"{key}_loss"] = loss.item()
    rec[f"{key}_loss_diff"] = abs(loss.item() - ref_loss.item())
    worst, worst_name = 0.0, None
    for name, ref in ref_grads.items():
        g = grads.get(name)
        if g is None:
            worst, worst_name = float("inf"), name
            break
        err = ((g - ref).norm() / ref.norm().clamp_min(1e-12)).item()
        if err > worst:
            worst, worst_name = err, name
    rec[f"{key}_grad_rel_err"] = worst
    rec[f"{key}_grad_worst"] = worst_name
    try:
        torch.testing.assert_close(loss, ref_loss, atol=tol, rtol=tol)
        rec[f"{key}_correct"] = worst <= 5 * tol and set(grads) == set(ref_grads)
    except AssertionError:
        rec[f"{key}_correct"] = False


def timed_steps(model, run, ids, device: str, amp: bool, steps: int, warmup: int) -> dict:
    """Median step time (forward, backward, AdamW) and peak memory over ``steps`` steps."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        loss = loss_of(run, ids, device, amp)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    step()
    sync(device)
    first_s = time.perf_counter() - t0
    for _ in range(warmup):
        step()
    sync(device)
    out: dict = {"first_step_s": round(first_s, 2)}
    if device == "cuda":
        torch.cuda.empty_cache()
        out["static_mb"] = torch.cuda.memory_allocated() / 2**20
        torch.cuda.reset_peak_memory_stats()
    samples = []
    for _ in range(steps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            step()
            samples.append((time.perf_counter() - t) * 1e3)
    out["step_ms"] = statistics.median(samples)
    if device == "cuda":
        out["peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
        out["peak_above_static_mb"] = out["peak_mb"] - out["static_mb"]
    return out


def kiln_capture(a, device: str, ids, amp: bool, checkpointing: bool) -> dict:
    """How kiln's frontend and partitioner see the model: graphs, breaks, checkpoint
    regions, and what the joint graph's partition recomputes and saves."""
    import kiln_aotgrad
    import kiln_frontend

    model = make_model(a, device, checkpointing)
    graphs = []

    def capture(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    kiln_frontend.reset()
    compiled = kiln_frontend.compile(model, backend=capture)
    loss_of(compiled, ids, device, amp)
    explain = kiln_frontend.explain(make_model(a, device, checkpointing))
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
        report = explain(input_ids=ids, labels=ids)
    rec: dict = {"graphs": len(graphs), "graph_breaks": report.graph_break_count,
                 "break_reasons": sorted({str(b.reason)[:160] for b in report.break_reasons})}
    nodes = [n for gm, _ in graphs for n in gm.graph.nodes]
    tagged = [n for n in nodes if "recompute" in n.meta]
    rec["checkpoint_regions"] = len({n.meta.get("ac_graph_id") for n in tagged})
    rec["checkpoint_tagged_nodes"] = len(tagged)
    partitions = []
    for gm, inputs in graphs:
        if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs) and \
                not any(p.requires_grad for p in gm.parameters()):
            continue
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
            partitions.append(kiln_aotgrad.partition(kiln_aotgrad.trace_joint(gm, inputs)))
    matmuls = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default",
               "aten._scaled_dot_product_efficient_attention.default",
               "aten._scaled_dot_product_flash_attention.default",
               "aten._scaled_dot_product_cudnn_attention.default"}
    rec["recomputed_ops"] = sum(len(p.recomputed) for p in partitions)
    rec["recomputed_matmuls"] = sum(
        1 for p in partitions for n in p.bw_gm.graph.nodes
        if n.name in p.recomputed and str(n.target) in matmuls)
    rec["saved_values"] = sum(len(p.saved_names) for p in partitions)
    # bytes kept for the backward: of the graphs' inputs (weights: alive anyway) and of
    # values the forward computes (activations, weight casts: what checkpointing should cut)
    saved = {"placeholder": 0, "computed": 0}
    for p in partitions:
        fw = {n.name: n for n in p.fw_gm.graph.nodes}
        for name in p.saved_names:
            node = fw.get(name)
            val = node.meta.get("val") if node is not None else None
            if isinstance(val, torch.Tensor):
                kind = "placeholder" if node.op == "placeholder" else "computed"
                saved[kind] += val.numel() * val.element_size()
    rec["saved_inputs_mb"] = saved["placeholder"] / 2**20
    rec["saved_computed_mb"] = saved["computed"] / 2**20
    return rec


# ------------------------------------------------------------------------------- main


def run(a) -> dict:
    import kiln

    device = "cpu" if a.smoke else "cuda"
    amp = not a.no_amp
    torch.manual_seed(0)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), device=device)
    tol = 2e-2
    rec: dict = {"_device": device}
    compilers = {"eager": lambda m: m,
                 "torch_compile": lambda m: torch.compile(m),
                 "kiln": lambda m: kiln.compile(m)}
    base = make_model(a, device)
    rows = {}
    reference = None
    for name, make in compilers.items():
        row: dict = {"compiler": name}
        torch._dynamo.reset()
        kiln.reset()
        model = copy.deepcopy(base)
        compiled = attempt(row, "error", lambda make=make, model=model: make(model))
        if compiled is not None:
            grads = attempt(row, "error", lambda m=model, c=compiled: one_step_grads(
                m, c, ids, device, amp))
            if name == "eager":
                reference = grads
            else:
                compare(row, "vs_eager", grads, reference, tol)
            timing = attempt(row, "error", lambda m=model, c=compiled: timed_steps(
                m, c, ids, device, amp, a.steps, a.warmup))
            row.update(timing or {})
        if name == "kiln":
            stats = kiln.stats()
            row["kiln_stats"] = {k: getattr(stats, k) for k in (
                "graphs_compiled", "training_graphs", "eager_fallbacks", "interpreter_fallbacks",
                "saved_bytes") if hasattr(stats, k)}
        rows[name] = row
        del model, compiled
        if device == "cuda":
            torch.cuda.empty_cache()
    result = {"rows": rows}
    result["kiln_capture"] = attempt(rec, "capture_error",
                                     lambda: kiln_capture(a, device, ids, amp, True))
    if a.compare_unchecked:
        result["kiln_capture_unchecked"] = attempt(
            rec, "capture_unchecked_error", lambda: kiln_capture(a, device, ids, amp, False))
    result.update({k: v for k, v in rec.items() if not k.startswith("_")})
    tc, kl = rows["torch_compile"], rows["kiln"]
    if tc.get("step_ms") and kl.get("step_ms"):
        result["kiln_over_torch_compile_step"] = kl["step_ms"] / tc["step_ms"]
    if tc.get("peak_mb") and kl.get("peak_mb"):
        result["kiln_over_torch_compile_peak"] = kl["peak_mb"] / tc["peak_mb"]
    return result


def table(result: dict) -> str:
    cols = [("compiler", "compiler"), ("step_ms", "step ms"), ("peak_mb", "peak MB"),
            ("peak_above_static_mb", "peak-static MB"), ("first_step_s", "first step s"),
            ("vs_eager_loss_diff", "loss diff"), ("vs_eager_grad_rel_err", "grad rel err"),
            ("vs_eager_correct", "ok"), ("error", "error")]

    def cell(r, k):
        v = r.get(k)
        return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)[:60]

    lines = [" | ".join(h for _, h in cols)]
    lines += [" | ".join(cell(r, k) for k, _ in cols) for r in result["rows"].values()]
    for key in ("kiln_capture", "kiln_capture_unchecked"):
        if result.get(key):
            lines.append(f"{key}: " + json.dumps(result[key]))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny GPT-2 on the CPU")
    for name, default in (("layers", 12), ("width", 768), ("heads", 12), ("vocab", 50257),
                          ("batch", 8), ("seq", 512), ("steps", 10), ("warmup", 3)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"))
    p.add_argument("--reentrant", action="store_true", help="use_reentrant=True checkpoints")
    p.add_argument("--no-amp", action="store_true", help="float32, no bf16 autocast")
    p.add_argument("--compare-unchecked", action="store_true",
                   help="also report kiln's capture and partition without checkpointing")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.smoke:
        a.layers, a.width, a.heads, a.vocab, a.batch, a.seq = 2, 64, 4, 256, 2, 32
        a.steps, a.warmup = 2, 1
        a.compare_unchecked = True
    elif not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --smoke for the CPU check")
    t0 = time.perf_counter()
    result = run(a)
    result["meta"] = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() and not a.smoke
        else "cpu (smoke)", "torch": torch.__version__, "smoke": a.smoke,
        "config": {k: getattr(a, k) for k in ("layers", "width", "heads", "vocab", "batch",
                                              "seq", "steps", "warmup", "attn", "reentrant")},
        "amp_bf16": not a.no_amp, "command": " ".join([os.path.basename(sys.executable),
                                                       *sys.argv]),
        "wall_s": round(time.perf_counter() - t0, 1)}
    name = "checkpoint_gpu_smoke.json" if a.smoke else "checkpoint_gpu.json"
    out = a.out or os.path.join(os.environ.get("OUT") or os.path.join(HERE, "results"), name)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(table(result))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
