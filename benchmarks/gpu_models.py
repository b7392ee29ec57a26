"""GPU model suite: eager vs torch.compile vs kiln on 21 timm and transformers models (issue 31).

    bash scripts/device_tests.sh bench_models [args]          # on the lent H200
    python benchmarks/gpu_models.py                           # every part, on a CUDA machine
    python benchmarks/gpu_models.py --parts infer --only resnet50,gpt2
    python benchmarks/gpu_models.py --smoke                   # CPU, tiny models: every code path
    python benchmarks/gpu_models.py --report a.json b.json    # merge part runs: JSON, table, plot

Parts, each model in a fresh process of its own (a crash or a hang costs one row, and every
process starts with empty kiln, inductor and Triton caches, so first calls are cold compiles):

* ``infer``: bf16 weights and inputs, ``torch.no_grad()``, eval mode. Eager's output is the
  reference; each compiler's first call is its cold compile; steady time is the median over
  repeats of back-to-back calls (synchronized at each end), eager and the compilers timed in
  alternating rounds (the lent H200's host speed drifts by up to 2x between minutes, and
  small-batch models are host-bound: one compiler timed after the other compares two machine
  states). Error = max |compiled - eager| /
  max |eager|; kiln passes when its error is at most max(5e-2, 3x torch.compile's own).
* ``train``: one AMP training step (fp32 weights, bf16 autocast, cross-entropy over the last
  dimension of the output, backward, AdamW), the compiled model inside it; dropout off. Each
  variant trains its own copy of the same weights (all alive, timed in alternating rounds as
  for inference); its first three losses must match eager's (rtol
  max(2e-2, 3x torch.compile's own)). Peak memory = peak allocated over the memory held after
  the first step (the model, its gradients and AdamW's state), over three steps.
* ``dynamic``: a Llama-shaped decoder called at sequence lengths 256..1000 with
  ``dynamic=None`` (both compilers decide when to make sizes symbolic): every length is
  called once (compiles and recompiles counted in), then each timed.

Writes ``gpu-models.json``, ``gpu-models.md`` and ``gpu-models.png`` in ``$OUT`` when set, else
benchmarks/results/. The summary checks issue 31's targets: no model below 0.95x of
torch.compile, geomean >= 1.15x torch.compile's (inference and training), cold compile at most
half of torch.compile's, training peak memory at most torch.compile's, and the dynamic case at
least torch.compile's speed at every length.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    RESULTS_DIR,
    ROOT,
    Progress,
    first_line,
    fresh_cache_dirs,
    geomean,
    interleaved_times,
    markdown_table,
    median_time,
    tensors_of,
)

COMPILERS = ("torch.compile", "kiln")
PARTS = ("infer", "train", "dynamic")


# ===================================================================================== models
@dataclasses.dataclass
class Model:
    """One row of the suite: how to build it at full size (on an H200) and at smoke size (CPU),
    and whether the training part runs it."""

    name: str
    family: str
    build: Callable[[bool], tuple[Any, Callable[[Any], tuple]]]  # smoke -> (module, inputs(device))
    train: bool = False


def _torchvision_importable() -> None:
    """timm and transformers import torchvision; beside the CPU build of torch here it needs
    the test shim (docs/testing.md). The lent GPU machine has a working torchvision."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        sys.path.insert(0, str(ROOT / "tests-integration"))
        import _torchvision_shim

        _torchvision_shim.install()


def timm_model(name: str, batch: int, size: int = 224, **kwargs):
    def build(smoke: bool):
        import torch

        _torchvision_importable()
        import timm

        side, b = (64, 2) if smoke else (size, batch)
        extra = dict(kwargs)
        if smoke and name.startswith(("vit", "deit", "swin")):
            extra["img_size"] = side
            if name.startswith("swin"):
                extra["window_size"] = 2
        model = timm.create_model(name, pretrained=False, **extra)
        return model, lambda device: (torch.randn(b, 3, side, side, device=device),)

    return build


def hf_tokens(config_cls: str, model_cls: str, vocab: int, batch: int, seq: int,
              decoder_seq: int = 0, smoke_config: dict | None = None, **config):
    """A transformers model from its config called on random token ids (and decoder ids for an
    encoder-decoder); returns its logits or last hidden state."""
    def build(smoke: bool):
        import torch

        _torchvision_importable()
        from _models import TokensIn, hf_model

        cfg = {**config, **(smoke_config or {})} if smoke else config
        v = min(vocab, 512) if smoke else vocab
        b, t, td = (2, 32, 16) if smoke else (batch, seq, decoder_seq)
        model = TokensIn(hf_model(config_cls, model_cls, vocab_size=v, **cfg), decoder=bool(td))

        def inputs(device):
            ids = torch.randint(0, v, (b, t), device=device)
            return (ids, torch.randint(0, v, (b, td), device=device)) if td else (ids,)

        return model, inputs

    return build


def whisper_encoder(smoke: bool):
    import torch

    _torchvision_importable()
    from _models import WhisperEncoderIn, hf_model

    layers, d, frames, b = (2, 64, 32, 2) if smoke else (6, 512, 1500, 8)  # whisper-base shape
    model = WhisperEncoderIn(hf_model(
        "WhisperConfig", "WhisperModel", vocab_size=1000, d_model=d, encoder_layers=layers,
        decoder_layers=1, encoder_attention_heads=8 if not smoke else 2, decoder_attention_heads=2,
        encoder_ffn_dim=4 * d, decoder_ffn_dim=4 * d, num_mel_bins=80,
        max_source_positions=frames, max_target_positions=64, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=1).encoder)
    return model, lambda device: (torch.randn(b, 80, 2 * frames, device=device),)


_NO_DROP = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_TINY_ENC = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
_TINY_DEC = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2)


def _llama_like(config_cls, model_cls, hidden, layers, heads, kv, ffn, batch=4, seq=1024, **extra):
    return hf_tokens(config_cls, model_cls, 32000, batch, seq, hidden_size=hidden,
                     intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=heads,
                     num_key_value_heads=kv, max_position_embeddings=4096, use_cache=False,
                     attention_dropout=0.0, smoke_config=_TINY_DEC, **extra)


MODELS = [
    # ---- convnets (timm, 224x224)
    Model("resnet50", "bottleneck convnet", timm_model("resnet50", 64), train=True),
    Model("efficientnet_b0", "depthwise + squeeze-excite", timm_model("efficientnet_b0", 64),
          train=True),
    Model("mobilenetv3_large_b1", "depthwise + SE, batch 1", timm_model("mobilenetv3_large_100", 1)),
    Model("regnety_016", "grouped convs + SE", timm_model("regnety_016", 32)),
    Model("convnext_tiny", "7x7 depthwise + LayerNorm", timm_model("convnext_tiny", 32), train=True),
    Model("densenet121", "concatenating convnet", timm_model("densenet121", 32)),
    # ---- vision transformers (timm)
    Model("vit_base", "ViT", timm_model("vit_base_patch16_224", 32), train=True),
    Model("deit_small", "ViT", timm_model("deit_small_patch16_224", 64)),
    Model("swin_tiny", "window attention + relative bias",
          timm_model("swin_tiny_patch4_window7_224", 32)),
    Model("mobilevit_s", "convs + attention on patches", timm_model("mobilevit_s", 32, size=256)),
    # ---- encoders (transformers from configs, batch 8, 512 tokens)
    Model("bert", "encoder", hf_tokens(
        "BertConfig", "BertModel", 30522, 8, 512, hidden_size=768, num_hidden_layers=6,
        num_attention_heads=12, intermediate_size=3072, smoke_config=_TINY_ENC, **_NO_DROP),
        train=True),
    Model("roberta", "encoder", hf_tokens(
        "RobertaConfig", "RobertaModel", 50265, 8, 512, hidden_size=768, num_hidden_layers=6,
        num_attention_heads=12, intermediate_size=3072, max_position_embeddings=514,
        smoke_config=_TINY_ENC, **_NO_DROP)),
    Model("deberta_v2", "disentangled relative attention", hf_tokens(
        "DebertaV2Config", "DebertaV2Model", 128100, 8, 512, hidden_size=768,
        num_hidden_layers=6, num_attention_heads=12, intermediate_size=3072,
        relative_attention=True, position_buckets=256, pos_att_type=["p2c", "c2p"],
        smoke_config=_TINY_ENC, **_NO_DROP)),
    Model("distilbert", "encoder", hf_tokens(
        "DistilBertConfig", "DistilBertModel", 30522, 8, 512, dropout=0.0, attention_dropout=0.0,
        smoke_config=dict(dim=64, n_layers=2, n_heads=2, hidden_dim=128))),
    Model("whisper_encoder", "speech encoder (convs + attention)", whisper_encoder),
    # ---- decoders
    Model("gpt2", "decoder (GPT-2 124M)", hf_tokens(
        "GPT2Config", "GPT2LMHeadModel", 50257, 8, 512, n_embd=768, n_layer=12, n_head=12,
        n_positions=1024, use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        smoke_config=dict(n_embd=64, n_layer=2, n_head=2)), train=True),
    Model("llama", "GQA decoder", _llama_like("LlamaConfig", "LlamaForCausalLM", 2048, 6, 16, 4, 5632)),
    Model("llama_train", "GQA decoder, training shape",
          _llama_like("LlamaConfig", "LlamaForCausalLM", 1024, 8, 16, 4, 2816), train=True),
    Model("qwen2", "GQA decoder, qkv bias", _llama_like("Qwen2Config", "Qwen2ForCausalLM", 1536, 6, 12, 2, 8960)),
    Model("mistral", "GQA decoder, sliding window", _llama_like(
        "MistralConfig", "MistralForCausalLM", 2048, 6, 16, 8, 5632, sliding_window=512)),
    # ---- encoder-decoders
    Model("t5_small", "relative position bias", hf_tokens(
        "T5Config", "T5ForConditionalGeneration", 32128, 8, 512, decoder_seq=128, d_model=512,
        d_kv=64, d_ff=2048, num_layers=6, num_heads=8, use_cache=False, dropout_rate=0.0,
        smoke_config=dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=2)), train=True),
    Model("bart_base", "encoder-decoder", hf_tokens(
        "BartConfig", "BartForConditionalGeneration", 50265, 8, 512, decoder_seq=128, d_model=768,
        encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
        decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072,
        max_position_embeddings=1024, use_cache=False, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, smoke_config=dict(
            d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128))),
]
BY_NAME = {m.name: m for m in MODELS}
SMOKE_MODELS = ("efficientnet_b0", "gpt2")
#: the dynamic case: a Llama-shaped decoder (6 layers, hidden 2048, GQA 16/4), batch 4
DYNAMIC_LENGTHS = (256, 384, 512, 640, 768, 896, 1000)
SMOKE_LENGTHS = (16, 24, 40)


# ================================================================================ measuring
class Device:
    """The one place that knows CPU from CUDA here: dtype, synchronization, memory."""

    def __init__(self, smoke: bool):
        import torch

        self.torch = torch
        self.name = "cpu" if smoke else "cuda"
        self.smoke = smoke

    def sync(self) -> None:
        if self.name == "cuda":
            self.torch.cuda.synchronize()

    def time(self, fn: Callable[[], Any]) -> float:
        """Median seconds per call (back-to-back calls, synchronized at each end)."""
        if self.smoke:
            return median_time(fn, min_repeat_s=0.01, repeats=3, warmup=1, sync=self.sync)
        return median_time(fn, min_repeat_s=0.1, repeats=7, warmup=3, sync=self.sync)

    def times(self, fns: dict[str, Callable[[], Any]]) -> dict[str, float]:
        """Median seconds per call of each, timed in alternating rounds (one machine state for
        all: the GPU host's speed drifts by 2x between minutes)."""
        if self.smoke:
            return interleaved_times(fns, min_repeat_s=0.01, repeats=3, warmup=1, sync=self.sync)
        return interleaved_times(fns, min_repeat_s=0.1, repeats=9, warmup=3, sync=self.sync)

    def cold(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return out, time.perf_counter() - t0

    def reset_peak(self) -> int:
        """Memory allocated now (the baseline), with the peak counter reset to it."""
        if self.name != "cuda":
            return 0
        self.sync()
        self.torch.cuda.reset_peak_memory_stats()
        return self.torch.cuda.memory_allocated()

    def peak(self) -> int:
        return self.torch.cuda.max_memory_allocated() if self.name == "cuda" else 0

    def autocast(self):
        return self.torch.autocast(self.name, dtype=self.torch.bfloat16)


def compile_with(label: str, model, **kwargs):
    """A fresh compiler state, then the compiled model."""
    import torch

    if label == "kiln":
        import kiln
        import kiln_frontend
        from kiln_runtime import compile_timer

        kiln_frontend.reset()
        compile_timer.reset_reports()
        return kiln.compile(model, **kwargs)
    torch._dynamo.reset()
    return torch.compile(model, **kwargs)


def kiln_summary() -> dict:
    """kiln's counters a reader checks first (graphs, fallbacks) and where its compiles went
    (seconds per phase over every graph since ``compile_with``: compile-time outliers)."""
    import kiln
    from kiln_runtime import compile_timer

    s = kiln.stats()
    keys = ("graphs_compiled", "eager_fallbacks", "interpreter_fallbacks", "compile_failures",
            "aten_fallbacks", "graph_breaks")
    out = {}
    for k in keys:
        v = s.get(k) if hasattr(s, "get") else getattr(s, k, None)
        if isinstance(v, dict):
            v = sum(v.values())
        if v is not None:
            out[k] = int(v)
    out["compile_phases_s"] = {k: round(v, 2) for k, v in compile_timer.phase_totals().items()}
    return out


def rel_err(got, expected) -> float:
    got, expected = got.float(), expected.float()
    scale = expected.abs().max().item() or 1.0
    err = (got - expected).abs().max().item() / scale
    return err if math.isfinite(err) else float("inf")


def run_infer(m: Model, dev: Device) -> dict:
    """Eager and every compiler on one model: each compiled and checked (cold time, error),
    then all timed together in alternating rounds (``Device.times``)."""
    torch = dev.torch
    model, make_inputs = m.build(dev.smoke)
    dtype = torch.float32 if dev.smoke else torch.bfloat16
    model = model.eval().to(dev.name, dtype)
    inputs = tuple(x.to(dtype) if x.is_floating_point() else x for x in make_inputs(dev.name))
    row: dict = {}
    with torch.no_grad():
        expected = tensors_of(model(*inputs))[0]
        timed = {"eager": lambda: model(*inputs)}
        for label in COMPILERS:
            try:
                compiled = compile_with(label, model)
                out, cold = dev.cold(lambda f=compiled: f(*inputs))
                row[label] = {"cold_s": cold, "err": rel_err(tensors_of(out)[0], expected)}
                out = None
                if label == "kiln":
                    row[label]["stats"] = kiln_summary()
                timed[label] = lambda f=compiled: f(*inputs)
            except Exception as e:
                row[label] = {"error": first_line(e, 300)}
                traceback.print_exc()
        try:
            ms = {label: s * 1e3 for label, s in dev.times(timed).items()}
        except Exception as e:
            row["timing_error"] = first_line(e, 300)
            traceback.print_exc()
            ms = {}
        if "eager" in ms:
            row["eager_ms"] = ms["eager"]
        for label in COMPILERS:
            if label in ms:
                row[label]["ms"] = ms[label]
                row[label]["speedup"] = ms["eager"] / ms[label]
        timed = None
        if dev.name == "cuda":
            torch.cuda.empty_cache()
    check_errors(row, tol=5e-2)
    return row


def check_errors(row: dict, tol: float) -> None:
    """kiln passes when its error is within ``tol`` or 3x torch.compile's own."""
    k, t = row.get("kiln", {}), row.get("torch.compile", {})
    if "err" in k:
        k["ok"] = k["err"] <= max(tol, 3 * t.get("err", 0.0))


def run_train(m: Model, dev: Device) -> dict:
    torch = dev.torch
    from _models import no_dropout

    torch.manual_seed(0)
    base, make_inputs = m.build(dev.smoke)
    base = no_dropout(base.train().to(dev.name))
    torch.manual_seed(1)
    inputs = make_inputs(dev.name)
    with torch.no_grad(), dev.autocast():
        classes = tensors_of(base(*inputs))[0].shape[-1]
    out0 = tensors_of(base(*inputs))[0]
    target = torch.randint(0, classes, out0.shape[:-1], device=dev.name).reshape(-1)
    del out0
    row: dict = {}
    steps: dict = {}
    for label in ("eager", *COMPILERS):
        try:  # each its own copy of the same weights: all are alive for the timing below
            own = copy.deepcopy(base)
            opt = torch.optim.AdamW(own.parameters(), lr=1e-4)
            model = own if label == "eager" else compile_with(label, own)

            def step(model=model, opt=opt):
                with dev.autocast():
                    out = tensors_of(model(*inputs))[0]
                loss = torch.nn.functional.cross_entropy(out.float().reshape(-1, classes), target)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss.detach()

            loss1, cold = dev.cold(step)
            baseline = dev.reset_peak()  # (the other copies' memory is in it: not counted)
            losses = [loss1.item()] + [step().item() for _ in range(2)]
            row[label] = {"cold_s": cold, "losses": losses,
                          "peak_gb": (dev.peak() - baseline) / 1e9 if dev.name == "cuda" else None}
            if label == "kiln":
                row[label]["stats"] = kiln_summary()
            steps[label] = step
        except Exception as e:
            row[label] = {"error": first_line(e, 300)}
            traceback.print_exc()
    try:  # alternating rounds, as for inference (Device.times)
        for label, s in dev.times(steps).items():
            row[label]["ms"] = s * 1e3
    except Exception as e:
        row["timing_error"] = first_line(e, 300)
        traceback.print_exc()
    steps = None
    if dev.name == "cuda":
        torch.cuda.empty_cache()
    eager = row.get("eager", {})
    if "ms" in eager:
        row["eager_ms"] = eager["ms"]
        for label in COMPILERS:
            r = row.get(label, {})
            if "ms" in r:
                r["speedup"] = eager["ms"] / r["ms"]
                r["err"] = max(abs(a - b) / max(abs(b), 1e-6)
                               for a, b in zip(r["losses"], eager["losses"], strict=True))
    check_errors(row, tol=2e-2)
    return row


def run_dynamic(dev: Device) -> dict:
    """The Llama-shaped decoder called at every length with ``dynamic=None``."""
    torch = dev.torch
    build = _llama_like("LlamaConfig", "LlamaForCausalLM", 2048, 6, 16, 4, 5632)
    model, _ = build(dev.smoke)
    dtype = torch.float32 if dev.smoke else torch.bfloat16
    model = model.eval().to(dev.name, dtype)
    lengths = SMOKE_LENGTHS if dev.smoke else DYNAMIC_LENGTHS
    vocab = 512 if dev.smoke else 32000
    batch = 2 if dev.smoke else 4
    torch.manual_seed(0)
    ids = {t: torch.randint(0, vocab, (batch, t), device=dev.name) for t in lengths}
    row: dict = {"lengths": list(lengths), "eager_ms": {}}
    with torch.no_grad():
        expected = {t: model(ids[t]) for t in lengths}
        for t in lengths:
            row["eager_ms"][t] = dev.time(lambda t=t: model(ids[t])) * 1e3
        for label in COMPILERS:
            r: dict = {"ms": {}, "err": {}}
            try:
                compiled = compile_with(label, model, dynamic=None)
                t0 = time.perf_counter()
                for t in lengths:  # first calls: every compile and recompile
                    r["err"][t] = rel_err(compiled(ids[t]), expected[t])
                dev.sync()
                r["compile_all_s"] = time.perf_counter() - t0
                for t in lengths:
                    r["ms"][t] = dev.time(lambda t=t, f=compiled: f(ids[t])) * 1e3
                if label == "kiln":
                    r["stats"] = kiln_summary()
            except Exception as e:
                r["error"] = first_line(e, 300)
                traceback.print_exc()
            row[label] = r
    k = row.get("kiln", {})
    if k.get("err"):
        k["ok"] = all(k["err"][t] <= max(5e-2, 3 * row["torch.compile"].get("err", {}).get(t, 0))
                      for t in lengths)
    return row


# ================================================================================= running
def child(args) -> int:
    """One (part, model) in this fresh process; prints ``RESULT <json>`` last."""
    fresh_cache_dirs("kiln-gpu-models-")
    os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
    dev = Device(args.smoke)
    dev.torch.manual_seed(0)
    t0 = time.perf_counter()
    try:
        if args.child_part == "dynamic":
            row = run_dynamic(dev)
        else:
            m = BY_NAME[args.child_model]
            row = (run_infer if args.child_part == "infer" else run_train)(m, dev)
    except Exception as e:
        traceback.print_exc()
        row = {"error": first_line(e, 300)}
    row["wall_s"] = time.perf_counter() - t0
    print("RESULT " + json.dumps(row), flush=True)
    return 0


def jobs(args) -> list[tuple[str, str]]:
    names = args.only.split(",") if args.only else (SMOKE_MODELS if args.smoke else [m.name for m in MODELS])
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown models {unknown}; known: {', '.join(BY_NAME)}")
    out = []
    for part in args.parts.split(","):
        if part == "dynamic":
            out.append(("dynamic", "llama"))
        elif part == "train":
            out += [("train", n) for n in names if BY_NAME[n].train]
        elif part == "infer":
            out += [("infer", n) for n in names if n != "llama_train"]
        else:
            raise SystemExit(f"unknown part {part!r}; known: {', '.join(PARTS)}")
    return out


def run_all(args) -> dict:
    todo = jobs(args)
    results: dict = {p: {} for p in PARTS}
    progress = Progress(len(todo), "gpu models")
    deadline = time.perf_counter() + args.budget
    for part, name in todo:
        progress.step(f"{part} {name}")
        left = deadline - time.perf_counter()
        if left < 20:
            results[part][name] = {"error": "skipped: out of the run's time budget"}
            progress.done()
            continue
        cmd = [sys.executable, "-u", __file__, "--child-part", part, "--child-model", name]
        if args.smoke:
            cmd.append("--smoke")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  timeout=min(args.timeout, left))
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            row = json.loads(lines[-1][7:]) if lines else {
                "error": f"exit {proc.returncode}: " + (proc.stderr.strip().splitlines() or [""])[-1][:300]}
            if proc.returncode or "error" in row:
                progress.write(proc.stderr[-3000:])
        except subprocess.TimeoutExpired:
            row = {"error": f"timeout after {min(args.timeout, left):.0f} s"}
        results[part][name] = row
        progress.write(f"  {part} {name}: {one_line(part, row)}")
        progress.done()
    progress.close()
    return results


def one_line(part: str, row: dict) -> str:
    if "error" in row:
        return row["error"]
    if part == "dynamic":
        return "; ".join(f"{c} compile {row[c].get('compile_all_s', 0):.1f}s" for c in COMPILERS if c in row)
    cells = [f"eager {row.get('eager_ms', 0):.2f} ms"]
    for c in COMPILERS:
        r = row.get(c, {})
        cells.append(f"{c} " + (r["error"] if "error" in r else
                                f"{r['speedup']:.2f}x cold {r['cold_s']:.1f}s err {r['err']:.1e}"
                                + (f" peak {r['peak_gb']:.2f}GB" if r.get("peak_gb") else "")))
    return "; ".join(cells)


# ================================================================================= report
def _fmt(x, spec=".2f", suffix=""):
    return "-" if x is None else f"{x:{spec}}{suffix}"


def summary(results: dict) -> dict:
    out: dict = {}
    for part in ("infer", "train"):
        rows = {n: r for n, r in results.get(part, {}).items() if "error" not in r}
        if not rows:
            continue
        ratio = {n: r["kiln"]["speedup"] / r["torch.compile"]["speedup"] for n, r in rows.items()
                 if "speedup" in r.get("kiln", {}) and "speedup" in r.get("torch.compile", {})}
        cold = {n: r["kiln"]["cold_s"] / r["torch.compile"]["cold_s"] for n, r in rows.items()
                if "cold_s" in r.get("kiln", {}) and r.get("torch.compile", {}).get("cold_s")}
        s = {
            "models": len(results[part]),
            "kiln_geomean_over_eager": geomean(r["kiln"].get("speedup") for r in rows.values() if "kiln" in r),
            "torch.compile_geomean_over_eager": geomean(
                r["torch.compile"].get("speedup") for r in rows.values() if "torch.compile" in r),
            "kiln_over_torch.compile_geomean": geomean(ratio.values()),
            "below_0.95": sorted(n for n, x in ratio.items() if x < 0.95),
            "cold_over_half_of_torch.compile": sorted(n for n, x in cold.items() if x > 0.5),
            "incorrect": sorted(n for n, r in rows.items() if r.get("kiln", {}).get("ok") is False),
            "failed": sorted(n for n, r in results[part].items()
                             if "error" in r or "error" in r.get("kiln", {})),
        }
        if part == "train":
            s["peak_memory_above_torch.compile"] = sorted(
                n for n, r in rows.items()
                if (r.get("kiln", {}).get("peak_gb") or 0) > (r.get("torch.compile", {}).get("peak_gb") or math.inf))
        out[part] = s
    dyn = results.get("dynamic", {}).get("llama")
    if dyn and "error" not in dyn and "ms" in dyn.get("kiln", {}) and "ms" in dyn.get("torch.compile", {}):
        per = {t: dyn["torch.compile"]["ms"][t] / dyn["kiln"]["ms"][t] for t in dyn["kiln"]["ms"]
               if t in dyn["torch.compile"]["ms"]}
        out["dynamic"] = {"kiln_over_torch.compile_by_length": per,
                          "slower_at": sorted((int(t) for t, x in per.items() if x < 1.0)),
                          "kiln_geomean_over_eager": geomean(
                              dyn["eager_ms"][t] / dyn["kiln"]["ms"][t] for t in per),
                          "torch.compile_geomean_over_eager": geomean(
                              dyn["eager_ms"][t] / dyn["torch.compile"]["ms"][t] for t in per)}
    return out


def tables(results: dict) -> str:
    parts = []
    for part, title in (("infer", "Inference, bf16"), ("train", "Training step, AMP bf16 + AdamW")):
        rows = []
        for name, r in results.get(part, {}).items():
            if "error" in r:
                rows.append([name, BY_NAME[name].family if name in BY_NAME else "", r["error"][:60],
                             "", "", "", "", ""])
                continue
            k, t = r.get("kiln", {}), r.get("torch.compile", {})
            ratio = k["speedup"] / t["speedup"] if "speedup" in k and "speedup" in t else None
            mem = f"{_fmt(k.get('peak_gb'))} / {_fmt(t.get('peak_gb'))}" if part == "train" else ""
            rows.append([name, BY_NAME[name].family if name in BY_NAME else "",
                         _fmt(k.get("speedup"), suffix="x") if "error" not in k else k["error"][:40],
                         _fmt(t.get("speedup"), suffix="x") if "error" not in t else t["error"][:40],
                         _fmt(ratio), f"{_fmt(k.get('cold_s'), '.1f')} / {_fmt(t.get('cold_s'), '.1f')}",
                         mem, {True: "yes", False: "NO", None: "-"}[k.get("ok")]])
        if rows:
            parts.append(f"### {title}\n\n" + markdown_table(
                ["model", "family", "kiln / eager", "torch.compile / eager", "kiln / torch.compile",
                 "cold s (kiln / tc)", "peak GB (kiln / tc)", "matches"], rows))
    dyn = results.get("dynamic", {}).get("llama")
    if dyn and "error" not in dyn:
        rows = []
        for t in dyn["lengths"]:
            k = dyn.get("kiln", {}).get("ms", {}).get(str(t)) or dyn.get("kiln", {}).get("ms", {}).get(t)
            c = dyn.get("torch.compile", {}).get("ms", {}).get(str(t)) or dyn.get("torch.compile", {}).get("ms", {}).get(t)
            e = dyn["eager_ms"].get(str(t)) or dyn["eager_ms"].get(t)
            rows.append([t, _fmt(e / k if k else None, suffix="x"), _fmt(e / c if c else None, suffix="x"),
                         _fmt(c / k if (c and k) else None)])
        parts.append("### Sequence length changing per call (Llama-shaped, dynamic=None)\n\n" + markdown_table(
            ["length", "kiln / eager", "torch.compile / eager", "kiln / torch.compile"], rows))
    return "\n\n".join(parts)


def plot(results: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(14, 6))
    for ax, part in zip(axes, ("infer", "train"), strict=True):
        rows = [(n, r) for n, r in results.get(part, {}).items() if "error" not in r]
        names = [n for n, _ in rows]
        for i, label in enumerate(COMPILERS):
            xs = [r.get(label, {}).get("speedup") or 0 for _, r in rows]
            ax.barh([j + 0.4 * i for j in range(len(names))], xs, height=0.4, label=label)
        ax.set_yticks([j + 0.2 for j in range(len(names))], names, fontsize=8)
        ax.axvline(1.0, color="gray", lw=0.8)
        ax.set_title({"infer": "inference, bf16", "train": "AMP training step"}[part])
        ax.set_xlabel("speedup over eager")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def write(results: dict, meta: dict, out_dir: Path, stem: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"env": meta, "results": results, "summary": summary(results)}
    (out_dir / f"{stem}.json").write_text(json.dumps(doc, indent=1, default=str))
    text = tables(results) + "\n\n```\n" + json.dumps(doc["summary"], indent=1, default=str) + "\n```\n"
    (out_dir / f"{stem}.md").write_text(text)
    plot(results, out_dir / f"{stem}.png")
    print(text)


def env_meta(args) -> dict:
    import torch

    meta = {"python": sys.version.split()[0], "torch": torch.__version__, "argv": sys.argv[1:]}
    if not args.smoke and torch.cuda.is_available():
        meta["gpu"] = torch.cuda.get_device_name()
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    return meta


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny models, every code path")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    p.add_argument("--only", default="", help="comma list of model names")
    p.add_argument("--budget", type=float, default=3600.0, help="seconds for the whole run")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for one model")
    p.add_argument("--report", nargs="+", metavar="JSON", help="merge part runs' JSON files")
    p.add_argument("--child-part", help=argparse.SUPPRESS)
    p.add_argument("--child-model", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_part:
        return child(args)
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else RESULTS_DIR
    stem = "gpu-models-smoke" if args.smoke else "gpu-models"
    if args.report:
        merged: dict = {part: {} for part in PARTS}
        meta: dict = {}
        for f in args.report:
            doc = json.loads(Path(f).read_text())
            meta = doc.get("env", meta)
            for part, rows in doc["results"].items():
                merged.setdefault(part, {}).update(rows)
        write(merged, {**meta, "merged_from": [Path(f).name for f in args.report]}, out_dir, stem)
        return 0
    results = run_all(args)
    write(results, env_meta(args), out_dir, stem)
    return 0


if __name__ == "__main__":
    sys.exit(main())
