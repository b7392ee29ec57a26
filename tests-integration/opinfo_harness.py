"""OpInfo sweep: every op in torch's ``op_db`` (float32, CPU) through kiln's backends, compared
with eager, side by side with torch.compile's inductor.

    python tests-integration/opinfo_harness.py                       # loopir_interpret
    python tests-integration/opinfo_harness.py --backends loopir_interpret,kiln,inductor
    python tests-integration/opinfo_harness.py --ops sin,softmax --backends kiln -v
    python tests-integration/opinfo_harness.py --grad --backends kiln  # inputs require grad:
                                                     # outputs and input grads vs eager
    python3 -m nox -s opinfo                                         # the full three-way sweep

How one op is checked (docs/coverage.md says the same in prose):

- Samples: the first ``--samples`` (3) of ``op.sample_inputs("cpu", torch.float32)``.
- Each sample becomes ``fn(*tensors)`` calling ``op.op(sample.input, *sample.args,
  **sample.kwargs)``, generated as plain source (``def opinfo_add(t0, t1): return target(t0,
  t1, alpha=c0)``); every tensor found in input/args/kwargs (inside lists, tuples and dicts
  too) is a function input, so it is a graph input, never a baked constant.
- Graph route (no frontend involved): ``make_fx(fn)(*tensors)`` gives the FX graph (``--graph
  fx`` instead builds a one-node torch-level FX graph calling ``op.op``) and the backend is
  called as ``backend(gm, example_inputs)``: ``kiln.backend.loopir_interpret_backend`` or
  ``kiln.backend.kiln_backend``. Where make_fx cannot trace a sample (``.item()``,
  ``torch.equal``, ``cov``, sparse inputs) the case goes through ``kiln.compile(fn,
  backend=<that backend>)`` instead, as a user compiles it (the frontend graph-breaks before
  the op); its result says ``via frontend``. ``frontend:<backend>`` runs ``kiln.compile(fn,
  backend=<backend>)`` instead (needs the frontend), and ``inductor`` is
  ``torch.compile(fn, backend="inductor")``, the reference.
- Comparison: ``torch.testing.assert_close(actual, expected, equal_nan=True)`` with its float32
  defaults (rtol=1.3e-6, atol=1e-5; the tolerances torch's own inductor OpInfo tests use by
  default) unless ``TOLERANCE_OVERRIDES`` names the op, and mutated inputs are compared too.
  Ops whose eager output is not a function of the inputs (random ops, ``empty*``): shapes and
  dtypes only (``NONDETERMINISTIC``, plus any op whose two eager calls on the same inputs
  differ); their pass says ``shape-only``.
- Op status per backend: ``pass`` (every sample eager could run passed), ``fail`` (the first
  failing sample: stage, error class, first line, where in kiln it was raised), ``eager-error``
  (eager itself rejects every sample: not counted), ``skip`` (no float32 on CPU / no samples).
- "ran as IR" (kiln backends): the op passed and no sample used an aten *fallback*
  ``ExternKernel`` (``kiln_loopir.counters["aten_fallbacks"]`` did not move). Extern calls by
  design (matmul, convolution, attention: ``fallback=False`` in loopir) count as native. For
  ``kiln`` it also needs every graph to have run as generated C++: no eager fallback and no
  interpreter fallback (a kernel that did not compile) in ``kiln.stats()``.

Robustness: ops run in worker processes (``--jobs``); a sample past ``--timeout`` seconds fails
as ``timeout``, a worker that dies (segfault in a generated kernel) marks its op ``crash`` and
is restarted on the next op. Results: ``benchmarks/results/opinfo-<backends>.json`` and
``.md``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import itertools
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
#: device of the samples ("cuda" for the GPU sweep: benchmarks/gpu.py sets it)
DEVICE = os.environ.get("KILN_OPINFO_DEVICE", "cpu")
KILN_BACKENDS = ("loopir_interpret", "kiln", "kiln_triton")
ALL_BACKENDS = (
    "loopir_interpret", "kiln", "kiln_triton", "inductor", "frontend:loopir_interpret", "frontend:kiln", "eager",
    "frontend:eager", "dynamo:eager",
)
#: capture-breadth routes (issue 10): the frontend (kiln's or torch.compile's) with a backend
#: that counts the graphs it is handed and runs them eagerly; an op "ran as IR" there when
#: every sample passed and compiled at least one graph
CAPTURE_ROUTES = ("frontend:eager", "dynamo:eager")
_captured_graphs = [0]


def _counting_eager(gm, example_inputs):
    _captured_graphs[0] += 1
    return gm.forward

# Outputs that are not a function of the inputs: compare shapes and dtypes only. Any op whose
# two eager calls on the same inputs differ is added at run time.
NONDETERMINISTIC = {
    "bernoulli", "cauchy", "exponential", "geometric", "log_normal", "multinomial", "normal",
    "normal.number_mean", "normal.in_place", "uniform", "rand_like", "randint_like", "randn_like",
    "randint", "randn", "rand", "nn.functional.dropout", "nn.functional.dropout2d",
    "nn.functional.dropout3d", "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
    "nn.functional.feature_alpha_dropout.with_train",
    "nn.functional.feature_alpha_dropout.without_train", "nn.functional.rrelu",
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
    "randperm", "torch._refs.empty", "sparse.sampled_addmm",
}

# Per-op tolerances (float32), applied to every backend alike, inductor included. Each entry
# says why; the default is assert_close's float32 default (rtol=1.3e-6, atol=1e-5).
TOLERANCE_OVERRIDES: dict[str, dict[str, float]] = {
    # Reductions whose summation order differs from ATen's vectorized order.
    "var_mean": {"rtol": 1e-5, "atol": 1e-5},
    "var_mean.unbiased": {"rtol": 1e-5, "atol": 1e-5},
    "std_mean": {"rtol": 1e-5, "atol": 1e-5},
    "std_mean.unbiased": {"rtol": 1e-5, "atol": 1e-5},
    "var": {"rtol": 1e-5, "atol": 1e-5},
    "var.unbiased": {"rtol": 1e-5, "atol": 1e-5},
    "std": {"rtol": 1e-5, "atol": 1e-5},
    "std.unbiased": {"rtol": 1e-5, "atol": 1e-5},
    "cumprod": {"rtol": 1e-5, "atol": 1e-5},
    "nn.functional.layer_norm": {"rtol": 1e-5, "atol": 2e-5},
    "nn.functional.group_norm": {"rtol": 1e-5, "atol": 2e-5},
    "nn.functional.instance_norm": {"rtol": 1e-5, "atol": 2e-5},
    "nn.functional.batch_norm": {"rtol": 1e-5, "atol": 2e-5},
    "native_layer_norm": {"rtol": 1e-5, "atol": 2e-5},
    "native_batch_norm": {"rtol": 1e-5, "atol": 2e-5},
    "_native_batch_norm_legit": {"rtol": 1e-5, "atol": 2e-5},
    "nn.functional.rms_norm": {"rtol": 1e-5, "atol": 2e-5},
    "logsumexp": {"rtol": 1e-5, "atol": 1e-5},
    "nn.functional.cosine_similarity": {"rtol": 1e-5, "atol": 1e-5},
}


# aten ops that are library calls in every compiler (inductor falls back on them too): dense
# linear algebra (LAPACK), FFTs (pocketfft/MKL) and random number generators. A secondary
# "ran as IR" share counts a fallback to these as native, like matmul; the primary one does not.
LIBRARY_FALLBACK = re.compile(
    r"aten::(_?linalg_|_fft_|cholesky|geqrf|ormqr|triangular_solve|lu_unpack|_lu_with_info|"
    r"linalg\.|bernoulli|rand|normal|uniform|exponential|cauchy|geometric|log_normal|"
    r"multinomial|_linalg_check_errors)"
)


def op_key(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


_OP_DB = None


def _ensure_expecttest() -> None:
    """torch's ``common_utils`` (imported by ``op_db``) imports ``expecttest`` only for its
    ``TestCase`` base class and an ``ACCEPT`` flag. The ``opinfo`` nox session installs the real
    package; where it is missing (e.g. a session that did not install it) a stand-in with those
    two names lets ``op_db`` load. No expect-test feature is used by this harness."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        import types
        import unittest

        stub = types.ModuleType("expecttest")
        stub.TestCase = unittest.TestCase
        stub.ACCEPT = False
        sys.modules["expecttest"] = stub


def op_db() -> list:
    global _OP_DB
    if _OP_DB is None:
        _ensure_expecttest()
        from torch.testing._internal.common_methods_invocations import op_db as db

        _OP_DB = list(db)
    return _OP_DB


def find_op(key: str):
    for op in op_db():
        if op_key(op) == key:
            return op
    raise KeyError(f"no OpInfo named {key!r}")


def select_ops(patterns: Sequence[str] | None = None) -> list:
    """op_db entries whose key equals one of ``patterns`` (or matches it as a regex with
    ``re.fullmatch``); all of them when ``patterns`` is empty."""
    ops = op_db()
    if not patterns:
        return ops
    out = []
    for op in ops:
        k = op_key(op)
        if any(k == p or op.name == p or re.fullmatch(p, k) for p in patterns):
            out.append(op)
    return out


# ------------------------------------------------------------------------------- one sample


@dataclasses.dataclass
class Case:
    """One OpInfo sample as ``fn(*tensors)``; ``source`` is fn's generated source."""

    key: str
    index: int
    fn: Callable
    tensors: list
    op: Any
    sample: Any
    source: str


def _has_tensor(x) -> bool:
    if isinstance(x, torch.Tensor):
        return True
    if type(x) in (list, tuple):
        return any(_has_tensor(v) for v in x)
    if type(x) is dict:
        return any(_has_tensor(v) for v in x.values())
    return False


def _expr(x, tensors: list, consts: dict) -> str:
    """Python source for ``x`` with each tensor a parameter ``tK`` and every other leaf a
    global constant ``cK`` (lists, tuples and dicts holding tensors are rebuilt literally)."""
    if isinstance(x, torch.Tensor):
        tensors.append(x)
        return f"t{len(tensors) - 1}"
    if _has_tensor(x):
        if type(x) is list:
            return "[" + ", ".join(_expr(v, tensors, consts) for v in x) + "]"
        if type(x) is tuple:
            return "(" + "".join(_expr(v, tensors, consts) + ", " for v in x) + ")"
        if type(x) is dict:
            return "{" + ", ".join(f"{k!r}: {_expr(v, tensors, consts)}"
                                   for k, v in x.items()) + "}"
    name = f"c{len(consts)}"
    consts[name] = x
    return name


def make_case(op, sample, index: int) -> Case:
    """``fn(t0, t1, ...)`` calling the OpInfo's function on the sample, generated as plain
    source (``return target(t0, c0, dim=c1)``): no pytree or OpInfo wrapper in between, so a
    frontend (kiln's or dynamo) sees one call of the op."""
    tensors: list = []
    consts: dict = {}
    parts = [_expr(sample.input, tensors, consts)]
    parts += [_expr(a, tensors, consts) for a in sample.args]
    for k, v in sample.kwargs.items():
        if not k.isidentifier():
            raise ValueError(f"keyword {k!r} is not an identifier")
        parts.append(f"{k}={_expr(v, tensors, consts)}")
    name = "opinfo_" + re.sub(r"\W", "_", op_key(op))
    params = ", ".join(f"t{i}" for i in range(len(tensors)))
    source = f"def {name}({params}):\n    return target({', '.join(parts)})\n"
    namespace = {"target": op.op, **consts}
    exec(compile(source, f"<opinfo {op_key(op)} sample {index}>", "exec"), namespace)
    return Case(op_key(op), index, namespace[name], tensors, op, sample, source)


def clone_inputs(tensors: Sequence) -> list:
    """Fresh copies (``clone`` keeps the strides of dense tensors; expanded ones become
    contiguous)."""
    return [t.clone() for t in tensors]


def _rebuild(x, leaf: Callable):
    if isinstance(x, torch.Tensor):
        return leaf(x)
    if _has_tensor(x):
        if type(x) is list:
            return [_rebuild(v, leaf) for v in x]
        if type(x) is tuple:
            return tuple(_rebuild(v, leaf) for v in x)
        if type(x) is dict:
            return {k: _rebuild(v, leaf) for k, v in x.items()}
    return x


def build_graph(case: Case, how: str = "make_fx") -> torch.fx.GraphModule:
    """The FX graph handed to a backend: ``make_fx`` (real-mode trace of ``fn``) or ``fx`` (one
    torch-level ``call_function`` node calling the OpInfo's function, like a frontend's)."""
    example = clone_inputs(case.tensors)
    if how == "make_fx":
        from torch.fx.experimental.proxy_tensor import make_fx

        return make_fx(case.fn)(*example)
    if how == "fx":
        graph = torch.fx.Graph()
        counter = itertools.count()

        def leaf(_t):
            return graph.placeholder(f"t{next(counter)}")

        s = case.sample
        inp = _rebuild(s.input, leaf)
        args = tuple(_rebuild(a, leaf) for a in s.args)
        kwargs = {k: _rebuild(v, leaf) for k, v in s.kwargs.items()}
        target = case.op.op
        if getattr(target, "__name__", "") == "<lambda>":  # FX cannot name a lambda
            lam = target

            def target(*a, **k):
                return lam(*a, **k)

            target.__name__ = target.__qualname__ = "opinfo_" + re.sub(r"\W", "_", case.key)
        node = graph.call_function(target, (inp, *args), kwargs)
        graph.output(node)
        return torch.fx.GraphModule(torch.nn.Module(), graph)
    raise ValueError(f"unknown graph route {how!r}")


class SampleTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float | None):
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise SampleTimeout(f"sample took longer than {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _counters_snapshot() -> dict:
    snap: dict[str, Any] = {}
    try:
        import kiln_loopir

        snap["aten_fallbacks"] = collections.Counter(kiln_loopir.counters["aten_fallbacks"])
        snap["externs"] = kiln_loopir.counters.get("externs", 0)
        snap["fused_groups"] = kiln_loopir.counters.get("fused_groups", 0)
    except ImportError:
        pass
    try:
        from kiln.stats import counters as kc

        snap["kiln"] = collections.Counter(kc)
    except ImportError:
        pass
    return snap


def _counters_delta(before: dict, after: dict) -> dict:
    d: dict[str, Any] = {}
    if "aten_fallbacks" in after:
        fb = after["aten_fallbacks"] - before.get("aten_fallbacks", collections.Counter())
        d["aten_fallbacks"] = sorted(fb)
        d["fused_groups"] = after["fused_groups"] - before.get("fused_groups", 0)
    if "kiln" in after:
        k = after["kiln"] - before.get("kiln", collections.Counter())
        d["eager_fallbacks"] = k.get("eager_fallbacks", 0)
        d["interpreter_fallbacks"] = k.get("interpreter_fallbacks", 0)
        d["kernels"] = k.get("kernels_generated", 0)
        d["graphs"] = k.get("graphs_compiled", 0) + k.get("graphs_interpreted", 0)
        d["eager_reasons"] = sorted(r for r in k if r.startswith("eager_fallback:"))
    return d


def compile_case(case: Case, backend: str, graph: str = "make_fx") -> Callable:
    """A callable ``(*tensors) -> outputs`` for ``case`` compiled by ``backend``."""
    if backend == "eager":
        return case.fn
    if backend == "frontend:eager":
        import kiln_frontend

        kiln_frontend.reset()
        return kiln_frontend.compile(case.fn, backend=_counting_eager)
    if backend == "dynamo:eager":
        import torch._dynamo

        torch._dynamo.reset()
        return torch.compile(case.fn, backend=_counting_eager)
    if backend == "inductor":
        import torch._dynamo

        torch._dynamo.reset()  # fn's code object is shared by every case: start clean
        return torch.compile(case.fn, backend="inductor")
    if backend.startswith("frontend:"):
        import kiln
        import kiln_frontend

        kiln_frontend.reset()
        return kiln.compile(case.fn, backend=backend.split(":", 1)[1])
    return kiln_graph_route(case, backend, graph, clone_inputs(case.tensors))


def _kiln_backend_fn(backend: str) -> Callable:
    import kiln.backend as kb

    return {
        "loopir_interpret": kb.loopir_interpret_backend,
        "kiln": kb.kiln_backend,
        # the Triton codegen (on CPU tensors it needs TRITON_INTERPRET=1)
        "kiln_triton": lambda gm, xs: kb.kiln_backend(gm, xs, options={"codegen": "triton"}),
    }[backend]


#: why the last kiln-backend case went through the frontend ("" when make_fx traced it)
_frontend_route = [""]


def kiln_graph_route(case: Case, backend: str, graph: str, example: list) -> Callable:
    """``backend(gm, example)`` on the FX graph of ``case``.  When make_fx cannot build one (a
    data-dependent Python value: ``.item()``, ``torch.equal``/``allclose`` and the ops that
    call them, such as ``cov``; a sparse input), the case goes through kiln's frontend with
    the same backend instead, as a kiln user compiles it and as the ``inductor`` column goes
    through torch.compile's frontend: it graph-breaks before such an op and the backend gets
    what is left. The result says so (``route``); the frontend's own failures still fail."""
    be = _kiln_backend_fn(backend)
    try:
        gm = build_graph(case, graph)
    except Exception as e:  # noqa: BLE001
        _frontend_route[0] = f"make_fx: {_first_line(e)[:150]}"
        import kiln
        import kiln_frontend

        kiln_frontend.reset()
        return kiln.compile(case.fn, backend=be)
    return be(gm, example)


def _first_line(e: BaseException, lines: int = 1) -> str:
    """``Type: first line`` (``lines`` > 1: the first non-empty lines joined by `` / ``)."""
    text = [x.strip() for x in str(e).strip().splitlines() if x.strip()]
    return f"{type(e).__name__}: {' / '.join(text[:lines])}"[:400]


def _where(e: BaseException) -> str:
    """The innermost traceback frame inside kiln's packages (for routing a failure)."""
    if e.__cause__ is not None and e.__cause__ is not e:  # kiln wraps a step's error
        inner = _where(e.__cause__)
        if inner:
            return inner
    where = ""
    for fs in traceback.extract_tb(e.__traceback__):
        # editable installs (packages/*/src/kiln_x/...) and plain ones (site-packages/kiln_x/...)
        m = re.search(r"/(?:src|site-packages)/(kiln\w*)/(.*\.py)$",
                      fs.filename.replace(os.sep, "/"))
        if m:
            where = f"{m.group(1)}/{m.group(2)}:{fs.name}"
    return where


def error_class(stage: str, e: BaseException) -> str:
    """A short class for grouping failures: stage, exception type, first line with numbers,
    quoted names and shapes blanked."""
    line = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if stage == "compare":
        line = "outputs differ" if "not close" in line or "mismatch" in line.lower() else line
    line = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", line)
    line = re.sub(r"\[[^\]]*\]|\([^)]*\)", "(…)", line)
    line = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", line)
    return f"{stage}: {type(e).__name__}: {line}"[:160]


def _is_same(a, b) -> bool:
    try:
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        return True
    except Exception:
        return False


def _shapes(x):
    return pytree.tree_map(
        lambda t: (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__, x
    )


def _normalize(x):
    # lists/tuples/return_types compare as sequences; assert_close handles them already
    return x


def _traced_graph_is_random(case: Case, graph: str, timeout: float | None) -> bool:
    """True when the FX graph handed to the backends gives different results under two RNG
    seeds although eager did not (e.g. SDPA with ``dropout_p > 0``: for some inputs eager's
    fused CPU kernel does not draw, while the traced math path samples ``bernoulli``). The
    backends then run a random graph: compare shapes only."""
    try:
        with time_limit(timeout):
            gm = build_graph(case, graph)
            torch.manual_seed(0)
            a = gm(*clone_inputs(case.tensors))
            torch.manual_seed(1)
            b = gm(*clone_inputs(case.tensors))
    except (Exception, SampleTimeout):
        return False  # the backend run reports the failure
    return not _is_same(a, b)


def check_sample(case: Case, backends: Sequence[str], *, graph: str = "make_fx",
                 timeout: float | None = 120.0) -> dict[str, dict]:
    """Run one sample eagerly and through each backend: ``{backend: {"status": "pass" |
    "fail" | "eager-error", ...}}``."""
    results: dict[str, dict] = {}
    try:
        with time_limit(timeout):
            eager_in = clone_inputs(case.tensors)
            torch.manual_seed(0)
            expected = case.fn(*eager_in)
            eager_in2 = clone_inputs(case.tensors)
            torch.manual_seed(1)
            expected2 = case.fn(*eager_in2)
    except Exception as e:
        return {b: {"status": "eager-error", "error": _first_line(e)} for b in backends}
    shape_only = case.key in NONDETERMINISTIC or case.op.name in NONDETERMINISTIC
    if not shape_only and not _is_same(expected, expected2):
        shape_only = True
    if not shape_only and any(b in KILN_BACKENDS for b in backends):
        shape_only = _traced_graph_is_random(case, graph, timeout)
    tol = TOLERANCE_OVERRIDES.get(case.key) or TOLERANCE_OVERRIDES.get(case.op.name) or {}

    for backend in backends:
        r: dict[str, Any] = {"status": "fail", "shape_only": shape_only}
        stage = "compile"
        before = _counters_snapshot()
        graphs_before = _captured_graphs[0]
        _frontend_route[0] = ""
        t0 = time.perf_counter()
        try:
            with time_limit(timeout):
                compiled = compile_case(case, backend, graph)
                stage = "run"
                args = clone_inputs(case.tensors)
                torch.manual_seed(0)
                actual = compiled(*args)
                stage = "compare"
                if shape_only:
                    if _shapes(actual) != _shapes(expected):
                        raise AssertionError(
                            f"shape/dtype mismatch: {_shapes(actual)} vs {_shapes(expected)}")
                else:
                    torch.testing.assert_close(actual, expected, equal_nan=True, **tol)
                    torch.testing.assert_close(args, eager_in, equal_nan=True, **tol,
                                               msg="mutated inputs differ from eager")
            r["status"] = "pass"
        except (Exception, SampleTimeout) as e:
            if isinstance(e, SampleTimeout):
                stage = "timeout"
            r.update(stage=stage, error=_first_line(e, 4 if stage == "compare" else 1),
                     error_class=error_class(stage, e),
                     where=_where(e))
        r["time_s"] = round(time.perf_counter() - t0, 3)
        r.update(_counters_delta(before, _counters_snapshot()))
        if _frontend_route[0]:
            r["route"] = "frontend (" + _frontend_route[0] + ")"
        if backend in CAPTURE_ROUTES:
            r["graphs"] = _captured_graphs[0] - graphs_before
            r["ran_as_ir"] = r["status"] == "pass" and r["graphs"] > 0
        elif backend in KILN_BACKENDS or backend.startswith("frontend:"):
            r["ran_as_ir"] = (
                r["status"] == "pass"
                and not r.get("aten_fallbacks")
                and not r.get("eager_fallbacks")
                and not (backend in ("kiln", "kiln_triton", "frontend:kiln")
                         and r.get("interpreter_fallbacks"))
                and r.get("graphs", 0) > 0  # the frontend may capture nothing and run eagerly
            )
        results[backend] = r
    return results


# ------------------------------------------------------------- grad mode (--grad, issue 12)

#: ``--grad``: inputs require grad; outputs and input grads are compared (training path)
GRAD_MODE = False


def _float_leaves(tensors: Sequence) -> list[int]:
    return [i for i, t in enumerate(tensors) if t.is_floating_point()]


def _grads_of(fn: Callable, tensors: Sequence, diff: list[int]):
    """``fn`` on fresh copies whose float inputs require grad; (outputs, input grads) for
    fixed random cotangents (seeded, one per differentiable output)."""
    args = clone_inputs(tensors)
    for i in diff:
        args[i].requires_grad_(True)
    torch.manual_seed(0)
    out = fn(*args)
    outs = [o for o in pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    if not outs:
        return out, None
    gen = torch.Generator().manual_seed(1)
    cot = [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in outs]
    grads = torch.autograd.grad(outs, [args[i] for i in diff], cot, allow_unused=True)
    detached = pytree.tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, out)
    return detached, list(grads)


def check_sample_grad(case: Case, backends: Sequence[str], *, graph: str = "make_fx",
                      timeout: float | None = 120.0) -> dict[str, dict]:
    """Grad mode: like ``check_sample``, with every float input requiring grad; compares the
    outputs and the grads of the inputs (``torch.autograd.grad`` with seeded cotangents)."""
    diff = _float_leaves(case.tensors)
    try:
        with time_limit(timeout):
            expected, expected_grads = _grads_of(case.fn, case.tensors, diff)
            again, _ = _grads_of(case.fn, case.tensors, diff)
    except Exception as e:
        return {b: {"status": "eager-error", "error": _first_line(e)} for b in backends}
    if not diff or expected_grads is None:
        return {b: {"status": "eager-error", "error": "no differentiable output"} for b in backends}
    shape_only = (case.key in NONDETERMINISTIC or case.op.name in NONDETERMINISTIC
                  or not _is_same(expected, again))
    if not shape_only and any(b in KILN_BACKENDS for b in backends):
        shape_only = _traced_graph_is_random(case, graph, timeout)  # e.g. MHA with dropout
    tol = TOLERANCE_OVERRIDES.get(case.key) or TOLERANCE_OVERRIDES.get(case.op.name) or {}
    tol = tol or {"rtol": 1e-5, "atol": 1e-5}  # backward formulas reassociate sums
    results: dict[str, dict] = {}
    for backend in backends:
        r: dict[str, Any] = {"status": "fail", "shape_only": shape_only}
        stage = "compile"
        before = _counters_snapshot()
        _frontend_route[0] = ""
        t0 = time.perf_counter()
        try:
            with time_limit(timeout):
                example = clone_inputs(case.tensors)
                for i in diff:
                    example[i].requires_grad_(True)
                if backend in KILN_BACKENDS:
                    compiled = kiln_graph_route(case, backend, graph, example)
                else:
                    compiled = compile_case(case, backend, graph)
                stage = "run"
                actual, actual_grads = _grads_of(compiled, case.tensors, diff)
                stage = "compare"
                if shape_only:
                    if _shapes(actual) != _shapes(expected):
                        raise AssertionError("shape/dtype mismatch")
                else:
                    torch.testing.assert_close(actual, expected, equal_nan=True, **tol)
                    torch.testing.assert_close(actual_grads, expected_grads, equal_nan=True,
                                               **tol, msg="input grads differ from eager")
            r["status"] = "pass"
        except (Exception, SampleTimeout) as e:
            stage = "timeout" if isinstance(e, SampleTimeout) else stage
            r.update(stage=stage, error=_first_line(e, 4 if stage == "compare" else 1),
                     error_class=error_class(stage, e), where=_where(e))
        r["time_s"] = round(time.perf_counter() - t0, 3)
        r.update(_counters_delta(before, _counters_snapshot()))
        if _frontend_route[0]:
            r["route"] = "frontend (" + _frontend_route[0] + ")"
        if backend in KILN_BACKENDS:
            r["ran_as_ir"] = (r["status"] == "pass" and not r.get("aten_fallbacks")
                              and not r.get("eager_fallbacks") and r.get("graphs", 0) > 0)
        results[backend] = r
    return results


def samples_of(op, n: int) -> list:
    return list(itertools.islice(iter(op.sample_inputs(DEVICE, torch.float32)), n))


def check_op(op, backends: Sequence[str], *, samples: int = 3, graph: str = "make_fx",
             timeout: float | None = 120.0) -> dict:
    """All of one op's samples through ``backends``; the op's summary per backend."""
    key = op_key(op)
    out: dict[str, Any] = {"op": key, "backends": {}}
    if torch.float32 not in op.supported_dtypes(DEVICE):
        out["backends"] = {b: {"status": "skip", "error": f"no float32 on {DEVICE}"} for b in backends}
        return out
    t0 = time.perf_counter()
    try:
        with time_limit(timeout):
            sample_list = samples_of(op, samples)
    except (Exception, SampleTimeout) as e:
        out["backends"] = {b: {"status": "skip", "error": "sample_inputs: " + _first_line(e)}
                           for b in backends}
        return out
    if not sample_list:
        out["backends"] = {b: {"status": "skip", "error": "no samples"} for b in backends}
        return out
    per_sample = []
    for i, s in enumerate(sample_list):
        case = make_case(op, s, i)
        check = check_sample_grad if GRAD_MODE else check_sample
        per_sample.append(check(case, backends, graph=graph, timeout=timeout))
    for b in backends:
        rs = [ps[b] for ps in per_sample]
        ran = [r for r in rs if r["status"] != "eager-error"]
        if not ran:
            summary = {"status": "eager-error", "error": rs[0].get("error", "")}
        else:
            failed = [r for r in ran if r["status"] == "fail"]
            summary = dict(failed[0]) if failed else {"status": "pass"}
            summary["samples"] = len(ran)
            summary["samples_passed"] = len(ran) - len(failed)
            summary["shape_only"] = any(r.get("shape_only") for r in ran)
            summary["time_s"] = round(sum(r.get("time_s", 0) for r in ran), 3)
            fbs = sorted({f for r in ran for f in r.get("aten_fallbacks", ())})
            if fbs:
                summary["aten_fallbacks"] = fbs
            routes = sorted({r["route"] for r in ran if r.get("route")})
            if routes:
                summary["route"] = routes[0]
            for k in ("eager_fallbacks", "interpreter_fallbacks", "kernels", "graphs"):
                if any(k in r for r in ran):
                    summary[k] = sum(r.get(k, 0) for r in ran)
            if "ran_as_ir" in ran[0]:
                summary["ran_as_ir"] = not failed and all(r.get("ran_as_ir") for r in ran)
        out["backends"][b] = summary
    out["time_s"] = round(time.perf_counter() - t0, 3)
    return out


# ---------------------------------------------------------------------------------- workers


def _worker(args) -> int:
    """Check the ops named in --worker-ops, one JSON line per op on the protocol fd."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    log = open(args.worker_log, "a", buffering=1)  # noqa: SIM115
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    torch.set_num_threads(args.threads)
    global GRAD_MODE
    GRAD_MODE = args.grad
    keys = json.loads(Path(args.worker_ops).read_text())
    backends = args.backends.split(",")
    ops = {op_key(op): op for op in op_db()}
    for key in keys:
        proto.write("START " + json.dumps(key) + "\n")
        print(f"=== {key}", flush=True)
        try:
            res = check_op(ops[key], backends, samples=args.samples, graph=args.graph,
                           timeout=args.timeout)
        except BaseException as e:  # never lose the worker to one op
            res = {"op": key, "backends": {b: {"status": "fail", "stage": "harness",
                                                "error": _first_line(e),
                                                "error_class": error_class("harness", e)}
                                            for b in backends}}
        proto.write("RESULT " + json.dumps(res, default=str) + "\n")
    proto.write("DONE\n")
    return 0


def _reader(proc, wid, q):
    for line in proc.stdout:
        q.put((wid, line.rstrip("\n")))
    q.put((wid, None))


def run_sweep(keys: Sequence[str], backends: Sequence[str], *, jobs: int = 1,
              samples: int = 3, graph: str = "make_fx", timeout: float = 120.0,
              threads: int = 1, log_dir: Path, progress: bool = True) -> list[dict]:
    """Check ``keys`` in ``jobs`` worker processes, restarting a worker that dies."""
    log_dir.mkdir(parents=True, exist_ok=True)
    pending = list(keys)
    slices = [pending[i::jobs] for i in range(jobs)]
    results: dict[str, dict] = {}
    counts: dict[str, collections.Counter] = {b: collections.Counter() for b in backends}
    q: queue.Queue = queue.Queue()
    procs: dict[int, tuple] = {}
    t_start = time.perf_counter()
    n_total = len(keys)

    def spawn(wid: int, todo: list[str]):
        ops_file = log_dir / f"worker{wid}-ops.json"
        ops_file.write_text(json.dumps(todo))
        cmd = [sys.executable, __file__, "--worker", "--worker-ops", str(ops_file),
               "--worker-log", str(log_dir / f"worker{wid}.log"), "--backends",
               ",".join(backends), "--samples", str(samples), "--graph", graph,
               "--timeout", str(timeout), "--threads", str(threads)]
        cmd += ["--grad"] if GRAD_MODE else []
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
        threading.Thread(target=_reader, args=(p, wid, q), daemon=True).start()
        procs[wid] = (p, list(todo), None, time.monotonic())

    def record(res: dict):
        results[res["op"]] = res
        for b, r in res["backends"].items():
            counts[b][r["status"]] += 1
            if r.get("ran_as_ir"):
                counts[b]["ran_as_ir"] += 1
        if progress:
            done = len(results)
            el = time.perf_counter() - t_start
            parts = []
            for b in backends:
                c = counts[b]
                ran = c["pass"] + c["fail"]
                parts.append(f"{b} {c['pass']}/{ran}")
            status = " ".join(f"{b[:4]}={res['backends'][b]['status']}" for b in backends)
            print(f"[{done}/{n_total} {el:6.0f}s] {res['op']:<45} {status} | "
                  + " | ".join(parts), flush=True)

    for wid, todo in enumerate(slices):
        if todo:
            spawn(wid, todo)
    # a worker is killed when it reports nothing for this long (a hang signals cannot stop)
    watchdog = timeout * 3 * (samples + 1) + 120
    while procs:
        try:
            wid, line = q.get(timeout=5)
        except queue.Empty:
            for p, _todo, cur, since in list(procs.values()):
                if cur is not None and time.monotonic() - since > watchdog:
                    p.kill()
            continue
        if wid not in procs:
            continue
        p, todo, cur, since = procs[wid]
        if line is None:  # the worker's stdout closed: it finished or died
            p.wait()
            if cur is not None:
                reason = ("killed by the watchdog (hang)" if p.returncode in (-9, 137)
                          else f"worker died with exit code {p.returncode}")
                record({"op": cur, "backends": {b: {"status": "fail", "stage": "crash",
                                                    "error": reason,
                                                    "error_class": "crash: " + reason.split(
                                                        " with")[0]}
                                                for b in backends}})
                rest = todo[todo.index(cur) + 1:]
                del procs[wid]
                if rest:
                    spawn(wid, rest)
            else:
                del procs[wid]
            continue
        if line.startswith("START "):
            procs[wid] = (p, todo, json.loads(line[6:]), time.monotonic())
        elif line.startswith("RESULT "):
            record(json.loads(line[7:]))
            procs[wid] = (p, todo, None, time.monotonic())
        elif line == "DONE":
            procs[wid] = (p, todo, None, time.monotonic())
    return [results[k] for k in keys if k in results]


# ---------------------------------------------------------------------------------- summary


def summarize(results: Sequence[dict], backends: Sequence[str]) -> dict:
    summary: dict[str, Any] = {}
    for b in backends:
        c = collections.Counter(r["backends"][b]["status"] for r in results)
        tested = c["pass"] + c["fail"]
        passing = [r for r in results if r["backends"][b]["status"] == "pass"]
        s: dict[str, Any] = {
            "ops": len(results), "tested": tested, "pass": c["pass"], "fail": c["fail"],
            "eager_error": c["eager-error"], "skip": c["skip"],
            "pass_rate": c["pass"] / tested if tested else 0.0,
            "shape_only": sum(1 for r in passing if r["backends"][b].get("shape_only")),
            "time_s": round(sum(r["backends"][b].get("time_s", 0) for r in results), 1),
        }
        if b in KILN_BACKENDS or b.startswith("frontend:") or b in CAPTURE_ROUTES:
            ir = sum(1 for r in passing if r["backends"][b].get("ran_as_ir"))
            s["ran_as_ir"] = ir
            s["ran_as_ir_share"] = ir / len(passing) if passing else 0.0
            fb = collections.Counter(
                f for r in passing for f in r["backends"][b].get("aten_fallbacks", ()))
            s["fallback_ops"] = dict(fb.most_common())
            lib = sum(
                1 for r in passing
                if not r["backends"][b].get("ran_as_ir") and r["backends"][b].get("aten_fallbacks")
                and r["backends"][b].get("graphs", 1)
                and all(LIBRARY_FALLBACK.match(f) for f in r["backends"][b]["aten_fallbacks"]))
            s["ran_as_ir_or_library"] = ir + lib
            s["ran_as_ir_or_library_share"] = (ir + lib) / len(passing) if passing else 0.0
            if b in KILN_BACKENDS:
                s["via_frontend"] = sum(1 for r in passing if r["backends"][b].get("route"))
        classes = collections.Counter(
            r["backends"][b].get("error_class", "?") for r in results
            if r["backends"][b]["status"] == "fail")
        s["failure_classes"] = classes.most_common()
        wheres = collections.Counter(
            r["backends"][b].get("where") or "(outside kiln)" for r in results
            if r["backends"][b]["status"] == "fail")
        s["failure_where"] = wheres.most_common()
        summary[b] = s
    return summary


def summary_table(summary: dict, backends: Sequence[str]) -> str:
    head = ["", *backends]
    rows = [
        ["ops tested (eager ran ≥1 sample)", *[str(summary[b]["tested"]) for b in backends]],
        ["pass", *[str(summary[b]["pass"]) for b in backends]],
        ["fail", *[str(summary[b]["fail"]) for b in backends]],
        ["pass rate", *[f"{summary[b]['pass_rate']:.1%}" for b in backends]],
        ["passing ops that ran as IR / generated code",
         *[(f"{summary[b]['ran_as_ir']} ({summary[b]['ran_as_ir_share']:.1%})"
            if "ran_as_ir" in summary[b] else "n/a") for b in backends]],
        ["… counting linalg/FFT/RNG library fallbacks as native",
         *[(f"{summary[b]['ran_as_ir_or_library']} "
            f"({summary[b]['ran_as_ir_or_library_share']:.1%})"
            if "ran_as_ir_or_library" in summary[b] else "n/a") for b in backends]],
        ["passes through the frontend (make_fx cannot trace them)",
         *[str(summary[b]["via_frontend"]) if "via_frontend" in summary[b] else "n/a"
           for b in backends]],
        ["passes compared by shape only (random ops)",
         *[str(summary[b]["shape_only"]) for b in backends]],
        ["eager rejects every sample", *[str(summary[b]["eager_error"]) for b in backends]],
        ["skipped (no float32 / no samples)", *[str(summary[b]["skip"]) for b in backends]],
        ["time in backend (s)", *[str(summary[b]["time_s"]) for b in backends]],
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def markdown_report(results: Sequence[dict], backends: Sequence[str], summary: dict,
                    meta: dict) -> str:
    out = [f"# OpInfo sweep: {', '.join(backends)}", "",
           f"Command: `{meta['command']}`  ", f"Date: {meta['date']}; torch {meta['torch']}; "
           f"wall time {meta['wall_s']:.0f} s; {meta['samples']} samples per op; graph route "
           f"`{meta['graph']}`.", "", summary_table(summary, backends), ""]
    for b in backends:
        s = summary[b]
        out += [f"## {b}: failure classes", "", "| count | class |", "|---:|---|"]
        out += [f"| {n} | `{c}` |" for c, n in s["failure_classes"][:40]]
        out += ["", f"### {b}: where failures were raised", "", "| count | where |", "|---:|---|"]
        out += [f"| {n} | `{w}` |" for w, n in s["failure_where"][:25]]
        if s.get("fallback_ops"):
            out += ["", f"### {b}: aten fallbacks among passing ops", "",
                    ", ".join(f"`{k}` ({v})" for k, v in s["fallback_ops"].items())]
        out.append("")
    out += ["## Per op", "", "| op | " + " | ".join(backends) + " |",
            "|---|" + "---|" * len(backends)]
    for r in results:
        cells = []
        for b in backends:
            x = r["backends"][b]
            if x["status"] == "pass":
                cell = "pass"
                if x.get("shape_only"):
                    cell += " (shape-only)"
                if x.get("route"):
                    cell += " (via frontend)"
                if x.get("ran_as_ir") is False:
                    fb = x.get("aten_fallbacks") or []
                    if fb:
                        cell += " (fallback: " + ", ".join(fb) + ")"
                    elif x.get("eager_fallbacks"):
                        cell += " (the backend ran its graph eagerly)"
                    elif not x.get("graphs"):
                        cell += " (no graph: ran eagerly)"
                    else:
                        cell += " (not IR)"
            elif x["status"] == "fail":
                err = x.get("error", "").replace("|", "\\|").replace("\n", " ")[:120]
                cell = f"FAIL {x.get('stage', '')}: {err}"
            else:
                cell = x["status"]
            cells.append(cell)
        out.append(f"| {r['op']} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="loopir_interpret",
                   help=f"comma-separated, from {', '.join(ALL_BACKENDS)}")
    p.add_argument("--ops", default="", help="comma-separated op keys or regexes (default all)")
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--graph", choices=("make_fx", "fx"), default="make_fx")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per sample and backend")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--limit", type=int, default=0, help="only the first N ops (0: all)")
    p.add_argument("--out", default="", help="results basename (default opinfo-<backends>)")
    p.add_argument("--cache-dir", default="", help="KILN_CACHE_DIR (default: a fresh temp dir)")
    p.add_argument("-v", "--verbose", action="store_true", help="print each failure")
    p.add_argument("--grad", action="store_true",
                   help="inputs require grad: compare outputs and input grads (training path)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-ops", help=argparse.SUPPRESS)
    p.add_argument("--worker-log", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker(args)
    global GRAD_MODE
    GRAD_MODE = args.grad

    backends = [b for b in args.backends.split(",") if b]
    for b in backends:
        if b not in ALL_BACKENDS:
            p.error(f"unknown backend {b!r}; known: {', '.join(ALL_BACKENDS)}")
    cache = args.cache_dir or tempfile.mkdtemp(prefix="kiln-opinfo-cache-")
    os.environ["KILN_CACHE_DIR"] = cache
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(cache, "inductor"))
    keys = [op_key(op) for op in select_ops([x for x in args.ops.split(",") if x])]
    if args.limit:
        keys = keys[: args.limit]
    name = args.out or "opinfo-" + "-".join(b.replace(":", "_") for b in backends)
    name += "-grad" if args.grad and not args.out else ""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    print(f"OpInfo sweep: {len(keys)} ops x {args.samples} samples, backends {backends}, "
          f"{args.jobs} worker(s), KILN_CACHE_DIR={cache}", flush=True)
    t0 = time.perf_counter()
    results = run_sweep(keys, backends, jobs=args.jobs, samples=args.samples, graph=args.graph,
                        timeout=args.timeout, threads=args.threads,
                        log_dir=RESULTS_DIR / f"{name}-logs")
    wall = time.perf_counter() - t0
    summary = summarize(results, backends)
    meta = {"command": " ".join(["python", "tests-integration/opinfo_harness.py",
                                 *(argv if argv is not None else sys.argv[1:])]),
            "date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
            "wall_s": wall, "samples": args.samples, "graph": args.graph}
    (RESULTS_DIR / f"{name}.json").write_text(
        json.dumps({"meta": meta, "summary": summary, "results": results}, indent=1,
                   default=str))
    (RESULTS_DIR / f"{name}.md").write_text(markdown_report(results, backends, summary, meta))
    print()
    print(summary_table(summary, backends))
    for b in backends:
        print(f"\n{b}: top failure classes")
        for c, n in summary[b]["failure_classes"][:12]:
            print(f"  {n:4d}  {c}")
        if args.verbose:
            for r in results:
                x = r["backends"][b]
                if x["status"] == "fail":
                    print(f"    {r['op']}: [{x.get('stage')}] {x.get('error')} @ {x.get('where')}")
    print(f"\nwall time {wall:.0f} s; results in {RESULTS_DIR / name}.json / .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
