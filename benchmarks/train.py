"""Training-step benchmark: eager vs torch.compile (inductor) vs kiln, in one run (issue 12).

    python benchmarks/train.py                      # CPU: mlp, block, resnet18, bert-small
    python benchmarks/train.py --quick              # fewer repeats (a smoke run)
    python benchmarks/train.py --only mlp,block
    python benchmarks/train.py --device cuda        # GPU: BERT-base fp16, batch 8, seq 512

One training step = ``zero_grad``, forward, loss, ``loss.backward()``, ``optimizer.step()``
(SGD, eager in every variant: only the model is compiled, as users do). For each workload and
compiler, starting from the same weights (a deep copy of one model):

1. cold compile: the first step's wall time minus eager's step time, with empty on-disk caches
   (fresh ``KILN_CACHE_DIR`` / ``TORCHINDUCTOR_CACHE_DIR``) and reset frontends;
2. correctness: the first step's loss and every parameter's grad must match eager's
   (``assert_close``; float32 rtol=1e-3 atol=1e-4; fp16: the loss at 2e-2 and the relative
   error of all grads together under 2e-2; where eager leaves a grad None, all zeros pass,
   as torch.compile gives). A variant that fails is reported as such and left out of the
   geomean;
3. steady state: median seconds per step over ``--repeats`` rounds; a round times each
   variant for about 0.2 s of steps, one after the other, so the variants share the load of
   a busy machine alike; speedup = eager / compiled.

Writes benchmarks/results/train-<device>.json and .md. Dropout is off in the workloads
(p=0), so eager and compiled steps do the same arithmetic.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests-integration"))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _common import (  # noqa: E402
    RESULTS_DIR,
    first_line,
    fresh_cache_dirs,
    geomean,
    markdown_table,
)
from _models import PreNormBlock  # noqa: E402

COMPILERS = ("eager", "inductor", "kiln")


@dataclasses.dataclass
class Workload:
    """A model factory, a batch factory and a loss of the model's output."""

    name: str
    make_model: Callable[[], nn.Module]
    make_batch: Callable[[], tuple]
    loss: Callable[[Any], torch.Tensor]
    dtype: torch.dtype = torch.float32


class MLP(nn.Module):
    def __init__(self, d=256):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d), nn.Linear(d, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.gelu(self.fc1(x)))))


def transformer_block():
    """The transformer-block workload: causal self-attention, d 256, 4 heads."""
    return PreNormBlock(256, 4, causal=True)


def _mse(out) -> torch.Tensor:
    return out.float().square().mean()


def _bert(hidden, layers, heads, inter, vocab, seq, batch, dtype, device):
    def make_model():
        import _torchvision_shim

        _torchvision_shim.install()  # transformers imports torchvision (--only bert-small)
        import transformers

        config = transformers.BertConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=inter,
            max_position_embeddings=max(seq, 64),
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        return transformers.BertModel(config).to(device=device, dtype=dtype)

    def make_batch():
        return (torch.randint(0, vocab, (batch, seq), device=device),)

    return make_model, make_batch, lambda out: _mse(out.last_hidden_state)


def workloads(device: str) -> list[Workload]:
    if device == "cuda":
        mm, mb, loss = _bert(768, 12, 12, 3072, 30522, 512, 8, torch.float16, device)
        return [Workload("bert-base-fp16", mm, mb, loss, torch.float16)]

    def resnet18():
        import _torchvision_shim

        _torchvision_shim.install()
        import timm

        return timm.create_model("resnet18", num_classes=10)

    mm, mb, loss = _bert(128, 2, 2, 512, 1000, 64, 8, torch.float32, device)
    return [
        Workload("mlp", MLP, lambda: (torch.randn(64, 256),), _mse),
        Workload("block", transformer_block, lambda: (torch.randn(8, 64, 256),), _mse),
        Workload("resnet18", resnet18, lambda: (torch.randn(8, 3, 64, 64),), _mse),
        Workload("bert-small", mm, mb, loss),
    ]


# ------------------------------------------------------------------------------ one variant


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _compiled(model: nn.Module, compiler: str) -> Callable:
    if compiler == "eager":
        return model
    if compiler == "inductor":
        import torch._dynamo

        torch._dynamo.reset()
        return torch.compile(model)
    if compiler == "kiln":
        import kiln
        import kiln_frontend

        kiln_frontend.reset()
        kiln.reset_stats()
        return kiln.compile(model)
    raise ValueError(f"unknown compiler {compiler!r}")


def _step_fn(model, fn, opt, batch, loss_fn, device):
    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(fn(*batch))
        loss.backward()
        opt.step()
        _sync(device)
        return loss

    return step


class _Timeout(Exception):
    pass


def _alarm(seconds: float):
    def on_alarm(signum, frame):
        raise _Timeout(f"took longer than {seconds:.0f} s")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _check(model, ref, loss, ref_loss, dtype) -> None:
    if dtype == torch.float16:
        torch.testing.assert_close(loss.float(), ref_loss.float(), rtol=2e-2, atol=2e-2)
        pairs = list(zip(model.named_parameters(), ref.named_parameters(), strict=True))
        for (name, p), (_, q) in pairs:
            if q.grad is None:  # torch.compile gives zeros where eager leaves None: accepted
                assert p.grad is None or not p.grad.any(), f"{name}.grad should be None"
        got = torch.cat([p.grad.float().flatten() for (_, p), (_, q) in pairs if q.grad is not None])
        want = torch.cat([q.grad.float().flatten() for _, (_, q) in pairs if q.grad is not None])
        rel = ((got - want).norm() / want.norm().clamp_min(1e-12)).item()
        assert rel < 2e-2, f"grads differ: relative error {rel:.3g}"
        return
    torch.testing.assert_close(loss, ref_loss, rtol=1e-3, atol=1e-4)
    for (name, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
        if q.grad is None:  # torch.compile gives zeros where eager leaves None: accepted
            assert p.grad is None or not p.grad.any(), f"{name}.grad should be None"
        else:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=name)


def run_workload(w: Workload, device: str, repeats: int, timeout: float) -> dict:
    torch.manual_seed(0)
    base = w.make_model()
    batch = w.make_batch()
    # eager reference: the first step's loss and grads (before its optimizer step)
    ref = copy.deepcopy(base)
    ref_loss = w.loss(ref(*batch))
    ref_loss.backward()
    row: dict[str, Any] = {"workload": w.name}
    steps: dict[str, Callable] = {}
    for compiler in COMPILERS:
        fresh_cache_dirs()
        model = copy.deepcopy(base)
        r: dict[str, Any] = {}
        try:
            _alarm(timeout)
            if compiler == "kiln":
                from kiln_runtime import compile_timer

                compile_timer.reset_reports()
            fn = _compiled(model, compiler)
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            _sync(device)
            t0 = time.perf_counter()
            loss = w.loss(fn(*batch))
            loss.backward()
            _sync(device)
            r["first_step_s"] = time.perf_counter() - t0
            _check(model, ref, loss, ref_loss, w.dtype)
            opt.step()
            if compiler == "kiln":
                import kiln

                s = kiln.stats()
                r["kiln"] = {
                    "forward_graphs": s.forward_graphs_compiled,
                    "backward_graphs": s.backward_graphs_compiled,
                    "eager_fallbacks": s.eager_fallbacks,
                    "saved_bytes": s.saved_bytes,
                    "compile_phases_s": {k: round(v, 2) for k, v in compile_timer.phase_totals().items()},
                }
                if not s.backward_graphs_compiled:  # the frontend ran it eagerly (a warning)
                    raise RuntimeError(f"kiln compiled no backward graph: {r['kiln']}")
            steps[compiler] = _step_fn(model, fn, opt, batch, w.loss, device)
        except BaseException as e:  # report and go on: one variant never stops the run
            if isinstance(e, KeyboardInterrupt):
                raise
            r = {"error": first_line(e), "traceback": traceback.format_exc(limit=4)}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        row[compiler] = r
    for compiler, step_s in _interleaved_step_times(steps, repeats).items():
        row[compiler]["step_s"] = step_s
    for compiler in COMPILERS:
        r = row[compiler]
        print(
            f"  {w.name:<12} {compiler:<9} {json.dumps({k: v for k, v in r.items() if k != 'traceback'}, default=str)}",
            flush=True,
        )
    eager_step = row["eager"].get("step_s")
    for compiler in COMPILERS[1:]:
        r = row[compiler]
        if "step_s" in r and eager_step:
            r["speedup"] = eager_step / r["step_s"]
            r["cold_compile_s"] = max(r["first_step_s"] - eager_step, 0.0)
    return row


def _interleaved_step_times(steps: dict[str, Callable], repeats: int) -> dict[str, float]:
    """Median seconds per step of each variant, timed in rounds: each round times every
    variant once (about 0.2 s of steps each), so load from other work on a shared machine
    falls on all of them alike and the ratios of one run compare like with like (timed one
    after the other, a burst of load during one variant's turn moved its ratio by 2x)."""
    calls = {}
    for name, step in steps.items():
        for _ in range(2):  # warm-up
            step()
        t0 = time.perf_counter()
        step()
        calls[name] = max(1, min(10_000, int(0.2 / max(time.perf_counter() - t0, 1e-7))))
    samples: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            t0 = time.perf_counter()
            for _ in range(calls[name]):
                step()
            samples[name].append((time.perf_counter() - t0) / calls[name])
    return {name: statistics.median(xs) for name, xs in samples.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--only", default="", help="comma-separated workload names")
    p.add_argument("--quick", action="store_true", help="3 repeats instead of 7")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds for a variant's compile and first step")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    only = {x for x in args.only.split(",") if x}
    todo = [w for w in workloads(args.device) if not only or w.name in only]
    repeats = 3 if args.quick else 7
    rows = []
    for w in todo:
        print(f"{w.name}:", flush=True)
        rows.append(run_workload(w, args.device, repeats, args.timeout))

    header = ["workload", "eager ms/step"]
    for c in COMPILERS[1:]:
        header += [f"{c} ms/step", f"{c} speedup", f"{c} cold compile s"]
    table = []
    for row in rows:
        line = [row["workload"], _ms(row["eager"])]
        for c in COMPILERS[1:]:
            r = row[c]
            if "error" in r:
                line += [f"error: {r['error']}", "", ""]
            else:
                line += [_ms(r), f"{r.get('speedup', 0):.2f}x", f"{r.get('cold_compile_s', 0):.1f}"]
        table.append(line)
    summary = {
        c: {
            "geomean_speedup": geomean(row[c].get("speedup") for row in rows),
            "geomean_cold_compile_s": geomean(row[c].get("cold_compile_s") for row in rows),
        }
        for c in COMPILERS[1:]
    }
    text = markdown_table(header, table)
    for c, s in summary.items():
        if s["geomean_speedup"]:
            text += (
                f"\n\n{c}: geomean speedup {s['geomean_speedup']:.2f}x, geomean cold compile "
                f"{s['geomean_cold_compile_s']:.1f} s"
            )
    meta = {
        "command": " ".join(["python", "benchmarks/train.py", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "torch": torch.__version__,
        "device": args.device,
        "threads": torch.get_num_threads(),
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"train-{args.device}"
    out.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=1, default=str)
    )
    out.with_suffix(".md").write_text(
        f"# Training step: {', '.join(COMPILERS)} ({args.device})\n\nCommand: `{meta['command']}`"
        f"  \nDate: {meta['date']}; torch {meta['torch']}; {meta['threads']} threads.\n\n"
        + text
        + "\n"
    )
    print("\n" + text)
    print(f"\nresults in {out}.json / .md")
    return 0


def _ms(r: dict) -> str:
    return f"{r['step_s'] * 1e3:.2f}" if "step_s" in r else "n/a"


if __name__ == "__main__":
    raise SystemExit(main())
