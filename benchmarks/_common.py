"""Helpers shared by the benchmarks: timing, fresh compiler caches, progress, tables, output
flattening. Benchmarks only: nothing here is product code (so torch.compile is allowed)."""

from __future__ import annotations

import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"


def last_hidden_state(model):
    """``model`` (a transformers base model) behind a module whose forward takes ``input_ids``
    and returns only the last hidden state: one tensor to time and to compare."""
    import torch

    class LastHidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids=input_ids).last_hidden_state

    return LastHidden(model)


@contextmanager
def environ(**values: str) -> Iterator[None]:
    """Set environment variables for the block, then restore each (unset if it was unset)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def fresh_cache_dirs(prefix: str = "kiln-bench-") -> str:
    """Point KILN_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR (Triton's compiled
    kernels, else kept in ~/.triton between runs) at a new empty folder, so first calls
    measure real (cold) compiles. Call before the compilers run; returns the folder."""
    root = tempfile.mkdtemp(prefix=prefix)
    os.environ["KILN_CACHE_DIR"] = os.path.join(root, "kiln")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, "inductor")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(root, "triton")
    return root


def median_time(fn: Callable[[], Any], *, min_repeat_s: float = 0.05, repeats: int = 7,
                warmup: int = 3, max_calls: int = 10_000,
                sync: Callable[[], Any] = lambda: None) -> float:
    """Median seconds per call of ``fn()``: ``warmup`` calls, then ``repeats`` timed repeats of
    ``n`` calls each, ``n`` chosen so that one repeat lasts about ``min_repeat_s``. ``sync``
    (``torch.cuda.synchronize`` on a GPU) runs before each clock read, so queued work counts."""
    n = _calls_per_repeat(fn, min_repeat_s, warmup, max_calls, sync)
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


class RecordingBackend:
    """Counts graphs and runs them as they are (both compilers' ``eager`` backend)."""

    def __init__(self) -> None:
        self.graphs: list = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def callgrind_inclusive(out_file: str | Path) -> Callable[[str], int]:
    """``inclusive(pattern)``: the largest inclusive instruction count of a function whose
    ``callgrind_annotate`` line matches ``pattern`` in a callgrind output file (0: none)."""
    import re
    import subprocess

    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100",
                           str(out_file)], stdout=subprocess.PIPE, text=True, check=True).stdout

    def inclusive(pattern: str) -> int:
        counts = [int(line.split()[0].replace(",", "")) for line in text.splitlines()
                  if re.search(pattern, line) and line.strip()[:1].isdigit()]
        return max(counts, default=0)

    return inclusive


def _calls_per_repeat(fn, min_repeat_s: float, warmup: int, max_calls: int, sync) -> int:
    """After ``warmup`` calls, how many calls of ``fn`` last about ``min_repeat_s``."""
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-7)
    return max(1, min(max_calls, int(min_repeat_s / one)))


def interleaved_times(fns: dict[str, Callable[[], Any]], *, min_repeat_s: float = 0.05,
                      repeats: int = 7, warmup: int = 3, max_calls: int = 10_000,
                      sync: Callable[[], Any] = lambda: None) -> dict[str, float]:
    """``median_time`` of several callables measured in alternating rounds (round ``i`` times
    each once, starting at a different one each round), so that a machine whose speed drifts
    (a shared host, clocks changing) moves every compiler's number alike: what a comparison
    in one run needs, where timing one compiler after the other compares two machine states."""
    calls = {label: _calls_per_repeat(fn, min_repeat_s, warmup, max_calls, sync)
             for label, fn in fns.items()}
    samples: dict[str, list[float]] = {label: [] for label in fns}
    labels = list(fns)
    for r in range(repeats):
        for label in labels[r % len(labels):] + labels[: r % len(labels)]:
            fn, n = fns[label], calls[label]
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            samples[label].append((time.perf_counter() - t0) / n)
    return {label: statistics.median(s) for label, s in samples.items()}


def geomean(xs: Iterable[float]) -> float | None:
    xs = [x for x in xs if x is not None and x > 0 and math.isfinite(x)]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def first_line(e: BaseException, limit: int = 90) -> str:
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {line}"[:limit]


def tensors_of(out: Any) -> list:
    """The tensors in a model's output, in a fixed order: tensors, tuples/lists, dicts and
    ``ModelOutput``-like objects (transformers), dataclasses."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):  # includes transformers' ModelOutput (an OrderedDict)
        return [t for k in out for t in tensors_of(out[k])]
    if isinstance(out, (list, tuple)):
        return [t for x in out for t in tensors_of(x)]
    if hasattr(out, "__dataclass_fields__"):
        return [t for k in out.__dataclass_fields__ for t in tensors_of(getattr(out, k))]
    return []


class Progress:
    """tqdm when installed and stderr is a terminal, else a one-line-per-step printer."""

    def __init__(self, total: int, desc: str = ""):
        self.total = total
        self.n = 0
        self.desc = desc
        self.bar = None
        if sys.stderr.isatty():  # a log file gets one line per step instead of \r updates
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                pass

    def step(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(what[:60])
        else:
            print(f"[{self.n + 1}/{self.total}] {self.desc} {what}", file=sys.stderr, flush=True)

    def done(self) -> None:
        self.n += 1
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(header)]
    def line(cells):
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])
