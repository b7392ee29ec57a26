"""Guard overhead per call: kiln's frontend against torch.compile's (issue 27's "must show").

For each subject of ``SUBJECTS`` (a function of three tensors; a module with parameters and
buffers; a 50-layer ``nn.Sequential``; a function taking an int and a float; a method of a
module holding a list of submodules; a function reading a global tensor and a global config
flag; a 2-layer BERT from transformers, built from a config, at batch 1, sequence 8) it
compiles the subject with ``kiln_frontend.optimize(backend)`` and with
``torch.compile(backend=backend)``, ``backend`` recording each graph and returning
``gm.forward`` (what both compilers' ``eager`` backend does: the graph runs as eager ops),
so what a call costs over eager is capture's share only: the hook, the guards, the call of
the graph. Results are checked against eager, and a call that captures again (a guard that
fails on the timing inputs) is reported, not timed as if cached.

Per call: ``rounds`` rounds, each timing ``inner`` calls of eager, kiln and torch.compile in
turn (a change of the machine's load hits all three); a compiler's overhead is its per-call
time minus eager's of the same round, and the table shows the median over rounds (and the
minimum). The model subject is also timed with each compiler's default backend (kiln's full
stack, torch.compile's inductor): there the difference includes the generated code's speed.

    python benchmarks/overhead.py                      # writes results/overhead.json
    python benchmarks/overhead.py --only function_3_tensors,sequential_50 --rounds 31
    python benchmarks/overhead.py --smoke              # few rounds, no default backends

Each interpreter's run is kept under its own key (``python3.11``, ``python3.13``) of the JSON,
so running this under both interpreters puts their rows side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kiln_frontend  # noqa: E402
from _common import (  # noqa: E402,E501
    RESULTS_DIR,
    ROOT,
    Progress,
    RecordingBackend,
    callgrind_inclusive,
    first_line,
    last_hidden_state,
    markdown_table,
    tensors_of,
)

# ---------------------------------------------------------------------------------------
# Subjects: name -> build() returning (callable, args); a registry (names are unique)
# ---------------------------------------------------------------------------------------


@dataclass
class Subject:
    build: Callable[[], tuple[Callable, tuple]]
    #: also timed with each compiler's default backend
    default_backends: bool = False


SUBJECTS: dict[str, Subject] = {}


def subject(name: str, *, default_backends: bool = False):
    def register(build):
        if name in SUBJECTS:
            raise ValueError(f"subject {name!r} is registered twice")
        SUBJECTS[name] = Subject(build, default_backends)
        return build

    return register


def add3(a, b, c):
    return a + b * c


@subject("function_3_tensors")
def _function_3_tensors():
    return add3, tuple(torch.randn(4, 8) for _ in range(3))


class ParamsAndBuffers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.norm = torch.nn.BatchNorm1d(8)  # running_mean, running_var, num_batches_tracked
        self.register_buffer("scale", torch.rand(8))

    def forward(self, x):
        return self.norm(self.lin(x)) * self.scale


@subject("module_params_buffers")
def _module_params_buffers():
    return ParamsAndBuffers().eval(), (torch.randn(4, 8),)


@subject("sequential_50")
def _sequential_50():
    layers = [torch.nn.Linear(16, 16) if i % 2 == 0 else torch.nn.ReLU() for i in range(50)]
    return torch.nn.Sequential(*layers).eval(), (torch.randn(2, 16),)


def scaled_shift(x, n: int, alpha: float):
    return x * n + alpha


@subject("function_int_float")
def _function_int_float():
    return scaled_shift, (torch.randn(4, 8), 3, 0.5)


class Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))

    def run_blocks(self, x):
        for block in self.blocks:
            x = torch.relu(block(x))
        return x


@subject("method_module_list")
def _method_module_list():
    return Blocks().eval().run_blocks, (torch.randn(4, 8),)


GLOBAL_WEIGHT = torch.randn(8)
CONFIG = types.SimpleNamespace(use_relu=True)


def reads_globals(x):
    y = x * GLOBAL_WEIGHT
    if CONFIG.use_relu:
        y = torch.relu(y)
    return y


@subject("function_reading_globals")
def _function_reading_globals():
    return reads_globals, (torch.randn(4, 8),)


@subject("bert_2_layers_b1_s8", default_backends=True)
def _bert():
    sys.path.insert(0, str(ROOT / "tests-integration"))
    import _torchvision_shim

    _torchvision_shim.install()
    import transformers

    cfg = transformers.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=256)
    model = last_hidden_state(transformers.BertModel(cfg)).eval()
    return model, (torch.randint(0, 1000, (1, 8)),)


# ---------------------------------------------------------------------------------------
# Compiling and timing
# ---------------------------------------------------------------------------------------


def _dynamo():
    """torch.compile's frontend, for its reset() (benchmarks only)."""
    import importlib

    return importlib.import_module("torch._dynamo")


def _compile(compiler: str, fn: Callable, backend: Any) -> Callable:
    if compiler == "kiln":
        if backend == "default":
            return kiln_frontend.compile(fn)  # backend "kiln": the full stack
        return kiln_frontend.optimize(backend)(fn)
    if backend == "default":
        return torch.compile(fn)
    return torch.compile(fn, backend=backend)


def _per_call(fns: dict[str, Callable], args: tuple, inner: int, rounds: int
              ) -> dict[str, list[float]]:
    """Per-call seconds of each of ``fns``: ``rounds`` samples of ``inner`` calls, the
    functions taking turns within each round."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn(*args)
            samples[name].append((time.perf_counter() - t0) / inner)
    return samples


def _inner_for(fn: Callable, args: tuple, target_s: float) -> int:
    """Calls per sample so that one sample of ``fn`` lasts about ``target_s``."""
    t0 = time.perf_counter()
    for _ in range(10):
        fn(*args)
    one = max((time.perf_counter() - t0) / 10, 1e-7)
    return max(5, min(20_000, int(target_s / one)))


def measure(name: str, backend_kind: str, rounds: int, target_s: float) -> dict:
    """One subject under both compilers with one kind of backend ("eager": a recording
    backend that runs the graph as is; "default": each compiler's own)."""
    torch.manual_seed(0)
    fn, args = SUBJECTS[name].build()
    with torch.no_grad():
        expected = tensors_of(fn(*args))
        compiled: dict[str, Callable] = {}
        backends: dict[str, RecordingBackend | None] = {}
        for compiler in ("kiln", "torch"):
            (kiln_frontend.reset if compiler == "kiln" else _dynamo().reset)()
            backend = RecordingBackend() if backend_kind == "eager" else None
            compiled[compiler] = _compile(compiler, fn, backend or "default")
            backends[compiler] = backend
        graphs_after_warmup = {}
        for compiler, cfn in compiled.items():
            for _ in range(3):
                got = tensors_of(cfn(*args))
            assert len(got) == len(expected), f"{name} {compiler}: {len(got)} outputs"
            for g, e in zip(got, expected, strict=True):
                torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
            b = backends[compiler]
            graphs_after_warmup[compiler] = len(b.graphs) if b is not None else None
        fns = {"eager": fn, **compiled}
        inner = _inner_for(fn, args, target_s)
        samples = _per_call(fns, args, inner, rounds)
    row: dict = {"eager_s": {"median": statistics.median(samples["eager"]),
                             "min": min(samples["eager"])},
                 "inner": inner, "rounds": rounds}
    for compiler in compiled:
        over = [c - e for c, e in zip(samples[compiler], samples["eager"], strict=True)]
        b = backends[compiler]
        row[compiler] = {
            "overhead_s": {"median": statistics.median(over),
                           "min": min(samples[compiler]) - min(samples["eager"])},
            "compiled_s": {"median": statistics.median(samples[compiler]),
                           "min": min(samples[compiler])},
            "graphs": graphs_after_warmup[compiler],
            # a guard that fails on the same inputs would capture again while timed
            "captured_while_timed": (len(b.graphs) - graphs_after_warmup[compiler]
                                     if b is not None else None),
        }
    return row


# ---------------------------------------------------------------------------------------
# --callgrind: instructions per call (deterministic where timings on a shared machine move)
# ---------------------------------------------------------------------------------------


def _calls_child(name: str, compiler: str, n: int) -> None:
    """What ``--callgrind`` counts in one process: ``n`` calls of the compiled subject and
    ``n`` eager ones (through ``functools.partial``, which names them in the profile), in
    alternating chunks of 10, each chunk an ``itertools.starmap`` (collected inside
    ``starmap_next`` only)."""
    import functools
    import itertools

    torch.manual_seed(0)
    fn, args = SUBJECTS[name].build()
    backend = RecordingBackend()
    compiled = _compile(compiler, fn, backend)
    eager = functools.partial(fn)
    chunk = [args] * 10
    with torch.no_grad():
        for _ in range(30):
            compiled(*args)
            eager(*args)
        graphs = len(backend.graphs)
        subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True,
                       stdout=subprocess.DEVNULL)
        for _ in range(n // 10):
            for _ in itertools.starmap(compiled, chunk):
                pass
            for _ in itertools.starmap(eager, chunk):
                pass
    assert len(backend.graphs) == graphs, f"{name} {compiler}: captured again while counted"


def callgrind(name: str, compiler: str, n: int, keep: Path | None = None) -> dict:
    """Instructions per call of ``name`` under ``compiler`` (eager backend): compiled, eager
    and their difference, from callgrind's inclusive counts of ``starmap_next`` (all calls)
    and ``partial_call``/``partial_vectorcall`` (the eager ones)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env = {**os.environ, "PYTHONHASHSEED": "0"}  # same dict probe paths run to run
        subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no",
                        "--instr-atstart=no", "--toggle-collect=starmap_next",
                        f"--callgrind-out-file={out}", sys.executable, __file__,
                        "--calls-child", f"{name}:{compiler}:{n}"], cwd=ROOT, env=env,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        inclusive = callgrind_inclusive(out)
        if keep is not None:
            keep.write_bytes(out.read_bytes())

    total = inclusive(r"PROGRAM TOTALS")
    eager = inclusive(r":partial_(vectorcall|call) \[")
    return {"compiled": (total - eager) / n, "eager": eager / n,
            "overhead": (total - 2 * eager) / n}


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b > 0 else "-"


def table(rows: dict[str, dict]) -> str:
    header = ["subject", "backend", "eager us", "kiln overhead us", "torch.compile overhead us",
              "kiln / torch", "graphs kiln", "graphs torch"]
    lines = []
    for key, r in rows.items():
        if "error" in r:
            lines.append([key, "", "-", "-", "-", "-", "-", r["error"]])
            continue
        name, kind = key.split("/")
        k, t = r["kiln"]["overhead_s"]["median"], r["torch"]["overhead_s"]["median"]
        lines.append([name, kind, f"{r['eager_s']['median'] * 1e6:.1f}", f"{k * 1e6:.2f}",
                      f"{t * 1e6:.2f}", _ratio(k, t), r["kiln"]["graphs"] or "-",
                      r["torch"]["graphs"] or "-"])
    return markdown_table(header, lines)


def _meta(argv: list[str] | None, load_before: tuple) -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "packages", "benchmarks"],
                           cwd=ROOT, stdout=subprocess.PIPE, text=True).stdout.strip()
    return {"command": " ".join(["python", "benchmarks/overhead.py",
                                 *(sys.argv[1:] if argv is None else argv)]),
            "python": sys.version.split()[0], "torch": torch.__version__,
            "commit": commit, "working_tree_changed": bool(dirty),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated subject names")
    parser.add_argument("--rounds", type=int, default=21, help="timing rounds (median over)")
    parser.add_argument("--sample-ms", type=float, default=10.0,
                        help="about how long one sample of eager calls lasts")
    parser.add_argument("--smoke", action="store_true",
                        help="5 rounds of 2 ms samples, eager backends only (a quick check)")
    parser.add_argument("--json", default=None, help="default: results/overhead.json "
                        "(results/overhead-smoke.json with --smoke)")
    parser.add_argument("--callgrind", action="store_true",
                        help="instead of timing: instructions per call over eager, kiln and "
                        "torch.compile (valgrind's callgrind; eager backends)")
    parser.add_argument("--calls", type=int, default=200, help="with --callgrind: calls "
                        "counted per compiler and subject")
    parser.add_argument("--keep", default=None, help="with --callgrind: a folder to keep "
                        "the callgrind files in (callgrind.<python>.<subject>.<compiler>)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--calls-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.calls_child:
        torch.set_num_threads(args.threads)
        name, compiler, n = args.calls_child.split(":")
        _calls_child(name, compiler, int(n))
        return 0
    names = [n for n in args.only.split(",") if n] or list(SUBJECTS)
    unknown = sorted(set(names) - set(SUBJECTS))
    if unknown:
        parser.error(f"unknown subject(s) {unknown}; known: {list(SUBJECTS)}")
    # one intra-op thread: a shared machine's other work then slows the ops of all three
    # variants alike instead of stalling OpenMP's spinning threads (the numbers are the
    # per-call costs around the ops, not the ops)
    torch.set_num_threads(args.threads)
    if args.callgrind:
        return _callgrind_main(names, args, argv)
    rounds, sample_s = (5, 0.002) if args.smoke else (args.rounds, args.sample_ms / 1e3)
    runs = [(n, "eager") for n in names]
    if not args.smoke:
        runs += [(n, "default") for n in names if SUBJECTS[n].default_backends]

    load_before = os.getloadavg()
    progress = Progress(len(runs), "overhead")
    rows: dict[str, dict] = {}
    for name, kind in runs:
        progress.step(f"{name} ({kind} backend)")
        try:
            rows[f"{name}/{kind}"] = r = measure(name, kind, rounds, sample_s)
            progress.write(f"  {name} {kind}: kiln {r['kiln']['overhead_s']['median'] * 1e6:.2f}"
                           f" us, torch.compile {r['torch']['overhead_s']['median'] * 1e6:.2f} us"
                           f" over eager {r['eager_s']['median'] * 1e6:.1f} us")
        except Exception as e:  # noqa: BLE001 - a benchmark reports what it gets
            rows[f"{name}/{kind}"] = {"error": first_line(e)}
            progress.write(f"  {name} {kind}: ERROR {first_line(e)}")
        progress.done()
    progress.close()
    print(table(rows))

    out_path = Path(args.json or RESULTS_DIR / ("overhead-smoke.json" if args.smoke
                                                else "overhead.json"))
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    key = f"python{sys.version_info.major}.{sys.version_info.minor}"
    result.setdefault(key, {}).update({"meta": _meta(argv, load_before), "rows": rows})
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    print(f"results: {out_path} [{key}]", file=sys.stderr)
    return 0


def _callgrind_main(names: list[str], args: argparse.Namespace, argv: list[str] | None) -> int:
    py = f"python{sys.version_info.major}.{sys.version_info.minor}"
    keep = Path(args.keep) if args.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    rows, lines = {}, []
    progress = Progress(len(names) * 2, "callgrind")
    for name in names:
        row = {}
        for compiler in ("kiln", "torch"):
            progress.step(f"{name} under {compiler}")
            path = keep / f"callgrind.{py}.{name}.{compiler}" if keep else None
            try:
                row[compiler] = callgrind(name, compiler, args.calls, path)
            except Exception as e:  # noqa: BLE001
                row[compiler] = {"error": first_line(e)}
            progress.done()
        rows[name] = row
        k, t = row["kiln"].get("overhead"), row["torch"].get("overhead")
        lines.append([name, f"{row['kiln'].get('eager', 0):.0f}",
                      f"{k:.0f}" if k is not None else row["kiln"].get("error"),
                      f"{t:.0f}" if t is not None else row["torch"].get("error"),
                      _ratio(k, t) if k is not None and t is not None else "-"])
    progress.close()
    print(markdown_table(["subject", "eager instr/call", "kiln overhead instr/call",
                          "torch.compile overhead instr/call", "kiln / torch"], lines))
    out_path = Path(args.json or RESULTS_DIR / "overhead.json")
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    result.setdefault(py, {})["instructions"] = {"meta": _meta(argv, os.getloadavg()),
                                                 "rows": rows}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    print(f"results: {out_path} [{py}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
