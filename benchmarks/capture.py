"""Frame capture on real models: graphs and cold capture time, kiln's frontend vs
torch.compile's (TorchDynamo), both with a backend that runs the graphs as they are.

For each model (timm resnet18, vit_tiny_patch16_224, mobilenetv3_small_100; transformers
BERT, GPT-2 and Llama from small configs, no downloads) it runs, in one process:

* eager, to get the reference output;
* ``kiln_frontend.optimize(backend)`` — cold first call (capture + graphs + the run), then a
  second call that must not capture again;
* ``torch.compile(model, backend=backend)`` — the same.

``backend`` records each GraphModule and returns ``gm.forward`` (what the ``eager`` backend
does), so the time measured is capture, not code generation; capture time is the cold
first call minus the median of three cached calls, so the model's own run cancels out.
Outputs are checked against eager.  Before the models, each compiler captures a tiny function once, so one-time imports
(fake tensors, TorchDynamo) are not charged to the first model.

Targets: no more graphs than torch.compile on any model; kiln's capture time at most half
of torch.compile's.

    python benchmarks/capture.py                 # every model
    python benchmarks/capture.py --only bert,gpt2
    python benchmarks/capture.py --json out.json
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kiln_frontend  # noqa: E402
from _common import RESULTS_DIR, ROOT, Progress, first_line, markdown_table, tensors_of  # noqa: E402


def _torchvision_importable() -> None:
    """timm and transformers import torchvision, which needs the test shim beside the CPU
    build of torch (docs/testing.md)."""
    sys.path.insert(0, str(ROOT / "tests-integration"))
    import _torchvision_shim

    _torchvision_shim.install()


def _timm(name: str) -> Callable:
    def build():
        _torchvision_importable()
        import timm

        model = timm.create_model(name, pretrained=False)
        return model, (torch.randn(2, 3, 224, 224),)

    return build


def _bert():
    _torchvision_importable()
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=256, vocab_size=1000, max_position_embeddings=128)
    return BertModel(config), (torch.randint(0, 1000, (2, 32)),)


def _gpt2():
    _torchvision_importable()
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=128, n_layer=2, n_head=2, n_positions=128, vocab_size=1000)
    return GPT2LMHeadModel(config), (torch.randint(0, 1000, (2, 32)),)


def _llama():
    _torchvision_importable()
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                         max_position_embeddings=128)
    return LlamaForCausalLM(config), (torch.randint(0, 1000, (2, 32)),)


MODELS: dict[str, Callable] = {
    "resnet18": _timm("resnet18"),
    "vit_tiny_patch16_224": _timm("vit_tiny_patch16_224"),
    "mobilenetv3_small_100": _timm("mobilenetv3_small_100"),
    "bert": _bert,
    "gpt2": _gpt2,
    "llama": _llama,
}


class RecordingBackend:
    """Counts graphs and runs them as they are (like the ``eager`` backend)."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


@dataclasses.dataclass
class Run:
    graphs: int | None = None
    ops: int | None = None
    first_s: float | None = None
    second_s: float | None = None

    @property
    def capture_s(self) -> float | None:
        """Capture cost: the cold first call minus a cached call (the model's own run
        cancels out)."""
        if self.first_s is None or self.second_s is None:
            return None
        return max(self.first_s - self.second_s, 0.0)
    ok: bool = False
    error: str = ""


def _compiled(kind: str, model: torch.nn.Module, backend: RecordingBackend):
    if kind == "kiln":
        kiln_frontend.reset()
        return kiln_frontend.optimize(backend)(model)
    _dynamo().reset()
    return torch.compile(model, backend=backend)


def _dynamo():
    """torch.compile's frontend, for its reset() (benchmarks only)."""
    import importlib

    return importlib.import_module("torch._dynamo")


def measure(kind: str, model: torch.nn.Module, inputs: tuple, expected: list) -> Run:
    run = Run()
    backend = RecordingBackend()
    try:
        fn = _compiled(kind, model, backend)
        with torch.no_grad():
            t0 = time.perf_counter()
            out = fn(*inputs)
            run.first_s = time.perf_counter() - t0
            graphs_after_first = len(backend.graphs)
            cached = []
            for _ in range(3):
                t0 = time.perf_counter()
                out2 = fn(*inputs)
                cached.append(time.perf_counter() - t0)
            run.second_s = statistics.median(cached)
        for got in (out, out2):
            actual = tensors_of(got)
            assert len(actual) == len(expected), f"{len(actual)} outputs != {len(expected)}"
            for a, e in zip(actual, expected, strict=True):
                torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
        run.graphs = graphs_after_first
        run.ops = sum(1 for gm in backend.graphs[:graphs_after_first] for n in gm.graph.nodes
                      if n.op in ("call_function", "call_method", "call_module"))
        if len(backend.graphs) != graphs_after_first:
            run.error = f"second call captured {len(backend.graphs) - graphs_after_first} more"
        run.ok = not run.error
    except Exception as e:  # noqa: BLE001 - a benchmark reports what it gets
        run.error = first_line(e)
    return run


def warm_up() -> None:
    """One tiny capture per compiler: imports and first-use set-up are not charged to the
    first model."""

    def tiny(x):
        return torch.relu(x) + 1

    x = torch.randn(4)
    kiln_frontend.reset()
    kiln_frontend.optimize(RecordingBackend())(tiny)(x)
    _dynamo().reset()
    torch.compile(tiny, backend=RecordingBackend())(x)


def _fmt_s(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.0f} ms"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--json", default=str(RESULTS_DIR / "capture.json"))
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(MODELS)
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {list(MODELS)}")

    torch.manual_seed(0)
    progress = Progress(len(names) * 2 + 1, "capture")
    progress.step("warm-up")
    warm_up()
    progress.done()
    results: dict[str, dict[str, Run]] = {}
    for name in names:
        try:
            model, inputs = MODELS[name]()
        except Exception as e:  # noqa: BLE001
            progress.write(f"{name}: cannot build ({first_line(e)})")
            results[name] = {k: Run(error=f"build: {first_line(e)}") for k in ("kiln", "torch")}
            progress.done()
            progress.done()
            continue
        model.eval()
        with torch.no_grad():
            expected = tensors_of(model(*inputs))
        results[name] = {}
        for kind in ("kiln", "torch"):
            progress.step(f"{name} under {'kiln_frontend' if kind == 'kiln' else 'torch.compile'}")
            results[name][kind] = r = measure(kind, copy.deepcopy(model), inputs, expected)
            progress.write(f"  {name} {kind}: graphs={r.graphs} capture={_fmt_s(r.capture_s)}"
                           f"{' ERROR ' + r.error if r.error else ''}")
            progress.done()
    progress.close()

    header = ["model", "graphs kiln", "graphs torch.compile", "capture kiln",
              "capture torch.compile", "kiln / torch", "1st call kiln", "1st call torch",
              "ops kiln", "ops torch", "notes"]
    rows = []
    for name, r in results.items():
        k, t = r["kiln"], r["torch"]
        ratio = (f"{k.capture_s / t.capture_s:.2f}" if k.capture_s is not None
                 and t.capture_s else "-")
        notes = "; ".join(f"{kind}: {x.error}" for kind, x in r.items() if x.error)
        rows.append([name, k.graphs if k.graphs is not None else "-",
                     t.graphs if t.graphs is not None else "-", _fmt_s(k.capture_s),
                     _fmt_s(t.capture_s), ratio, _fmt_s(k.first_s), _fmt_s(t.first_s), k.ops if k.ops is not None else "-",
                     t.ops if t.ops is not None else "-", notes])
    print(markdown_table(header, rows))
    misses = [n for n, r in results.items()
              if not (r["kiln"].ok and r["torch"].ok and r["kiln"].graphs <= r["torch"].graphs
                      and r["kiln"].capture_s <= 0.5 * r["torch"].capture_s)]
    print(f"\ntargets (graphs <= torch.compile's, capture <= half of torch.compile's) met on "
          f"{len(results) - len(misses)}/{len(results)} models"
          + (f"; not on: {', '.join(misses)}" if misses else ""))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({n: {k: {**dataclasses.asdict(v), "capture_s": v.capture_s}
                                   for k, v in r.items()}
                               for n, r in results.items()}, indent=2))
    print(f"results: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
