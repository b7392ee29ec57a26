"""Per-step CPU time of kiln's and inductor's wrappers on one benchmarks/cpu.py model: every
kernel launch and library call in each wrapper's ``call`` is timed (the function's code is
replaced by an instrumented copy), then summed by kind (generated kernels, each extern op).
One thread and ``time.thread_time`` by default, so a loaded machine moves the numbers little.

    THREADS=1 python experiments/cpu-linear/wrapper_step_times.py whisper_encoder 10
    RSC=0 python experiments/cpu-linear/wrapper_step_times.py whisper_encoder 10 --only kiln

CLOCK=wall uses perf_counter instead; RSC=0/1 sets loopir's REALIZE_SHARED_COSTLY."""
import argparse
import ast
import collections
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp())
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
import cpu  # noqa: E402
import kiln  # noqa: E402
import kiln.assemble as asm  # noqa: E402
import kiln_loopir.graph_lowering as gl  # noqa: E402
import torch  # noqa: E402

CLOCK = time.thread_time if os.environ.get("CLOCK", "thread") == "thread" else time.perf_counter
#: wrapper lines that are bookkeeping, not work
SKIPPED = ("len", "tuple", "list", "print", "reinterpret_tensor", "assert_size_stride",
           "assert_alignment")


def instrument(fn, source: str, tag: str):
    """Replace ``fn``'s code by a copy timing each call statement; (steps, samples)."""
    if fn.__name__ == "first_call":  # kiln's first-launch check: the wrapper is in its closure
        cells = (c.cell_contents for c in fn.__closure__)
        fn = dict(zip(fn.__code__.co_freevars, cells, strict=True))["wrapper_call"]
    fn = getattr(fn, "__func__", fn)  # inductor's Runner.call
    tree = ast.parse(source)
    for f in ast.walk(tree):
        if not (isinstance(f, ast.FunctionDef) and f.name == fn.__name__):
            continue
        steps, body = [], []
        for st in f.body:
            is_call = isinstance(st, (ast.Expr, ast.Assign)) and isinstance(st.value, ast.Call)
            label = ast.unparse(st.value.func) if is_call else ""
            if not is_call or label in SKIPPED or "empty" in label:
                body.append(st)
                continue
            target = ast.unparse(st.targets[0]) if isinstance(st, ast.Assign) else ""
            i = len(steps)
            steps.append((label, target))
            body += ast.parse("__t0 = __clk()").body + [st]
            body += ast.parse(f"__rec[{i}].append(__clk() - __t0)").body
        f.body = body
        code = compile(ast.fix_missing_locations(ast.Module([f], [])), f"<{tag}>", "exec")
        fcode = next(c for c in code.co_consts if getattr(c, "co_name", None) == fn.__name__)
        rec = [[] for _ in steps]
        fn.__globals__["__clk"] = CLOCK
        fn.__globals__["__rec"] = rec
        fn.__code__ = fcode
        return steps, rec
    raise RuntimeError(f"no {fn.__name__} in {tag}'s wrapper")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("calls", type=int, nargs="?", default=10)
    p.add_argument("--only", default="", help="kiln or inductor")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args()
    torch.set_num_threads(int(os.environ.get("THREADS", "1")))
    if "RSC" in os.environ:  # A/B of loopir's REALIZE_SHARED_COSTLY
        gl.REALIZE_SHARED_COSTLY = os.environ["RSC"] == "1"
    w = {m.name: m for m in cpu.MODELS}[a.model]
    torch.manual_seed(0)
    model, inputs = w.build(False)
    model.eval()
    captured = []
    asm.profiled = lambda flat, gm=None, **k: captured.append(flat) or flat
    results, totals, fns = {}, {}, {}
    with torch.no_grad():
        # inductor first: its compile takes weights' .data, which kiln's weight guard sees
        if a.only in ("", "inductor"):
            from torch._inductor.codecache import PyCodeCache

            ind = torch.compile(model)
            ind(*inputs)
            mods = [m for m in PyCodeCache.modules if hasattr(m, "call")]
            fns["inductor"] = (lambda: ind(*inputs),
                               [(m.call, Path(m.__file__).read_text()) for m in mods])
        if a.only in ("", "kiln"):
            k = kiln.compile(model)
            k(*inputs)
            k(*inputs)
            fns["kiln"] = (lambda: k(*inputs), [(c.call, c.source) for c in captured])
        for name, (f, calls) in fns.items():
            for _ in range(3):
                f()
            tt = []
            for _ in range(a.calls):
                t0 = CLOCK()
                f()
                tt.append(CLOCK() - t0)
            totals[name] = statistics.median(tt) * 1e3
            instr = [instrument(fn, src, name) for fn, src in calls]
            for _ in range(a.calls):
                f()
            results[name] = [(statistics.median(r) * 1e3 if r else 0.0, label, target)
                             for steps, rec in instr
                             for (label, target), r in zip(steps, rec, strict=True)]
    for name, rows in results.items():
        print(f"== {name}: {totals[name]:.2f} ms/call (uninstrumented median, "
              f"{os.environ.get('CLOCK', 'thread')} clock, {torch.get_num_threads()} threads); "
              f"steps sum {sum(r[0] for r in rows):.2f}")
        by_kind = collections.defaultdict(lambda: [0.0, 0])
        for t, label, _ in rows:
            kind = "generated kernels" if label.startswith(("cpp_", "kernel")) else label
            by_kind[kind][0] += t
            by_kind[kind][1] += 1
        for kind, (t, n) in sorted(by_kind.items(), key=lambda x: -x[1][0])[:12]:
            print(f"   {t:9.2f} ms  {n:4d}x  {kind}")
        print("   top steps:")
        for t, label, target in sorted(rows, key=lambda r: -r[0])[:a.top]:
            print(f"   {t:8.3f}  {label} {target}")


if __name__ == "__main__":
    main()
