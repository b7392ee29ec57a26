"""kiln_frontend on CPython 3.13 beside 3.11 (issue 30's "must show"): same graph counts and
results, and guard overhead and cold capture time within 10%.

Runs itself under each interpreter (child processes) and joins what they report:

* ``counts`` (once per interpreter): the seed examples (examples/demo.py sections 1-3, the
  full kiln stack for 2 and 3: their printed lines, timings dropped, and their asserts that
  results equal eager); the frontend's case corpus (every ``CASES`` and ``Cases`` registry of
  ``packages/frontend/tests/test_capture_*.py``, as ``capture.py --features`` collects them:
  graphs, cache entries, error, and for ``CASES`` whether the results equal eager's); the
  model capture benchmark (``capture.py``'s MODELS under kiln only: graphs, ops, correct).
* ``timing`` (rounds alternating the interpreters, one process each, since the machine is
  shared): guard overhead (per-call time of a compiled function whose guards pass, minus the
  same call eager) and cold capture time (the first call of each model in the process minus
  a cached one, eager backend).  Minimum and median over every sample.

    python benchmarks/py313.py                       # both parts, writes results/py313.json
    python benchmarks/py313.py --skip-counts --rounds 5

To measure one commit while the checkout changes under you: ``git archive HEAD packages
benchmarks examples tests-integration | tar -x -C SNAP``, copy the built ``*.so`` of
``packages/frontend/src/kiln_frontend`` there, and run ``SNAP/benchmarks/py313.py`` with
KILN_PY311/KILN_PY313 set.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: the two interpreters (kiln installed editable in each); KILN_PY311/KILN_PY313 override
PYTHONS = {"3.11": Path(os.environ.get("KILN_PY311", ROOT / ".nox" / "tests" / "bin" / "python")),
           "3.13": Path(os.environ.get("KILN_PY313", ROOT / ".venv313" / "bin" / "python"))}
TIMING_MODELS = ("resnet18", "vit_tiny_patch16_224", "bert", "gpt2")


# ---------------------------------------------------------------------------------------
# child: runs under one interpreter, prints one JSON line
# ---------------------------------------------------------------------------------------


def _seed() -> dict:
    """examples/demo.py sections 1-3: their output lines without timings (they assert that
    results equal eager themselves)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import demo

    out = {}
    for name in ("seed_toy_example", "cos_plus_sin", "dynamic_shapes"):
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                getattr(demo, name)()
            lines = [ln.strip() for ln in buf.getvalue().splitlines()
                     if ln.strip() and not ln.startswith("=") and " ms" not in ln
                     and "kiln_demo_" not in ln and "---" not in ln]
            # sections 2/3 print generated code; keep the counting lines only
            out[name] = [ln for ln in lines if "graph" in ln or "kernels generated" in ln]
        except Exception as e:  # noqa: BLE001 - reported side by side
            out[name] = [f"ERROR {type(e).__name__}: {e}"]
    return out


def _features() -> dict:
    """Per case: [graphs, entries, error, results equal eager (None: not checked)]."""
    import logging

    import capture

    logging.disable(logging.CRITICAL)
    cases = capture.feature_cases()  # puts the tests folder on sys.path
    import _capture_cases as cc

    same: dict[str, bool] = {}
    current = [""]
    run_kiln = cc.run_kiln

    def checked(fn, args, **kw):
        out = run_kiln(fn, args, **kw)
        if out.error is None:
            try:
                cc.assert_same(out.results, cc.run_eager(fn, args))
                same[current[0]] = True
            except Exception:  # noqa: BLE001
                same[current[0]] = False
        return out

    cc.run_kiln = checked
    result = {}
    for key, _family, run in cases:
        current[0] = key
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                graphs, entries, error = run("kiln")
        except Exception:  # noqa: BLE001
            graphs, entries, error = 0, None, True
        result[key] = [graphs, entries, error, same.get(key)]
    return result


def _models() -> dict:
    import capture
    import torch

    capture.warm_up()
    out = {}
    for name, build in capture.MODELS.items():
        try:
            torch.manual_seed(0)
            model, inputs, kwargs = build()
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": f"build: {e}"}
            continue
        model.eval()
        with torch.no_grad():
            expected = capture.tensors_of(model(*inputs, **kwargs))
        r = capture.measure("kiln", copy.deepcopy(model), inputs, kwargs, expected)
        out[name] = {"graphs": r.graphs, "ops": r.ops, "ok": r.ok, "error": r.error}
    return out


def _per_call(fns: dict, args, inner: int, repeats: int) -> dict[str, list[float]]:
    """Per-call seconds of each of ``fns``, ``repeats`` samples of ``inner`` calls, the
    functions taking turns sample by sample (a change in the machine's load hits all)."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn(*args)
            samples[name].append((time.perf_counter() - t0) / inner)
    return samples


def _guard_subjects() -> dict:
    """The guard-overhead subjects: a small module with three tensor arguments and a
    three-tensor function."""
    import torch

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x, y, z):
            return torch.relu(self.lin(x)) + y * z

    def add3(a, b, c):
        return a + b * c

    torch.manual_seed(0)
    return {"module_3_tensors": Small(), "function_3_tensors": add3}


def _guard_overhead(repeats: int) -> dict:
    """Per-call seconds, compiled (guards pass, eager backend) and eager, of a small module
    with three tensor arguments and of a three-tensor function."""
    import capture
    import kiln_frontend
    import torch

    torch.manual_seed(0)
    out = {}
    for name, fn in _guard_subjects().items():
        args = (torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8))
        kiln_frontend.reset()
        backend = capture.RecordingBackend()
        compiled = kiln_frontend.optimize(backend)(fn)
        with torch.no_grad():
            for _ in range(20):
                compiled(*args)
            assert len(backend.graphs) == 1, f"{name}: {len(backend.graphs)} graphs"
            out[name] = _per_call({"compiled": compiled, "eager": fn}, args, 200, repeats)
    return out


def _cold_capture(repeats: int) -> dict:
    """Cold capture seconds per model: a kiln reset, a fresh copy of the model and its first
    call minus a cached call (capture.measure), ``repeats`` times."""
    import capture
    import torch

    capture.warm_up()
    out = {}
    for name in TIMING_MODELS:
        torch.manual_seed(0)
        model, inputs, kwargs = capture.MODELS[name]()
        model.eval()
        with torch.no_grad():
            expected = capture.tensors_of(model(*inputs, **kwargs))
        samples = []
        for _ in range(repeats):
            r = capture.measure("kiln", copy.deepcopy(model), inputs, kwargs, expected)
            assert r.ok, f"{name}: {r.error}"
            samples.append(r.capture_s)
        out[name] = samples
    return out


def _calls(path: str, n: int) -> None:
    """What ``--callgrind`` counts: ``n`` compiled and ``n`` eager calls (eager through
    ``functools.partial``, which names them in the profile) of ``path``'s small module or
    function, in alternating chunks of 10 (the ops of both see the same allocator state),
    each chunk an ``itertools.starmap`` (callgrind collects inside ``starmap_next`` only)."""
    import functools
    import itertools

    import capture
    import kiln_frontend
    import torch

    fns = _guard_subjects()
    fn = fns[path]
    args = (torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8))
    backend = capture.RecordingBackend()
    compiled = kiln_frontend.optimize(backend)(fn)
    eager = functools.partial(fn)
    chunk = [args] * 10
    with torch.no_grad():
        for _ in range(50):
            compiled(*args)
            eager(*args)
        assert len(backend.graphs) == 1, f"{path}: {len(backend.graphs)} graphs"
        if os.environ.get("KILN_CALLGRIND_CONTROL"):  # instrument from here on (fast start)
            subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True,
                           stdout=subprocess.DEVNULL)
        for _ in range(n // 10):
            for _ in itertools.starmap(compiled, chunk):
                pass
            for _ in itertools.starmap(eager, chunk):
                pass


def _callgrind(version: str, path: str, n: int, out_dir: Path) -> dict:
    """Instructions per call (compiled, eager, their difference: the guard overhead) of
    ``path`` under ``version``, from callgrind's inclusive counts of ``starmap_next`` (all
    calls) and of ``partial_call``/``partial_vectorcall`` (the eager ones)."""
    out = out_dir / f"callgrind.{version}.{path}.out"
    srcs = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]
    # a fixed hash seed: str hashes otherwise change dict probe paths from run to run
    # (measured: +-2k instructions on the module subject between two runs)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(srcs), "KILN_CALLGRIND_CONTROL": "1",
           "PYTHONHASHSEED": "0"}
    subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no", "--instr-atstart=no",
                    "--toggle-collect=starmap_next", f"--callgrind-out-file={out}",
                    str(PYTHONS[version]), __file__, "--child", "calls", "--path", path,
                    "--calls", str(n)], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from _common import callgrind_inclusive

    inclusive = callgrind_inclusive(out)

    total = inclusive(r"PROGRAM TOTALS")
    eager = inclusive(r":partial_(vectorcall|call) \[")
    return {"compiled": (total - eager) / n, "eager": eager / n,
            "overhead": (total - 2 * eager) / n}


def child(part: str, repeats: int) -> dict:
    sys.path.insert(0, str(HERE))
    if part == "counts":
        return {"seed": _seed(), "features": _features(), "models": _models()}
    # one cold capture per model per process: kiln_frontend.reset() leaves warm what a
    # process keeps (measured: bert 0.26, 0.14, 0.04 s on three captures in one process)
    return {"guard": _guard_overhead(repeats * 10), "cold": _cold_capture(1)}


# ---------------------------------------------------------------------------------------
# parent: runs the children and joins them
# ---------------------------------------------------------------------------------------


def _run_child(version: str, part: str, repeats: int) -> dict:
    """One child; the packages come from this script's tree (ahead of the editable installs),
    so a copy of a commit (``git archive`` plus the built extensions) measures that commit
    while others edit the checkout."""
    srcs = [str(p) for p in sorted((ROOT / "packages").glob("*/src"))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(srcs)}
    proc = subprocess.run([str(PYTHONS[version]), __file__, "--child", part,
                           "--repeats", str(repeats)], cwd=ROOT, stdout=subprocess.PIPE,
                          text=True, check=True, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _stats(samples: list[float]) -> dict:
    return {"min": min(samples), "median": statistics.median(samples), "n": len(samples)}


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def compare_counts(a: dict, b: dict) -> dict:
    """Side by side; lists what differs."""
    seed = {k: {"3.11": a["seed"][k], "3.13": b["seed"][k], "same": a["seed"][k] == b["seed"][k]}
            for k in a["seed"]}
    fa, fb = a["features"], b["features"]
    feature_diff = {k: {"3.11": fa.get(k), "3.13": fb.get(k)} for k in sorted(set(fa) | set(fb))
                    if fa.get(k) != fb.get(k)}
    ma, mb = a["models"], b["models"]
    models = {k: {"3.11": ma[k], "3.13": mb.get(k)} for k in ma}
    summary = {
        "seed_same": all(v["same"] for v in seed.values()),
        "features_cases": len(fa), "features_differ": sorted(feature_diff),
        "features_one_graph": {v: sum(1 for g, e, err, _s in f.values()
                                      if not err and g == max(1, e or 1))
                               for v, f in (("3.11", fa), ("3.13", fb))},
        "features_results_equal_eager": {v: sum(1 for *_x, s in f.values() if s)
                                         for v, f in (("3.11", fa), ("3.13", fb))},
        "models_correct": {v: sum(1 for r in m.values() if r.get("ok"))
                           for v, m in (("3.11", ma), ("3.13", mb))},
        "models_differ": sorted(k for k in ma if ma[k] != mb.get(k)),
    }
    return {"summary": summary, "seed": seed, "features_differ": feature_diff, "models": models}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=("counts", "timing", "calls"), help=argparse.SUPPRESS)
    parser.add_argument("--path", default="function_3_tensors", help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=1000,
                        help="with --callgrind: compiled and eager calls counted per run")
    parser.add_argument("--callgrind", action="store_true",
                        help="instead of counts and timing: guard overhead in instructions "
                        "per call (valgrind's callgrind, both interpreters and both subjects; "
                        "deterministic where timing on a shared machine moves 10-20%%)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="guard samples of 200 calls per round: 10x this")
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds, interpreters "
                        "alternating, one process each (one cold capture per model)")
    parser.add_argument("--skip-counts", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--json", default=str(HERE / "results" / "py313.json"))
    args = parser.parse_args(argv)
    if args.child == "calls":
        sys.path.insert(0, str(HERE))
        _calls(args.path, args.calls)
        return 0
    if args.child:
        print(json.dumps(child(args.child, args.repeats)))
        return 0

    out_path = Path(args.json)
    result = json.loads(out_path.read_text()) if out_path.exists() else {}
    load_before = os.getloadavg()
    result["interpreters"] = {v: subprocess.run([str(p), "-c", "import sys, torch; print("
                                                 "sys.version.split()[0], torch.__version__)"],
                                                stdout=subprocess.PIPE, text=True).stdout.strip()
                              for v, p in PYTHONS.items()}
    if args.callgrind:
        import tempfile

        rows = {}
        with tempfile.TemporaryDirectory() as tmp:
            for path in ("function_3_tensors", "module_3_tensors"):
                got = {v: _callgrind(v, path, args.calls, Path(tmp)) for v in PYTHONS}
                rows[path] = {**got, "ratio": _ratio(got["3.13"]["overhead"],
                                                     got["3.11"]["overhead"])}
                print(f"{path:20} overhead instructions/call 3.11 {got['3.11']['overhead']:8.0f}"
                      f"  3.13 {got['3.13']['overhead']:8.0f}  ratio {rows[path]['ratio']:.3f}")
        result["instructions"] = rows
        out_path.write_text(json.dumps(result, indent=1))
        print(f"results: {out_path}", file=sys.stderr)
        return 0
    if not args.skip_counts:
        counts = {v: _run_child(v, "counts", args.repeats) for v in PYTHONS}
        result["counts"] = compare_counts(counts["3.11"], counts["3.13"])
        print(json.dumps(result["counts"]["summary"], indent=1))
        for name, row in result["counts"]["models"].items():
            a, b = row["3.11"], row["3.13"] or {}
            print(f"{name:24} graphs {a.get('graphs')!s:>3} | {b.get('graphs')!s:>3}   ops "
                  f"{a.get('ops')!s:>4} | {b.get('ops')!s:>4}   correct {a.get('ok')} | "
                  f"{b.get('ok')}")
    if not args.skip_timing:
        samples: dict[str, dict] = {v: {} for v in PYTHONS}
        for _ in range(args.rounds):
            for v in PYTHONS:
                got = _run_child(v, "timing", args.repeats)
                for fn, t in got["guard"].items():
                    for kind, s in t.items():
                        samples[v].setdefault(f"guard/{fn}/{kind}", []).extend(s)
                for model, s in got["cold"].items():
                    samples[v].setdefault(f"cold/{model}", []).extend(s)
        timing = {}
        for key in samples["3.11"]:
            a, b = _stats(samples["3.11"][key]), _stats(samples["3.13"][key])
            timing[key] = {"3.11": a, "3.13": b, "ratio_min": _ratio(b["min"], a["min"]),
                           "ratio_median": _ratio(b["median"], a["median"])}
        for fn in ("module_3_tensors", "function_3_tensors"):  # the guards' share
            over = {}
            for v in PYTHONS:
                c, e = samples[v][f"guard/{fn}/compiled"], samples[v][f"guard/{fn}/eager"]
                over[v] = {"min": min(c) - min(e),
                           "median": statistics.median(c) - statistics.median(e)}
            timing[f"guard/{fn}/overhead"] = {
                **over, "ratio_min": _ratio(over["3.13"]["min"], over["3.11"]["min"]),
                "ratio_median": _ratio(over["3.13"]["median"], over["3.11"]["median"])}
        result["timing"] = timing
        result["timing_samples"] = samples
        print(f"{'':44} {'3.11 min':>10} {'3.13 min':>10} {'ratio':>6} {'3.11 med':>10} "
              f"{'3.13 med':>10} {'ratio':>6}")
        for key, row in timing.items():
            print(f"{key:44} {row['3.11']['min'] * 1e6:9.1f}u {row['3.13']['min'] * 1e6:9.1f}u "
                  f"{row['ratio_min'] or 0:6.2f} {row['3.11']['median'] * 1e6:9.1f}u "
                  f"{row['3.13']['median'] * 1e6:9.1f}u {row['ratio_median'] or 0:6.2f}")
    result["meta"] = _meta(argv, load_before)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    print(f"results: {out_path}", file=sys.stderr)
    return 0


def _meta(argv, load_before) -> dict:
    """What the timing rows were taken with: the command, the commit, the machine's load."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "packages", "benchmarks"],
                           cwd=ROOT, stdout=subprocess.PIPE, text=True).stdout.strip()
    return {"command": " ".join(["python", "benchmarks/py313.py",
                                 *(sys.argv[1:] if argv is None else argv)]),
            "commit": commit, "working_tree_changed": bool(dirty),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}


if __name__ == "__main__":
    sys.exit(main())
