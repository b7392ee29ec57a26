"""Issue 12's CPU training levers, each switched on in turn, in one process (an A/B/C/D run).

    python experiments/train-levers/train_levers.py block            # or bert-small, mlp, resnet18
    python experiments/train-levers/train_levers.py block --rounds 30 --threads 2

Builds eager, inductor and one kiln model per row of ``VARIANTS`` (each compiled with the
levers of its row on and the others off; every variant's first step is checked against
eager's loss and grads as in ``train.py``), then times them in interleaved rounds (each round
runs every variant for 3 steps), so load from other work falls on all of them alike. Prints
the median CPU time and wall time per step and each one's ratio to eager. CPU time
(``time.process_time``) is the steadier figure on a shared machine with ``--threads 1``.

The levers (docs/training.md, docs/loopir.md):

- ``view-chains``: a view of a view of a loop stays a view of the loop's buffer
  (``kiln_loopir.lowerings.views.ViewOfLoop.then``; off: the old nested ``GenericView``);
- ``flash-bw-kept``: the CPU flash-attention backward kept whole
  (``kiln_aotgrad.decompositions.DECOMPOSE_CPU_FLASH_BACKWARD = False``);
- ``embed-bw-kept``: ``embedding_dense_backward`` kept whole on CPU (off: torch's
  decomposition, an accumulating ``index_put``);
- ``cat-rows``: a cat along the innermost dim read by an extern writes slices
  (``kiln_loopir.lowerings.indexing.MIN_SLICE_ROW``; off: never).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("KILN_GRAPH_CACHE", "0")  # each variant compiles its own graphs
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # train.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests-integration"))
import torch  # noqa: E402

LEVERS = ("view-chains", "flash-bw-kept", "embed-bw-kept", "cat-rows")
VARIANTS = {  # name -> the levers on
    "kiln-before": (),
    "+view-chains": LEVERS[:1],
    "+flash-bw-kept": LEVERS[:2],
    "+embed-bw-kept": LEVERS[:3],
    "kiln-after": LEVERS,
}


class Levers:
    """Switches the levers by patching the modules that hold them (restored by ``all_on``)."""

    def __init__(self):
        from kiln_aotgrad import decompositions
        from kiln_loopir.lowerings import indexing, views

        self.decompositions, self.indexing, self.views = decompositions, indexing, views
        self.then = views.ViewOfLoop.then
        self.embedding_op = torch.ops.aten.embedding_dense_backward.default
        self.embedding_rule = decompositions.KILN_RULES[self.embedding_op]
        self.min_slice_row = indexing.MIN_SLICE_ROW

    def set(self, on) -> None:
        from kiln_loopir.ir import GenericView
        from torch._decomp import decomposition_table

        self.views.ViewOfLoop.then = (
            self.then if "view-chains" in on
            else (lambda view, size, reindex, stride_fn: GenericView(view, size, reindex))
        )
        self.decompositions.DECOMPOSE_CPU_FLASH_BACKWARD = "flash-bw-kept" not in on
        self.decompositions.KILN_RULES[self.embedding_op] = (
            self.embedding_rule if "embed-bw-kept" in on else decomposition_table[self.embedding_op]
        )
        self.decompositions._table.cache_clear()
        self.indexing.MIN_SLICE_ROW = self.min_slice_row if "cat-rows" in on else sys.maxsize

    def all_on(self) -> None:
        self.set(LEVERS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload", help="a CPU workload of train.py: mlp, block, resnet18, bert-small")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    import _torchvision_shim

    _torchvision_shim.install()
    import kiln
    import train

    (w,) = [x for x in train.workloads("cpu") if x.name == args.workload]
    torch.manual_seed(0)
    base, batch = w.make_model(), w.make_batch()
    ref = copy.deepcopy(base)
    ref_loss = w.loss(ref(*batch))
    ref_loss.backward()
    levers = Levers()
    steps = {}
    try:
        for name in ("eager", "inductor", *VARIANTS):
            model = copy.deepcopy(base)
            if name in VARIANTS:
                levers.set(VARIANTS[name])
                fn = kiln.compile(model)
            else:
                fn = train._compiled(model, name)
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            loss = w.loss(fn(*batch))  # compiles with this variant's levers
            loss.backward()
            train._check(model, ref, loss, ref_loss, w.dtype)
            opt.step()
            steps[name] = train._step_fn(model, fn, opt, batch, w.loss, "cpu")
            steps[name]()
    finally:
        levers.all_on()
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    wall: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(3):
                step()
            cpu[name].append((time.process_time() - c0) / 3)
            wall[name].append((time.perf_counter() - t0) / 3)
    c = {k: statistics.median(v) for k, v in cpu.items()}
    t = {k: statistics.median(v) for k, v in wall.items()}
    print(f"{w.name}: {args.rounds} rounds x 3 steps, {args.threads} thread(s), "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"  {'variant':<16} {'cpu ms/step':>11} {'vs eager':>8} {'wall ms/step':>12} {'vs eager':>8}")
    for k in steps:
        print(f"  {k:<16} {c[k] * 1e3:11.2f} {c['eager'] / c[k]:7.3f}x {t[k] * 1e3:12.2f} "
              f"{t['eager'] / t[k]:7.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
