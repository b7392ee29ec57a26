"""Frame capture on real models: graphs and cold capture time, kiln's frontend vs
torch.compile's (TorchDynamo), both with a backend that runs the graphs as they are.

For each model (``MODELS``: 35 architectures: timm convnets with depthwise convolutions,
vision transformers and mixers; transformers encoder-only, decoder-only and encoder-decoder
LMs, a ViT and two speech models, all built from small configs, no downloads) it runs, in
one process:

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
    python benchmarks/capture.py --features      # the "Python features" table instead

``--features``: small programs per Python feature family, from the frontend's test modules
(every ``packages/frontend/tests/test_capture_*.py``, imported by path): a module-level
``CASES`` list of ``(name, family, fn, args)`` (``args``: one call's arguments, or a ``Calls``
list of argument tuples, a sequence of calls; see ``tests/_capture_cases.py``) or of ``(fn,
make_args, graphs)``; ``_reference_cases.Cases`` registries; and the programs the tests of
test_capture_exceptions / test_capture_context_managers hand to ``_eager_reference.check``.
Families are issue 27's (generators, exceptions, context managers, closures, graph and
recompile counts, self.assert* helpers, builtins and stdlib; the mixed parity modules' cases
by their name's prefix), other modules under their own names.  Each case runs eagerly, under
kiln and under torch.compile (a child process); per family the table gives the cases, how many
each compiler captures as one graph (one graph per compile, ending as eagerly does), the share
of torch.compile's one-graph cases kiln captures in one graph too (issue 27's measure), and how
many kiln matches torch.compile's graph and cache-entry counts on. Writes
``capture-features.json`` (``--features-json``) with per-case counts.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import io
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kiln_frontend  # noqa: E402
from _common import (  # noqa: E402
    RESULTS_DIR,
    ROOT,
    Progress,
    RecordingBackend,
    first_line,
    markdown_table,
    tensors_of,
)


def _torchvision_importable() -> None:
    """timm and transformers import torchvision, which needs the test shim beside the CPU
    build of torch (docs/testing.md)."""
    sys.path.insert(0, str(ROOT / "tests-integration"))
    import _torchvision_shim

    _torchvision_shim.install()


def _timm(name: str, size: int = 224, **kw) -> Callable:
    def build():
        _torchvision_importable()
        import timm

        model = timm.create_model(name, pretrained=False, **kw)
        return model, (torch.randn(2, 3, size, size),), {}

    return build


def _hf(config_cls: str, model_cls: str, inputs: Callable[[], dict], **config) -> Callable:
    """A transformers model built from a small config (random weights, no download);
    ``inputs()`` gives its keyword arguments."""

    def build():
        _torchvision_importable()
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        return getattr(transformers, model_cls)(cfg), (), inputs()

    return build


def _ids(vocab: int = 1000, batch: int = 2, seq: int = 32) -> Callable[[], dict]:
    return lambda: {"input_ids": torch.randint(0, vocab, (batch, seq))}


def _seq2seq(vocab: int = 1000) -> Callable[[], dict]:
    return lambda: {"input_ids": torch.randint(0, vocab, (2, 16)),
                    "decoder_input_ids": torch.randint(0, vocab, (2, 8))}


#: small decoder-only / encoder-only sizes shared by the LM configs
_LM = {"vocab_size": 1000, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
       "intermediate_size": 256, "max_position_embeddings": 128}
_BART = {"vocab_size": 1000, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
         "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 128,
         "decoder_ffn_dim": 128, "max_position_embeddings": 64}
_T5 = {"vocab_size": 1000, "d_model": 64, "d_ff": 128, "d_kv": 32, "num_layers": 2,
       "num_decoder_layers": 2, "num_heads": 2}


MODELS: dict[str, Callable] = {
    # timm: convnets (depthwise: mobilenets, efficientnet, convnext, ghostnet, edgenext)
    "resnet18": _timm("resnet18"),
    "mobilenetv3_small_100": _timm("mobilenetv3_small_100"),
    "mobilenetv2_050": _timm("mobilenetv2_050", 96),
    "efficientnet_b0": _timm("efficientnet_b0", 96),
    "convnext_atto": _timm("convnext_atto", 96),
    "ghostnet_100": _timm("ghostnet_100", 96),
    "regnetx_002": _timm("regnetx_002", 96),
    "edgenext_xx_small": _timm("edgenext_xx_small", 96),
    "poolformer_s12": _timm("poolformer_s12", 64),
    # timm: vision transformers and MLP mixers
    "vit_tiny_patch16_224": _timm("vit_tiny_patch16_224"),
    "deit_tiny_patch16_224": _timm("deit_tiny_patch16_224", 64, img_size=64),
    "mixer_s16_224": _timm("mixer_s16_224", 64, img_size=64),
    "levit_128s": _timm("levit_128s"),
    # transformers: encoder-only LMs
    "bert": _hf("BertConfig", "BertModel", _ids(), **_LM),
    "roberta": _hf("RobertaConfig", "RobertaModel", _ids(), **{**_LM, "max_position_embeddings": 130}),
    "distilbert": _hf("DistilBertConfig", "DistilBertModel", _ids(), vocab_size=1000, dim=128,
                      n_layers=2, n_heads=4, hidden_dim=256, max_position_embeddings=128),
    "albert": _hf("AlbertConfig", "AlbertModel", _ids(), embedding_size=64, **_LM),
    "electra": _hf("ElectraConfig", "ElectraModel", _ids(), embedding_size=64, **_LM),
    "deberta_v2": _hf("DebertaV2Config", "DebertaV2Model", _ids(), **_LM),
    "mobilebert": _hf("MobileBertConfig", "MobileBertModel", _ids(), vocab_size=1000,
                      hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=128, embedding_size=64, intra_bottleneck_size=64,
                      true_hidden_size=64, max_position_embeddings=128),
    "vit_hf": _hf("ViTConfig", "ViTModel", lambda: {"pixel_values": torch.randn(2, 3, 32, 32)},
                  image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=2, intermediate_size=128),
    # transformers: decoder-only LMs
    "gpt2": _hf("GPT2Config", "GPT2LMHeadModel", _ids(), n_embd=128, n_layer=2, n_head=2,
                n_positions=128, vocab_size=1000, bos_token_id=0, eos_token_id=1),
    "llama": _hf("LlamaConfig", "LlamaForCausalLM", _ids(), num_key_value_heads=2, **_LM),
    "mistral": _hf("MistralConfig", "MistralForCausalLM", _ids(), num_key_value_heads=2, **_LM),
    "qwen2": _hf("Qwen2Config", "Qwen2ForCausalLM", _ids(), num_key_value_heads=2, **_LM),
    "gemma": _hf("GemmaConfig", "GemmaForCausalLM", _ids(), num_key_value_heads=2, head_dim=32,
                 **_LM),
    "phi": _hf("PhiConfig", "PhiForCausalLM", _ids(), **_LM),
    "gpt_neox": _hf("GPTNeoXConfig", "GPTNeoXForCausalLM", _ids(), **_LM),
    "opt": _hf("OPTConfig", "OPTForCausalLM", _ids(), vocab_size=1000, hidden_size=128,
               num_hidden_layers=2, num_attention_heads=4, ffn_dim=256, word_embed_proj_dim=128,
               max_position_embeddings=128),
    # transformers: encoder-decoder LMs
    "t5": _hf("T5Config", "T5Model", _seq2seq(), **_T5),
    "t5_no_cache": _hf("T5Config", "T5Model", _seq2seq(), use_cache=False, **_T5),
    "bart": _hf("BartConfig", "BartModel", _seq2seq(), **_BART),
    "mbart": _hf("MBartConfig", "MBartModel", _seq2seq(), **_BART),
    # transformers: speech
    "whisper": _hf("WhisperConfig", "WhisperModel",
                   lambda: {"input_features": torch.randn(1, 80, 64),
                            "decoder_input_ids": torch.randint(0, 1000, (1, 8))},
                   vocab_size=1000, d_model=64, encoder_layers=2, decoder_layers=2,
                   encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128,
                   decoder_ffn_dim=128, num_mel_bins=80, max_source_positions=32,
                   max_target_positions=64, pad_token_id=0, bos_token_id=0, eos_token_id=1,
                   decoder_start_token_id=1),
    "wav2vec2": _hf("Wav2Vec2Config", "Wav2Vec2Model",
                    lambda: {"input_values": torch.randn(1, 4000)},
                    hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=128, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2),
                    conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
                    num_conv_pos_embedding_groups=2),
}


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


def measure(kind: str, model: torch.nn.Module, inputs: tuple, kwargs: dict,
            expected: list) -> Run:
    run = Run()
    backend = RecordingBackend()
    try:
        fn = _compiled(kind, model, backend)
        with torch.no_grad():
            t0 = time.perf_counter()
            out = fn(*inputs, **kwargs)
            run.first_s = time.perf_counter() - t0
            graphs_after_first = len(backend.graphs)
            cached = []
            for _ in range(3):
                t0 = time.perf_counter()
                out2 = fn(*inputs, **kwargs)
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


#: issue 27's families, in its order; other test modules keep their own names as families
FEATURE_FAMILIES = ("generators", "exceptions", "context managers", "closures",
                    "graph and recompile counts", "self.assert* helpers", "builtins and stdlib")
#: a test module's family (the name after ``test_capture_``)
_MODULE_FAMILY = {"generators": "generators", "generators rebuilt": "generators",
                  "exceptions": "exceptions", "context managers": "context managers",
                  "closures": "closures", "recompiles": "graph and recompile counts",
                  "builtins stdlib": "builtins and stdlib"}
#: a mixed module's (test_capture_parity_s*) case family, by the case name's prefix
_PREFIX_FAMILY = {"gen": "generators", "generator": "generators", "exc": "exceptions",
                  "exception": "exceptions", "cm": "context managers",
                  "contextmanager": "context managers", "closure": "closures",
                  "rc": "graph and recompile counts", "assert": "self.assert* helpers",
                  **{p: "builtins and stdlib" for p in (
                      "builtin", "it", "ft", "std", "str", "op", "dc", "nt", "col", "heapq",
                      "functools", "comp")}}


def _family(module_family: str, case_name: str) -> str:
    if case_name.startswith(("assert_", "unittest_")):
        return "self.assert* helpers"
    if module_family.startswith("parity"):
        return _PREFIX_FAMILY.get(case_name.split("_", 1)[0], "other")
    return _MODULE_FAMILY.get(module_family, module_family)


def _checked_programs(mod) -> list[tuple[str, Callable, tuple]]:
    """The programs a check-style test module (``_eager_reference.check(fn, *args)`` in
    each ``test_*`` function: test_capture_exceptions, test_capture_context_managers) hands
    to ``check``: each test without parameters runs with ``check`` recording its calls (what
    the test asserts afterwards on check's result is not run: the recording stands in)."""
    import inspect

    recorded: list[tuple[str, Callable, tuple]] = []
    real = getattr(mod, "check", None)
    if real is None or getattr(real, "__module__", "") != "_eager_reference":
        return recorded
    for name, test in list(vars(mod).items()):
        if not (name.startswith("test_") and inspect.isfunction(test)) or \
                inspect.signature(test).parameters:
            continue
        calls = []

        def record(fn, *args, _calls=calls, **_kw):
            _calls.append((fn, args))
            raise _Recorded

        mod.check = record
        try:
            test()
        except BaseException:  # noqa: BLE001 - _Recorded, or the test's own setup failing
            pass
        finally:
            mod.check = real
        for i, (fn, args) in enumerate(calls):
            recorded.append((name[len("test_"):] + (f"#{i}" if i else ""), fn, args))
    return recorded


class _Recorded(Exception):
    """Stops a test right after the program it hands to ``check`` is recorded."""


def feature_cases() -> list[tuple[str, str, Callable[[str], tuple]]]:
    """``(key, family, run)`` for the cases of every ``packages/frontend/tests/
    test_capture_*.py``, imported by path: its module-level ``CASES`` list, any
    ``_reference_cases.Cases`` registry in it (a case ``case(C)`` compiles with ``C``), and
    the programs its tests hand to ``_eager_reference.check``. The family is the module's
    name after ``test_capture_`` (issue 27's family where it is one), or, in the mixed
    parity modules, the case name's prefix.  ``run(kind)`` runs the case under ``"eager"``,
    ``"kiln"`` or ``"torch"`` and gives ``(graphs, cache entries or None, error)``."""
    import importlib.util

    tests = ROOT / "packages" / "frontend" / "tests"
    if str(tests) not in sys.path:
        sys.path.insert(0, str(tests))
    import _capture_cases as cc
    from _counting_backend import CountingBackend

    def run_case_list(fn, args):
        def run(kind):
            if kind == "eager":
                try:
                    cc.run_eager(fn, args)
                except Exception:  # noqa: BLE001 - a program that raises as it should
                    return 0, None, True
                return 0, None, False
            out = (cc.run_kiln if kind == "kiln" else cc.run_torch)(fn, args)
            return out.graphs, out.entries, out.error is not None
        return run

    def run_registry_case(case):
        def run(kind):
            if kind == "eager":
                return 0, None, False
            backend = CountingBackend()
            if kind == "kiln":
                kiln_frontend.reset()
                compile_ = lambda fn: kiln_frontend.compile(fn, backend=backend)  # noqa: E731
            else:
                _dynamo().reset()
                compile_ = lambda fn: torch.compile(fn, backend=backend)  # noqa: E731
            torch.manual_seed(0)
            try:
                case(compile_)
            except Exception:  # noqa: BLE001 - counted as "not one graph"
                return len(backend.graphs), None, True
            return len(backend.graphs), None, False
        return run

    cases = []
    for path in sorted(tests.glob("test_capture_*.py")):
        spec = importlib.util.spec_from_file_location(f"_features_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # (dataclasses look their module up there)
        try:
            spec.loader.exec_module(mod)
        except Exception as e:  # noqa: BLE001 - one broken module does not stop the table
            print(f"{path.name}: not imported ({first_line(e)})", file=sys.stderr)
            continue
        family = path.stem[len("test_capture_"):].replace("_", " ")
        for entry in getattr(mod, "CASES", ()):
            if len(entry) == 3:  # (fn, make_args, graphs): test_capture_py313_forms' form
                fn, make_args, _graphs = entry
                name, args = fn.__name__, make_args()
            else:
                name, _case_family, fn, args = entry
            cases.append((f"{path.stem}::{name}", _family(family, name), run_case_list(fn, args)))
        for value in vars(mod).values():
            if type(value).__name__ == "Cases" and hasattr(value, "cases"):
                for name, case in value.cases.items():
                    cases.append((f"{path.stem}::{name}", _family(family, name),
                                  run_registry_case(case)))
        if family in ("exceptions", "context managers"):
            for name, fn, args in _checked_programs(mod):
                cases.append((f"{path.stem}::{name}", _family(family, name),
                              run_case_list(fn, args)))
    return cases


def feature_counts(kind: str) -> dict[str, tuple]:
    """``{case key: (graphs, entries, error)}`` under one compiler, with a progress bar."""
    import logging

    logging.disable(logging.CRITICAL)  # the cases' own graph-break chatter
    cases = feature_cases()
    progress = Progress(len(cases), f"features under {kind}")
    out = {}
    for key, _family, run in cases:
        progress.step(key)
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the cases' own prints
                out[key] = run(kind)
        except Exception:  # noqa: BLE001
            out[key] = (0, None, True)
        progress.done()
    progress.close()
    return out


def _one_graph(counts: tuple, eager_raises: bool) -> bool:
    """One graph per compile (a sequence of calls may compile again), ending as eagerly does:
    no error, or an error where eager raises too (exceptions escaping the frame)."""
    graphs, entries, error = counts
    return error == eager_raises and graphs == max(1, entries or 1)


def features_rows(per_case: dict) -> tuple[list[str], list[list]]:
    """The features table from per-case counts (``capture-features.json``'s ``cases``)."""
    rows: dict[str, list[int]] = {}
    for c in per_case.values():
        g, r, raises = tuple(c["kiln"]), tuple(c["torch.compile"]), c["eager_raises"]
        row = rows.setdefault(c["family"], [0, 0, 0, 0, 0])
        kiln_one, torch_one = _one_graph(g, raises), _one_graph(r, raises)
        row[0] += 1
        row[1] += kiln_one
        row[2] += torch_one
        row[3] += kiln_one and torch_one
        row[4] += g[:2] == r[:2]
    order = [f for f in FEATURE_FAMILIES if f in rows] + sorted(set(rows) - set(FEATURE_FAMILIES))
    total = [sum(rows[f][i] for f in order) for i in range(5)]

    def share(row):
        return f"{row[3]}/{row[2]} ({100 * row[3] / row[2]:.0f}%)" if row[2] else "-"

    table = [[f, *rows[f][:3], share(rows[f]), rows[f][4]] for f in order]
    table.append(["total", *total[:3], share(total), total[4]])
    return (["family", "cases", "kiln one graph", "torch.compile one graph",
             "of torch.compile's, kiln too", "kiln = torch.compile counts"], table)


def features_table(json_path: str | None = None) -> int:
    """Per family: cases, one-graph counts of kiln and torch.compile, same counts.
    torch.compile's counts come from a child process of this run: TorchDynamo's eval-frame
    hook can stay installed after a generator frame, and kiln (rightly) stays out of the
    way of a foreign hook."""
    import subprocess

    child = subprocess.run([sys.executable, __file__, "--features-reference"],
                           stdout=subprocess.PIPE, text=True, check=True)
    ref = {k: tuple(v) for k, v in json.loads(child.stdout.strip().splitlines()[-1]).items()}
    eager = feature_counts("eager")
    got = feature_counts("kiln")
    per_case = {}
    for key, family, _run in feature_cases():
        per_case[key] = {"family": family, "kiln": list(got[key]),
                         "torch.compile": list(ref.get(key, (0, None, True))),
                         "eager_raises": eager.get(key, (0, None, False))[2]}
    header, table = features_rows(per_case)
    print(markdown_table(header, table))
    print("one graph: one graph per compile (a case that is a sequence of calls may compile "
          "again), ending as eagerly does (an error only where eager raises); of torch.compile's: "
          "the cases torch.compile captures in one graph that kiln captures in one graph too "
          "(issue 27's measure); counts: graphs and cache entries of the function")
    if json_path:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.strip()
        meta = {"command": "python " + " ".join(["benchmarks/capture.py", *sys.argv[1:]]),
                "commit": commit,
                "date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
                "python": sys.version.split()[0]}
        Path(json_path).write_text(json.dumps(
            {"meta": meta, "header": header, "rows": table, "cases": per_case}, indent=1))
        print(f"results: {json_path}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--json", default=str(RESULTS_DIR / "capture.json"))
    parser.add_argument("--features", action="store_true",
                        help="the Python features table (CASES of the frontend's "
                             "test_capture_*.py modules) instead of the models")
    parser.add_argument("--features-json", default=str(RESULTS_DIR / "capture-features.json"),
                        help="where --features writes its table and per-case counts")
    parser.add_argument("--features-reference", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.features_reference:  # the child process of --features: torch.compile's counts
        print(json.dumps(feature_counts("torch")))
        return 0
    if args.features:
        return features_table(args.features_json)
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
            torch.manual_seed(0)
            model, inputs, kwargs = MODELS[name]()
        except Exception as e:  # noqa: BLE001
            progress.write(f"{name}: cannot build ({first_line(e)})")
            results[name] = {k: Run(error=f"build: {first_line(e)}") for k in ("kiln", "torch")}
            progress.done()
            progress.done()
            continue
        model.eval()
        with torch.no_grad():
            expected = tensors_of(model(*inputs, **kwargs))
        results[name] = {}
        for kind in ("kiln", "torch"):
            progress.step(f"{name} under {'kiln_frontend' if kind == 'kiln' else 'torch.compile'}")
            results[name][kind] = r = measure(kind, copy.deepcopy(model), inputs, kwargs,
                                                expected)
            progress.write(f"  {name} {kind}: graphs={r.graphs} capture={_fmt_s(r.capture_s)}"
                           f"{' ERROR ' + r.error if r.error else ''}")
            progress.done()
    progress.close()

    header = ["model", "correct kiln", "correct torch", "graphs kiln", "graphs torch.compile",
              "capture kiln",
              "capture torch.compile", "kiln / torch", "1st call kiln", "1st call torch",
              "ops kiln", "ops torch", "notes"]
    rows = []
    for name, r in results.items():
        k, t = r["kiln"], r["torch"]
        ratio = (f"{k.capture_s / t.capture_s:.2f}" if k.capture_s is not None
                 and t.capture_s else "-")
        notes = "; ".join(f"{kind}: {x.error}" for kind, x in r.items() if x.error)
        rows.append([name, "yes" if k.ok else "NO", "yes" if t.ok else "NO",
                     k.graphs if k.graphs is not None else "-",
                     t.graphs if t.graphs is not None else "-", _fmt_s(k.capture_s),
                     _fmt_s(t.capture_s), ratio, _fmt_s(k.first_s), _fmt_s(t.first_s), k.ops if k.ops is not None else "-",
                     t.ops if t.ops is not None else "-", notes])
    print(markdown_table(header, rows))
    graph_misses = [n for n, r in results.items()
                    if not (r["kiln"].ok and r["torch"].ok
                            and r["kiln"].graphs <= r["torch"].graphs)]
    print(f"\ncorrect with graphs <= torch.compile's on {len(results) - len(graph_misses)}/"
          f"{len(results)} models" + (f"; not on: {', '.join(graph_misses)}"
                                      if graph_misses else ""))
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
