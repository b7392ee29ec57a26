"""CPU inference benchmark: eager vs torch.compile (inductor) vs kiln, on seven workloads
and 21 real models.

    python benchmarks/cpu.py                  # the seven kernel-sized workloads, full sizes
    python benchmarks/cpu.py --quick          # small sizes, fewer repeats (a smoke run)
    python benchmarks/cpu.py --models         # 21 timm/transformers models, batch 2
    python benchmarks/cpu.py --suite all      # both
    python benchmarks/cpu.py --only softmax,mlp --via-fx
    python3 -m nox -s bench_cpu -- --quick    # the same through nox

For each workload (under ``torch.no_grad()``, models in eval mode), in a fresh Python process
of its own (``--no-isolate``: all in this one):
1. eager output = the reference, and eager timed alone before any compiler ran ("eager alone":
   median of 10 calls after 3 warm-ups, a user's plain timing);
2. each compiler in a fresh state (``torch._dynamo.reset()``, ``kiln_frontend.reset()``) and
   with empty on-disk caches (a temp ``KILN_CACHE_DIR`` / ``TORCHINDUCTOR_CACHE_DIR`` per
   workload): the first call's wall time is the *cold compile* time, and its output must match
   eager (``assert_close``, rtol=atol=1e-3) before it is timed;
3. steady state: median seconds per call over 9 repeats (each about 0.1 s of calls), eager and
   every compiled variant timed in interleaved rounds so that load changes hit all alike;
   speedup = eager / compiled.

Compilers: ``inductor`` = ``torch.compile(model)`` (the reference to beat), ``kiln`` =
``kiln.compile(model)`` (kiln's frontend + the kiln backend), and with ``--via-fx``
``kiln-fx`` = the FX route that needs no frontend: ``make_fx`` of the model (parameters become
graph constants) handed to ``kiln.backend.kiln_backend`` directly: it measures the codegen where
the frontend cannot capture a model yet. A compiler that fails on a workload is reported in
the table (``error: <first line>``) and left out of the geomean. Writes
benchmarks/results/cpu.json, cpu.md and the bar chart cpu.png (``cpu-models.*`` for the model
suite), with per-model counts of kiln's eager and aten fallbacks, a summary against the targets
(kiln's geomean over inductor's, slowest model, cold compile) and the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _common import (  # noqa: E402
    RESULTS_DIR,
    ROOT,
    Progress,
    first_line,
    fresh_cache_dirs,
    geomean,
    markdown_table,
    tensors_of,
)
from _models import TokensIn, WhisperEncoderIn, hf_model  # noqa: E402

COMPILERS = ("inductor", "kiln", "kiln-fx")

# ------------------------------------------------------------------------------- workloads


def pointwise_chain(x):
    y = x.sin() * 2.0 + x.cos()
    y = torch.relu(y) * torch.sigmoid(x)
    return torch.tanh(y) + x * 0.5


def softmax(x):
    return torch.softmax(x, dim=-1)


class LayerNormGelu(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return F.gelu(self.norm(x))


class MLP(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class TransformerBlock(nn.Module):
    """Pre-norm block: LayerNorm -> multi-head self-attention (SDPA) -> residual ->
    LayerNorm -> MLP (GELU) -> residual."""

    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = MLP(d, ff)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


def _torchvision_importable():
    """timm and transformers import torchvision, which needs the test shim beside the CPU
    build of torch (docs/testing.md)."""
    sys.path.insert(0, str(ROOT / "tests-integration"))
    import _torchvision_shim

    _torchvision_shim.install()


def _resnet18(quick):
    _torchvision_importable()
    import timm

    model = timm.create_model("resnet18", pretrained=False)
    shape = (1, 3, 64, 64) if quick else (4, 3, 224, 224)
    return model, (torch.randn(shape),)


def _bert_small(quick):
    _torchvision_importable()
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=512, vocab_size=30522, max_position_embeddings=512)
    model = BertModel(config)
    b, t = (2, 32) if quick else (8, 128)
    return model, (torch.randint(0, config.vocab_size, (b, t)),)


@dataclasses.dataclass
class Workload:
    name: str
    build: Callable[[bool], tuple[Any, tuple]]
    what: str


# ------------------------------------------------------------------------------- model suite
# Real models built from configs / pretrained=False (random weights), batch 2 unless a row says
# otherwise: what a new user tries first. Full size: 224x224 images (mobilevit 256), 128 tokens;
# --quick: 96x96 images, 32 tokens. Families (issue 31): depthwise convolutions with
# squeeze-excite, grouped convolutions, channels-heavy convnets, windowed and plain attention,
# relative-position attention (T5's bias, DeBERTa's disentangled attention), GQA decoders,
# encoder-decoders and a speech encoder.


def _timm_model(name: str, batch: int = 2, size: int = 224, **kwargs
                ) -> Callable[[bool], tuple[Any, tuple]]:
    def build(quick):
        _torchvision_importable()
        import timm

        side = 96 if quick else size
        fixed = name.startswith(("vit", "deit", "swin"))  # sized at build time
        extra = {"img_size": side} if fixed and quick else {}
        if quick and name.startswith("swin"):
            extra["window_size"] = 3  # 96/4 = 24 patches: windows that divide each stage
        model = timm.create_model(name, pretrained=False, **extra, **kwargs)
        return model, (torch.randn(batch, 3, side, side),)

    return build


def _transformers_model(make: Callable[[], nn.Module], vocab: int, decoder: bool = False):
    def build(quick):
        _torchvision_importable()
        model = TokensIn(make(), decoder)
        t = 32 if quick else 128
        ids = torch.randint(0, vocab, (2, t))
        return model, ((ids, torch.randint(0, vocab, (2, t // 2))) if decoder else (ids,))

    return build


def _hf(config_cls: str, model_cls: str, **config) -> Callable[[], nn.Module]:
    """A builder of ``hf_model(config_cls, model_cls, **config)`` (random weights)."""
    return functools.partial(hf_model, config_cls, model_cls, **config)


#: the shape every decoder-only LM shares here: 4 layers, d=256, 4 heads
_LM = dict(vocab_size=8000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
           num_attention_heads=4, max_position_embeddings=512, use_cache=False)
_ENC = dict(vocab_size=8000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
            intermediate_size=1024, max_position_embeddings=512)


def _whisper_encoder(quick):
    _torchvision_importable()
    from transformers import WhisperConfig, WhisperModel

    frames = 32 if quick else 256  # positions after the stride-2 convolution
    cfg = WhisperConfig(vocab_size=8000, d_model=256, encoder_layers=4, decoder_layers=1,
                        encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_ffn_dim=1024, decoder_ffn_dim=1024, num_mel_bins=80,
                        max_source_positions=frames, max_target_positions=64,
                        pad_token_id=0, bos_token_id=1, eos_token_id=2,
                        decoder_start_token_id=1)
    model = WhisperEncoderIn(WhisperModel(cfg).encoder)
    return model, (torch.randn(2, 80, 2 * frames),)


MODELS = [
    # ---- convnets (timm)
    Workload("mobilenetv3_small", _timm_model("mobilenetv3_small_100"),
             "timm mobilenetv3_small_100 (depthwise convs, hard-swish, SE), 2x3x224x224"),
    Workload("mobilenetv3_large_b1", _timm_model("mobilenetv3_large_100", batch=1),
             "timm mobilenetv3_large_100 at batch 1 (depthwise convs, SE), 1x3x224x224"),
    Workload("efficientnet_b0", _timm_model("efficientnet_b0"),
             "timm efficientnet_b0 (depthwise convs, SiLU, squeeze-excite), 2x3x224x224"),
    Workload("regnety_004", _timm_model("regnety_004"),
             "timm regnety_004 (grouped convs, squeeze-excite), 2x3x224x224"),
    Workload("convnext_atto", _timm_model("convnext_atto"),
             "timm convnext_atto (7x7 depthwise convs, LayerNorm, GELU), 2x3x224x224"),
    Workload("resnet18", _timm_model("resnet18"), "timm resnet18, 2x3x224x224"),
    Workload("resnet50", _timm_model("resnet50"), "timm resnet50 (bottlenecks), 2x3x224x224"),
    # ---- vision transformers (timm)
    Workload("vit_small", _timm_model("vit_small_patch16_224"),
             "timm vit_small_patch16_224 (12 blocks, d=384, GELU), 2x3x224x224"),
    Workload("deit_tiny", _timm_model("deit_tiny_patch16_224"),
             "timm deit_tiny_patch16_224 (12 blocks, d=192), 2x3x224x224"),
    Workload("swin_tiny", _timm_model("swin_tiny_patch4_window7_224"),
             "timm swin_tiny_patch4_window7_224 (shifted windows, relative position bias), "
             "2x3x224x224"),
    Workload("mobilevit_xxs", _timm_model("mobilevit_xxs", size=256),
             "timm mobilevit_xxs (depthwise convs + attention on unfolded patches), 2x3x256x256"),
    # ---- encoders (transformers, from configs)
    Workload("bert", _transformers_model(_hf("BertConfig", "BertModel", **_ENC), 8000),
             "transformers BertModel (4 layers, d=256, 4 heads), 2x128 tokens"),
    Workload("deberta_v2", _transformers_model(_hf(
        "DebertaV2Config", "DebertaV2Model", relative_attention=True, position_buckets=256,
        pos_att_type=["p2c", "c2p"], **_ENC), 8000),
             "transformers DebertaV2Model (disentangled relative attention, 4 layers, d=256), "
             "2x128 tokens"),
    Workload("distilbert", _transformers_model(_hf(
        "DistilBertConfig", "DistilBertModel", vocab_size=8000, dim=256, n_layers=4, n_heads=4,
        hidden_dim=1024, max_position_embeddings=512), 8000),
             "transformers DistilBertModel (4 layers, d=256), 2x128 tokens"),
    Workload("whisper_encoder", _whisper_encoder,
             "transformers Whisper encoder (2 convs + 4 layers, d=256), 2x80x512 log-mel frames"),
    # ---- decoders (transformers, from configs)
    Workload("gpt2", _transformers_model(_hf(
        "GPT2Config", "GPT2LMHeadModel", vocab_size=8000, n_embd=256, n_layer=4, n_head=4,
        n_positions=512, use_cache=False), 8000),
             "transformers GPT2LMHeadModel (4 layers, d=256, 4 heads), 2x128 tokens"),
    Workload("llama", _transformers_model(_hf("LlamaConfig", "LlamaForCausalLM",
                                              num_key_value_heads=2, **_LM), 8000),
             "transformers LlamaForCausalLM (4 layers, d=256, GQA 4/2 heads), 2x128 tokens"),
    Workload("qwen2", _transformers_model(_hf("Qwen2Config", "Qwen2ForCausalLM",
                                              num_key_value_heads=1, **_LM), 8000),
             "transformers Qwen2ForCausalLM (4 layers, d=256, GQA 4/1 heads, qkv bias), "
             "2x128 tokens"),
    Workload("mistral", _transformers_model(_hf("MistralConfig", "MistralForCausalLM",
                                                num_key_value_heads=2, sliding_window=64,
                                                **_LM), 8000),
             "transformers MistralForCausalLM (4 layers, d=256, GQA 4/2, sliding window 64), "
             "2x128 tokens"),
    # ---- encoder-decoders (transformers, from configs)
    Workload("t5", _transformers_model(_hf(
        "T5Config", "T5ForConditionalGeneration", vocab_size=8000, d_model=256, d_kv=64,
        d_ff=1024, num_layers=4, num_heads=4, use_cache=False), 8000, decoder=True),
             "transformers T5ForConditionalGeneration (4+4 layers, d=256, relative position "
             "bias), 2x128 -> 2x64 tokens"),
    Workload("bart", _transformers_model(_hf(
        "BartConfig", "BartForConditionalGeneration", vocab_size=8000, d_model=256,
        encoder_layers=4, decoder_layers=4, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
        max_position_embeddings=512, use_cache=False), 8000, decoder=True),
             "transformers BartForConditionalGeneration (4+4 layers, d=256), 2x128 -> 2x64 "
             "tokens"),
]


WORKLOADS = [
    Workload("pointwise", lambda q: (pointwise_chain, (torch.randn(512, 512) if q else
                                                        torch.randn(2048, 2048),)),
             "sin/cos/relu/sigmoid/tanh chain, 2048x2048"),
    Workload("softmax", lambda q: (softmax, (torch.randn(256, 512) if q else
                                             torch.randn(4096, 1024),)),
             "softmax over the last dim, 4096x1024"),
    Workload("layernorm_gelu", lambda q: (LayerNormGelu(256 if q else 768),
                                          (torch.randn(256, 256) if q else
                                           torch.randn(4096, 768),)),
             "LayerNorm(768) + GELU, 4096x768"),
    Workload("mlp", lambda q: (MLP(256, 1024) if q else MLP(768, 3072),
                               (torch.randn(32, 256) if q else torch.randn(256, 768),)),
             "Linear 768->3072, GELU, Linear 3072->768, batch 256"),
    Workload("transformer_block", lambda q: (TransformerBlock(64, 2, 256) if q else
                                             TransformerBlock(256, 4, 1024),
                                             (torch.randn(2, 32, 64) if q else
                                              torch.randn(8, 128, 256),)),
             "pre-norm attention (SDPA, causal) + MLP block, B=8 T=128 d=256 4 heads"),
    Workload("resnet18", _resnet18, "timm resnet18 (random init), 4x3x224x224"),
    Workload("bert_small", _bert_small,
             "transformers BertModel from BertConfig (2 layers, hidden 128), 8x128 tokens"),
]

#: ``--suite``: the seven kernel-sized workloads, the 21 real models, or both
SUITES = {"kernels": WORKLOADS, "models": MODELS, "all": WORKLOADS + MODELS}


# ------------------------------------------------------------------------------- compilers


class CompileTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    def on_alarm(signum, frame):
        raise CompileTimeout(f"first call took longer than {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def make_compiled(compiler: str, model, inputs) -> Callable:
    if compiler == "inductor":
        import torch._dynamo

        torch._dynamo.reset()
        return torch.compile(model)
    if compiler == "kiln":
        import kiln
        import kiln_frontend

        kiln_frontend.reset()
        return kiln.compile(model)
    if compiler == "kiln-fx":
        from kiln.backend import kiln_backend
        from torch.fx.experimental.proxy_tensor import make_fx

        def flat(*args):
            return tuple(tensors_of(model(*args)))

        gm = make_fx(flat)(*inputs)
        compiled = kiln_backend(gm, list(inputs))
        return lambda *args: compiled(*args)
    raise ValueError(compiler)


def fallback_counts(before, after) -> tuple[int, int]:
    """(graphs run eagerly, ops run through loopir's aten fallback) between two kiln.stats();
    a graph whose compile failed runs eagerly too."""
    aten = sum(v - before.aten_fallbacks.get(k, 0) for k, v in after.aten_fallbacks.items())
    failed = sum(after.compile_failures.values()) - sum(before.compile_failures.values())
    return after.eager_fallbacks - before.eager_fallbacks + failed, aten


def kiln_notes(before, after) -> str:
    """What kiln did for a workload, from kiln.stats() before/after."""
    parts = []
    d = lambda f: getattr(after, f) - getattr(before, f)  # noqa: E731
    parts.append(f"{d('graphs_compiled')} graphs, {d('kernels_generated')} kernels")
    if d("eager_fallbacks"):
        parts.append(f"{d('eager_fallbacks')} graphs eager")
    if d("interpreter_fallbacks"):
        parts.append(f"{d('interpreter_fallbacks')} graphs interpreted")
    fb = {k: v - before.aten_fallbacks.get(k, 0) for k, v in after.aten_fallbacks.items()}
    fb = {k: v for k, v in fb.items() if v}
    if fb:
        parts.append("aten fallbacks: " + ", ".join(sorted(k.split("::")[-1] for k in fb)))
    return "; ".join(parts)


def run_workload(w: Workload, compilers, args, progress: Progress) -> dict:
    """Build, check every compiler against eager (cold first call = compile time), then time
    eager and the compiled variants in interleaved rounds (``interleaved_medians``)."""
    res: dict[str, Any] = {"name": w.name, "what": w.what}
    torch.manual_seed(0)
    progress.step(f"{w.name}: build")
    try:
        model, inputs = w.build(args.quick)
    except Exception as e:
        res["error"] = first_line(e)
        for _ in range(1 + len(compilers)):
            progress.done()
        return res
    if isinstance(model, nn.Module):
        model.eval()
    timing = dict(min_repeat_s=0.02 if args.quick else 0.1, repeats=3 if args.quick else 9,
                  warmup=1 if args.quick else 3)
    with torch.no_grad():
        progress.step(f"{w.name}: eager")
        expected = tensors_of(model(*inputs))
        # eager alone before any compiler ran (median of 10 single calls after 3 warm-ups, a
        # user's plain timing): compared with the interleaved eager below, it shows whether
        # compiling left the process in a state that changes eager's speed
        res["eager_plain_s"] = plain_median(lambda: model(*inputs))
        fns: dict[str, Callable] = {"eager": lambda: model(*inputs)}
        for c in compilers:
            progress.step(f"{w.name}: {c} (compile + check)")
            r: dict[str, Any] = {}
            stats_before = None
            try:
                if c.startswith("kiln"):
                    import kiln

                    stats_before = kiln.stats()
                with time_limit(args.compile_timeout):
                    t0 = time.perf_counter()
                    fn = make_compiled(c, model, inputs)
                    out = fn(*inputs)
                    r["compile_s"] = time.perf_counter() - t0
                try:
                    torch.testing.assert_close(tensors_of(out), expected, rtol=1e-3, atol=1e-3)
                except AssertionError as e:
                    r["error"] = "wrong: " + " / ".join(
                        x.strip() for x in str(e).splitlines() if x.strip())[:160]
                else:
                    fns[c] = lambda fn=fn: fn(*inputs)
            except (Exception, CompileTimeout) as e:
                r["error"] = "error: " + first_line(e)
            if stats_before is not None:
                import kiln

                after = kiln.stats()
                r["notes"] = kiln_notes(stats_before, after)
                r["eager_fallbacks"], r["aten_fallbacks"] = fallback_counts(stats_before, after)
            res[c] = r
            progress.done()
        progress.step(f"{w.name}: timing {', '.join(fns)}")
        times = interleaved_medians(fns, **timing)
        progress.done()
        res["eager_s"] = times["eager"]
        for c in compilers:
            r = res[c]
            if c in times:
                r["time_s"] = times[c]
                r["speedup"] = times["eager"] / times[c]
            line = (f"{w.name:18} {c:9} " + (f"{r['time_s'] * 1e3:9.3f} ms  x{r['speedup']:.2f}  "
                    f"(eager {times['eager'] * 1e3:.3f} ms)  compile {r['compile_s']:.1f} s"
                    if "time_s" in r else r["error"]))
            progress.write(line + (f"  [{r['notes']}]" if r.get("notes") else ""))
    return res


def plain_median(fn: Callable, *, warmup: int = 3, calls: int = 10) -> float:
    """Median seconds of ``calls`` single calls after ``warmup`` calls."""
    import statistics

    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def interleaved_medians(fns: dict[str, Callable], *, min_repeat_s: float, repeats: int,
                        warmup: int) -> dict[str, float]:
    """Median seconds per call of each function, timed in interleaved rounds (one repeat of
    each per round) so that a change in machine load hits every variant alike."""
    import statistics

    calls = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        t0 = time.perf_counter()
        fn()
        one = max(time.perf_counter() - t0, 1e-7)
        calls[name] = max(1, min(10_000, int(min_repeat_s / one)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            n = calls[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - t0) / n)
    return {name: statistics.median(v) for name, v in samples.items()}


# ------------------------------------------------------------------------------- reporting


def table(results, compilers) -> str:
    header = ["workload", "eager ms", "eager alone ms"]
    for c in compilers:
        header += [f"{c} ms", f"{c} speedup", f"{c} compile s"]
        if c.startswith("kiln"):
            header += [f"{c} eager/aten fallbacks"]
    both = "kiln" in compilers and "inductor" in compilers
    if both:
        header += ["kiln / inductor"]
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["name"], "build " + r["error"]] + [""] * (len(header) - 2))
            continue
        row = [r["name"], f"{r['eager_s'] * 1e3:.3f}",
               f"{r['eager_plain_s'] * 1e3:.3f}" if "eager_plain_s" in r else "-"]
        for c in compilers:
            x = r.get(c, {})
            if "time_s" in x:
                row += [f"{x['time_s'] * 1e3:.3f}", f"{x['speedup']:.2f}x",
                        f"{x['compile_s']:.1f}"]
            else:
                row += [x.get("error", "-").replace("|", "/")[:70], "-",
                        f"{x['compile_s']:.1f}" if "compile_s" in x else "-"]
            if c.startswith("kiln"):
                row += [f"{x['eager_fallbacks']}/{x['aten_fallbacks']}"
                        if "eager_fallbacks" in x else "-"]
        if both:
            k, i = r.get("kiln", {}).get("speedup"), r.get("inductor", {}).get("speedup")
            row += [f"{k / i:.2f}" if k and i else "-"]
        rows.append(row)
    geo = ["geomean speedup", "", ""]
    for c in compilers:
        g = geomean(r.get(c, {}).get("speedup") for r in results)
        n = sum(1 for r in results if r.get(c, {}).get("speedup"))
        geo += ["", f"{g:.2f}x ({n} ok)" if g else "-", ""]
        if c.startswith("kiln"):
            geo += [""]
    if both:
        pairs = [(r["kiln"]["speedup"], r["inductor"]["speedup"]) for r in results
                 if r.get("kiln", {}).get("speedup") and r.get("inductor", {}).get("speedup")]
        g = geomean(k / i for k, i in pairs)
        geo += [f"{g:.2f}" if g else "-"]
    rows.append(geo)
    return markdown_table(header, rows)


def notes_table(results, compilers) -> str:
    rows = [[r["name"], c, r[c]["notes"]] for r in results for c in compilers
            if c.startswith("kiln") and r.get(c, {}).get("notes")]
    return markdown_table(["workload", "compiler", "what kiln did"], rows) if rows else ""


def bar_chart(results, compilers, path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = [r["name"] for r in results]
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(names)), 4.2))
    width = 0.8 / max(1, len(compilers))
    for i, c in enumerate(compilers):
        vals = [r.get(c, {}).get("speedup", 0.0) for r in results]
        xs = [j + (i - (len(compilers) - 1) / 2) * width for j in range(len(names))]
        bars = ax.bar(xs, vals, width, label=c)
        for x, v in zip(xs, vals, strict=True):
            ax.text(x, v if v else 1.0, f"{v:.2f}" if v else "x", ha="center", va="bottom",
                    fontsize=7)
        del bars
    ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
    shown = [r.get(c, {}).get("speedup") for r in results for c in compilers]
    shown = [v for v in shown if v]
    if shown and (max(shown) > 4 or min(shown) < 0.25):
        ax.set_yscale("log")  # ratios spanning decades read better on a log axis
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, ha="right")
    ax.set_ylabel("speedup over eager (higher is better)")
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=sorted(SUITES), default="kernels",
                   help="kernels: seven kernel-sized workloads; models: 21 timm/transformers "
                        "models (batch 2); all: both")
    p.add_argument("--models", dest="suite", action="store_const", const="models",
                   help="the model suite (same as --suite models)")
    p.add_argument("--only", default="", help="comma-separated workload names")
    p.add_argument("--quick", action="store_true", help="small sizes, fewer repeats")
    p.add_argument("--via-fx", action="store_true",
                   help="also run kiln through the FX route (make_fx + kiln_backend, no frontend)")
    p.add_argument("--compilers", default="inductor,kiln",
                   help="comma-separated from inductor,kiln,kiln-fx (eager always runs)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--compile-timeout", type=float, default=900.0)
    p.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=True,
                   help="each workload in a fresh Python process with its own empty compiler "
                        "caches (default; what a user who compiles one model sees)")
    p.add_argument("--worker", default="", help=argparse.SUPPRESS)  # one workload, in a child
    p.add_argument("--worker-out", default="", help=argparse.SUPPRESS)
    p.add_argument("--out", default="",
                   help="basename of the results in benchmarks/results (default: cpu for the "
                        "kernels suite, cpu-models / cpu-all for the others)")
    args = p.parse_args(argv)
    args.out = args.out or ("cpu" if args.suite == "kernels" else f"cpu-{args.suite}")

    compilers = [c for c in args.compilers.split(",") if c]
    if args.via_fx and "kiln-fx" not in compilers:
        compilers.append("kiln-fx")
    for c in compilers:
        if c not in COMPILERS:
            p.error(f"unknown compiler {c!r}; known: {', '.join(COMPILERS)}")
    only = [x for x in args.only.split(",") if x]
    suite = SUITES[args.suite]
    workloads = [w for w in suite if not only or w.name in only]
    if only and len(workloads) != len(only):
        known = ", ".join(w.name for w in suite)
        p.error(f"unknown workload in --only {args.only!r}; known: {known}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        return _worker(args, suite, compilers)
    cache = fresh_cache_dirs()
    print(f"CPU benchmark ({args.suite}): {len(workloads)} workloads, compilers {compilers}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, caches in {cache}"
          + (" (quick)" if args.quick else "")
          + (", one fresh process per workload" if args.isolate else ", all in this process"),
          flush=True)

    progress = Progress(len(workloads) * (1 if args.isolate else 1 + len(compilers)),
                        desc="bench")  # isolated: one step per workload; else build+compilers+timing
    results = []
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    try:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        partial = RESULTS_DIR / f"{args.out}.partial.json"
        for w in workloads:
            if args.isolate:
                results.append(run_isolated(w, compilers, args, progress))
            else:
                results.append(run_workload(w, compilers, args, progress))
            # a run killed half-way (OOM, a timeout) still leaves what it measured
            partial.write_text(json.dumps({"results": results}, indent=1, default=str))
    finally:
        progress.close()
    wall = time.perf_counter() - t0

    title = (f"CPU inference speedup over eager, {args.suite} ({torch.get_num_threads()} threads"
             + (", quick sizes" if args.quick else "") + ")")
    text = table(results, compilers)
    notes = notes_table(results, compilers)
    print("\n" + text)
    if notes:
        print("\n" + notes)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/cpu.py " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = {"command": command.strip(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "quick": args.quick, "wall_s": wall, "cpu": _cpu_name(), "suite": args.suite,
            "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
    summary = geomean_summary(results, compilers)
    meta["summary"] = summary
    print("\n" + summary)
    print(f"load average (1/5/15 min) before {_load_text(load_before)}, after "
          f"{_load_text(os.getloadavg())}: other work on the machine inflates absolute times")
    (RESULTS_DIR / f"{args.out}.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=1, default=str))
    md = (f"# {title}\n\nCommand: `{meta['command']}`; {meta['date']}; torch {meta['torch']}; "
          f"{meta['cpu']}; wall {wall:.0f} s; load average before {_load_text(load_before)}, "
          f"after {_load_text(meta['loadavg_after'])}.\n\n{text}\n\n{summary}\n\n{notes}\n")
    (RESULTS_DIR / f"{args.out}.md").write_text(md)
    png = RESULTS_DIR / f"{args.out}.png"
    if bar_chart(results, compilers, png, title):
        print(f"\nchart: {png}")
    partial.unlink(missing_ok=True)
    print(f"results: {RESULTS_DIR / args.out}.json / .md; wall {wall:.0f} s")
    return 0


def run_isolated(w: Workload, compilers, args, progress: Progress) -> dict:
    """``run_workload`` in a child process (``--worker``) with fresh compiler caches: no kernel,
    packed weight, allocator state or thread pool left by an earlier model, as when a user
    compiles one model in a fresh process."""
    import subprocess
    import tempfile

    progress.step(f"{w.name}: fresh process")
    fresh_cache_dirs()  # the child inherits new empty KILN/TORCHINDUCTOR/TRITON cache dirs
    with tempfile.TemporaryDirectory(prefix="kiln-bench-worker-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--suite", args.suite,
               "--worker", w.name, "--worker-out", str(out), "--compilers", ",".join(compilers),
               "--threads", str(args.threads), "--compile-timeout", str(args.compile_timeout)]
        cmd += ["--quick"] if args.quick else []
        try:
            proc = subprocess.run(cmd, timeout=2 * args.compile_timeout + 600)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        progress.done()
        if out.exists():
            return json.loads(out.read_text())
    res = {"name": w.name, "what": w.what, "error": f"worker process ended: {code}"}
    progress.write(f"{w.name:18} {res['error']}")
    return res


def _worker(args, suite, compilers) -> int:
    """The child side of ``run_isolated``: one workload, its result as JSON."""
    (w,) = [w for w in suite if w.name == args.worker]
    progress = Progress(1 + len(compilers), desc=f"  {w.name}")
    try:
        res = run_workload(w, compilers, args, progress)
    finally:
        progress.close()
    Path(args.worker_out).write_text(json.dumps(res, default=str))
    return 0


def _load_text(load) -> str:
    return "/".join(f"{x:.1f}" for x in load)


def geomean_summary(results, compilers) -> str:
    """The targets in one line each: kiln's geomean over inductor's (on the workloads both ran),
    the slowest workload per compiler, and cold compile time against inductor's."""
    lines = []
    base = "inductor" if "inductor" in compilers else None
    for c in compilers:
        ok = [r for r in results if r.get(c, {}).get("speedup")]
        if not ok:
            continue
        worst = min(ok, key=lambda r: r[c]["speedup"])
        text = (f"{c}: geomean {geomean(r[c]['speedup'] for r in ok):.2f}x over {len(ok)}; "
                f"slowest {worst['name']} {worst[c]['speedup']:.2f}x")
        if base and c != base:
            both = [r for r in ok if r.get(base, {}).get("speedup")]
            if both:
                gk = geomean(r[c]["speedup"] for r in both)
                gi = geomean(r[base]["speedup"] for r in both)
                ck = sum(r[c]["compile_s"] for r in both)
                ci = sum(r[base]["compile_s"] for r in both)
                text += (f"; on the {len(both)} both ran: {gk:.2f}x vs inductor {gi:.2f}x "
                         f"= {gk / gi:.2f} of inductor's; cold compile {ck:.0f} s vs {ci:.0f} s "
                         f"({ck / ci:.2f} of inductor's)")
        lines.append(text)
    return "\n".join(lines)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"{os.cpu_count()} cores"


if __name__ == "__main__":
    raise SystemExit(main())
