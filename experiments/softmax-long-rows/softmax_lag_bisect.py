"""Why kiln's generated lagged softmax kernel is slower than the hand-written one (issue 11).

    # the lent H200, from the repo root (see softmax_long_sweep.py for the set-up)
    python3 -u experiments/softmax-long-rows/softmax_lag_bisect.py --out "$OUT"
    # no GPU: every edit applies and every variant is right under the interpreter
    TRITON_INTERPRET=1 python experiments/softmax-long-rows/softmax_lag_bisect.py --interpret-smoke

kiln's kernel (``KILN_TRITON_COOPERATIVE=lagged``) is generated for each shape, then launched
three ways in one process: through kiln's own wrapper and launcher, verbatim through this
script's bare launch (same grid and arguments as the launcher's), and with one source edit
at a time (each a difference between it and ``softmax_long_sweep.softmax_lag``), then all
edits together. Session 8 found with it the three causes in docs/codegen-triton.md
("Lagged units"); the edits that became kiln's code (no second -inf reduction) or measured
worse (the re-read in a loop) were taken out, so the rest apply to today's kernel. Each variant is checked against ``torch.softmax`` before it is timed; its
registers and spills are recorded and its PTX and TTGIR saved, so the two can be diffed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import softmax_long_sweep as sweep  # noqa: E402

#: (name, [(old text, new text), ...]): each old text must occur in kiln's kernel
EDITS = {
    "tl_max": [("tl.reduce(tl.where(rxmask, tl.broadcast_to(tmp0, [XBLOCK, RBLOCK]), float(\"-inf\")), 1, _kiln_max)",
                "tl.max(tl.where(rxmask, tmp0, float(\"-inf\")), 1)")],
    "volatile_parts": [("cache_modifier='.cg'", "volatile=True")],
    "static_rmask": [("rmask = rindex < rend", "rmask = rindex < RNUMEL")],
    "no_xmask": [("rxmask = rmask & xmask", "rxmask = rmask")],
    "mul_inverse": [(re.compile(r"(tmp\d+) = (tmp\d+) / (tmp\d+)"), r"\1 = \2 * (1.0 / \3)")],
    "no_specialize": [("@triton.jit\ndef kiln_coop",
                       "@triton.jit(do_not_specialize=['rchunk', 'nsplit', 'nunits', 'coop_lag'])\ndef kiln_coop")],
    "int64_base": [("xoffset = (unit // nsplit) * XBLOCK", "xoffset = ((unit // nsplit) * XBLOCK).to(tl.int64)")],
    "stats_other_ninf": [("rxmask, other=0, eviction_policy='evict_last'",
                          "rxmask, other=float('-inf'), eviction_policy='evict_last'")],
    # every poll of the spin counted on a counter after the row counters (``spins`` in the result)
    "count_spins": [("            seen = tl.atomic_add(coop_tickets + xoffset, 0, sem='acquire')\n",
                     "            seen = tl.atomic_add(coop_tickets + xoffset, 0, sem='acquire')\n"
                     "            tl.atomic_add(coop_tickets + 2 * (nunits // nsplit), 1, sem='relaxed')\n")],
    # the hand-written kernel's bounded spin (and its early first poll)
    "bounded_spin": [("        while seen < target:\n",
                      "        spins = 0\n        while (seen < target) & (spins < 131072):\n            spins += 1\n")],
}
#: launch changes (not source edits): the partials block as the hand-written kernel's (256)
LAUNCH = {"splitb_k": {"SPLITB": 0}, "splitb_256": {"SPLITB": 256}, "splitb_1024": {"SPLITB": 1024},
          "lag_resident": {"RESIDENT_SLACK": 0}, "lag_resident_32": {"RESIDENT_SLACK": 32},
          "lag_resident_96": {"RESIDENT_SLACK": 96}}
#: the edits that are not differences in the kernel's speed (kept out of "everything")
NOT_IN_ALL = ("volatile_parts", "count_spins", "splitb_k", "splitb_256", "splitb_1024", "lag_resident_32", "lag_resident_96")


def variant_list(base: list[str] = ()) -> list[list[str]]:
    """``base``; ``base`` plus each other edit alone; ``base`` plus every edit (but NOT_IN_ALL)."""
    base = list(base)
    others = [n for n in [*EDITS, *LAUNCH] if n not in base]
    return [base] + [base + [n] for n in others] + [base + [n for n in others if n not in NOT_IN_ALL]]


def kiln_source(x, lag_config) -> tuple[str, dict]:
    """kiln's lagged kernel for softmax over ``x``'s rows, and its one launch config."""
    import kiln_loopir
    import torch
    from kiln_codegen_triton import TritonCodegen, cooperative
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    def softmax(t):
        return torch.softmax(t, -1)

    saved = cooperative.LAGGED_CONFIGS
    cooperative.LAGGED_CONFIGS = (lag_config,)
    os.environ[cooperative.ENV] = "lagged"
    try:
        gm = make_fx(softmax, decomposition_table=core_aten_decompositions())(x)
        module = kiln_loopir.generate_wrapper(kiln_loopir.schedule(kiln_loopir.lower(gm, [x])),
                                              TritonCodegen(interpret=x.device.type == "cpu"))
        (kernel,) = module.kernels
        assert "lagged" in kernel.meta["tiling"], kernel.meta["tiling"]
        (config,) = kernel.meta["spec"].configs
        return kernel.source, config
    finally:
        cooperative.LAGGED_CONFIGS = saved
        del os.environ[cooperative.ENV]


def edited(source: str, names: list[str], rnumel: int) -> str:
    for name in names:
        if name in LAUNCH:
            continue
        for old, new in EDITS[name]:
            if isinstance(old, re.Pattern):
                source, n = old.subn(new, source)
                if not n:
                    raise ValueError(f"edit {name}: {old.pattern!r} not in kiln's kernel")
                continue
            if old not in source:
                raise ValueError(f"edit {name}: {old!r} not in kiln's kernel")
            source = source.replace(old, new.replace("RNUMEL", str(rnumel)))
    return source


def load(source: str, tag: str):
    """The kernel function of ``source`` (written to a file: triton.jit reads its source)."""
    path = os.path.join(tempfile.mkdtemp(prefix="kiln_bisect_"), f"k_{tag}.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(f"k_{tag}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.kiln_kernel


def bare_launch(fn, x, y, config: dict, names=()):
    """What kiln's launcher passes (launcher._coop_args), without the launcher."""
    import torch
    from kiln_codegen_triton.cooperative import lag_units, partials_block, split_row

    rows, cols = x.shape
    rchunk, k = split_row(cols, config["RBLOCK"], config["CHUNK_BYTES"], lagged=True)
    ws = torch.empty(rows * k * 3, dtype=torch.float32, device=x.device)
    tickets = torch.zeros(rows * 2 + 1, dtype=torch.int64, device=x.device)  # (+ count_spins')
    units = rows * k
    lag = lag_units(config["LAG_BYTES"], rchunk, k, units)
    splitb = partials_block(k, config["num_warps"])
    opts = {} if x.device.type == "cpu" else {"num_warps": config["num_warps"]}
    state = {"lag": lag}
    resident_slack = None
    for name in names:
        if name in LAUNCH:
            splitb = LAUNCH[name].get("SPLITB", splitb) or 1 << max(0, (k - 1).bit_length())
            resident_slack = LAUNCH[name].get("RESIDENT_SLACK", resident_slack)

    def launch():
        return fn[(2 * units,)](y, x, ws, tickets, rchunk, k, units, state["lag"], XBLOCK=1,
                                RBLOCK=config["RBLOCK"], SPLITB=splitb, **opts)

    if resident_slack is not None and x.device.type == "cuda":
        # the lag from the compiled kernel's residency: a row's last stats unit then starts
        # more than one residency window (R programs) before the row's first normalize unit
        ck = launch()
        props = torch.cuda.get_device_properties(x.device)
        resident = sweep.occupancy(ck, config["num_warps"], props) * props.multi_processor_count
        state["lag"] = min(units, max(lag, k + -(-resident // 2) + resident_slack))
    launch.tickets = tickets
    launch.state = state
    return launch


def resources(ck, out: str | None, tag: str) -> dict:
    info = {"regs": getattr(ck, "n_regs", None), "spills": getattr(ck, "n_spills", None)}
    if out and hasattr(ck, "asm"):
        for kind in ("ttgir", "ptx"):
            if kind in ck.asm:
                with open(os.path.join(out, f"{tag}.{kind}"), "w") as f:
                    f.write(ck.asm[kind])
    return info


def run_case(torch, case, config_tuple, out: str | None, edits: list[list[str]]) -> dict:
    from triton.testing import do_bench

    source, config = kiln_source(case.x, config_tuple)
    shape = f"{case.rows}x{case.cols}"
    res: dict = {"config": config}
    if out:
        with open(os.path.join(out, f"kiln_{shape}.py"), "w") as f:
            f.write(source)
    # kiln's own wrapper and launcher (KILN_TRITON_COOPERATIVE=lagged, this config alone)
    kb, warps, mb = config_tuple
    res["kiln_wrapper"] = sweep.run_kiln(torch, case, "lagged", ((kb, warps, mb),))
    sweep.say(f"{shape} kiln_wrapper {res['kiln_wrapper']}")
    for names in edits:
        tag = "+".join(names) or "verbatim"
        try:
            fn = load(edited(source, names, case.cols), f"{shape}_{tag}".replace("+", "_"))
            y = torch.full_like(case.x, float("nan"))
            launch = bare_launch(fn, case.x, y, config, names)
            ck = launch()
            torch.cuda.synchronize()
            spins = int(launch.tickets[-1].item())
            case.check(y)
            ms = do_bench(launch, warmup=5, rep=60, return_mode="median")
            case.check(y)
            r = {**case.row(ms), **resources(ck, out, f"{shape}_{tag}".replace("+", "_")[:60])}
            if "count_spins" in names:
                r["spins_first_launch"] = spins
            r["lag_units"] = launch.state["lag"]
        except Exception as e:  # noqa: BLE001 - reported, the bisection goes on
            r = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        res[tag] = r
        sweep.say(f"{shape} {tag:40s} {r}")
    # the hand-written kernel of the same design and config
    v = {"kind": "lag", "kb": kb, "warps": warps, "poll": "atomic", "backoff": 0, "rblock": kb * 256, "lag_mb": mb}
    res["hand"] = sweep.run_variant(torch, case, v, torch.cuda.get_device_properties(0), {})
    sweep.say(f"{shape} hand {res['hand']}")
    return res


def interpret_smoke() -> int:
    """Every edit applies to kiln's kernel, and each variant computes the softmax (interpreter,
    CPU tensors: programs run in order, so the lagged kernel needs no spin)."""
    import kiln_codegen_triton.kernel as triton_kernel
    import torch
    from kiln_codegen_triton import cooperative

    cooperative.MIN_RNUMEL = 64  # rows of 1000 count as long (as in the codegen's tests)
    triton_kernel.PERSISTENT_MAX = 16
    x = torch.randn(6, 1000) * 4
    source, config = kiln_source(x, (1, 4, 0))
    failed = 0
    for names in variant_list():
        tag = "+".join(names) or "verbatim"
        try:
            fn = load(edited(source, names, x.shape[1]), tag.replace("+", "_"))
            y = torch.full_like(x, float("nan"))
            launch = bare_launch(fn, x, y, config, names)
            for _ in range(2):
                launch()
                torch.testing.assert_close(y, torch.softmax(x, -1))
            print(f"ok   {tag}")
        except Exception as e:  # noqa: BLE001 - counted
            failed += 1
            print(f"FAIL {tag}: {type(e).__name__}: {e}")
    return failed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default="1024x262144,256x1048576,4096x65536")
    ap.add_argument("--config", default="32,8,10", help="chunk KB, warps, lag MB")
    ap.add_argument("--base", default="", help="edits every variant starts from (comma-separated)")
    ap.add_argument("--interpret-smoke", action="store_true")
    args = ap.parse_args()
    if args.interpret_smoke:
        return 1 if interpret_smoke() else 0
    import torch

    config = tuple(int(v) for v in args.config.split(","))
    edits = variant_list(args.base.split(",") if args.base else [])
    result: dict = {}
    for s in args.shapes.split(","):
        rows, cols = (int(d) for d in s.split("x"))
        result[s] = run_case(torch, sweep.Case(torch, rows, cols), config, args.out, edits)
        if args.out:
            with open(os.path.join(args.out, "softmax_lag_bisect.json"), "w") as f:
                json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
