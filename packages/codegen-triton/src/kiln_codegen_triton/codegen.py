"""``TritonCodegen``: kiln_loopir's Codegen protocol for CUDA (and CPU tensors under
``TRITON_INTERPRET=1``): one ``@triton.jit`` kernel per fused group, aten calls for externs."""

from __future__ import annotations

from collections.abc import Callable

import sympy
from kiln_loopir.codegen_protocol import KernelDef, KernelLaunch
from kiln_loopir.ir import ExternNode, FusedGroup, Schedule
from kiln_loopir.kernel_plan import plan_kernel
from kiln_loopir.wrapper import extern_call_source

from . import cooperative as coop
from . import flex_decoding  # noqa: F401  (registers the triton FlexAttention template)
from .kernel import Tiling, TritonKernel, _next_pow2, interpreting
from .launcher import KernelSpec, load_kernels, raw_stream_function

#: a persistent reduction over at least this many rows gets one config chosen from the size
#: hints (rows are plentiful: every candidate fills the GPU; benchmarking only costs compiles)
MANY_ROWS = 1024
#: an unsplit outer reduction with this many outputs takes 64 per program (128 programs)
OUTER_WIDE_OUTPUTS = 128 * 64
#: programs a persistent reduction keeps at least (when it has the rows): about two waves
#: of an H100/H200's 132 SMs
MIN_PROGRAMS = 256
#: elements of a 2-D pointwise tile: 8 per thread at 4 warps. Triton unrolls a program's
#: code per element a thread holds, and compile time grows with it: resnet50's fused
#: BatchNorm + ReLU + max-pool kernel compiled in 1.39 s at 64 x 64 on the H200's host (its
#: cold compile waited on it) and 0.58 s at 64 x 16, with the model's step time unchanged
POINTWISE_TILE = 1024


def _warps(tile: int) -> int:
    return 4 if tile <= 1024 else 8 if tile <= 2048 else 16


def candidate_configs(tiling: Tiling, hint_x: int, hint_y: int, interpret: bool) -> list[dict]:
    """The block-size configs a kernel's launcher chooses from (first = the default, and the
    interpreter's choice), from the example inputs' size hints. Each candidate is one more
    compile at load (cold compile time) and a benchmark at the first call, so there is more
    than one only where more than one is plausible: pointwise kernels (memory-bound: the block
    size barely matters) and persistent reductions over many rows get one config picked from
    the hints; reductions over few rows, looped and split reductions are benchmarked."""
    if tiling.kind == "pointwise1d":
        if interpret:
            return [{"XBLOCK": min(_next_pow2(hint_x), 1024)}]
        # memory-bound: the block size barely matters, and every config is one more compile
        # (cold compile time), so one config, smaller for small tensors
        return [{"XBLOCK": min(1024, max(128, _next_pow2(hint_x))), "num_warps": 4}]
    if tiling.kind == "pointwise2d":
        if interpret:
            return [{"XBLOCK": min(_next_pow2(hint_x), 64), "YBLOCK": min(_next_pow2(hint_y), 64)}]
        # a tile of up to POINTWISE_TILE elements (64 along the contiguous x axis when it is
        # that long), fewer rows while that leaves under MIN_PROGRAMS programs (GPT-2's bias +
        # GELU over [128, 3072]: 96 programs of 64 x 64 left a third of an H200's SMs idle)
        x = min(64, _next_pow2(hint_x))
        y = min(_next_pow2(hint_y), POINTWISE_TILE // x)
        while x * y > 512 and -(-hint_x // x) * -(-hint_y // y) < MIN_PROGRAMS:
            y //= 2
        return [{"XBLOCK": x, "YBLOCK": y, "num_warps": 4 if x * y >= 1024 else 2 if x * y >= 256 else 1}]
    r = tiling.persistent_rblock
    if tiling.cooperative:  # one row per program (never under the interpreter): cooperative.py
        return coop.launch_configs(tiling)
    if tiling.outer and not interpret:
        # coalesced along the outputs: 64 per program when split (row chunks give the programs)
        # or when there are many outputs, else 16 (32 bytes of fp16, a sector): 64 would leave
        # most SMs idle (a LayerNorm's 768 weight gradients: 12 programs)
        x = 64 if tiling.split or hint_x >= OUTER_WIDE_OUTPUTS else 16
        return [{"XBLOCK": x, "RBLOCK": 2048 // x, "num_warps": 4}]
    if tiling.split:
        if interpret:
            return [{"XBLOCK": max(1, min(_next_pow2(hint_x), 16)), "RBLOCK": 64}]
        return [{"XBLOCK": 1, "RBLOCK": r, "num_warps": w} for r, w in [(2048, 8), (1024, 4), (4096, 8)]]
    if r is not None:
        if interpret:
            return [{"XBLOCK": max(1, min(_next_pow2(hint_x), 4096 // r)), "RBLOCK": r}]
        if hint_x >= MANY_ROWS and r < 2048:  # (one row per program: warps are benchmarked)
            # the most rows per program that keep the tile within 2048 elements and the
            # program count at MIN_PROGRAMS or more
            x = 1
            while x * 2 * r <= 2048 and -(-hint_x // (x * 2)) >= MIN_PROGRAMS:
                x *= 2
            return [{"XBLOCK": x, "RBLOCK": r, "num_warps": _warps(x * r)}]
        # the largest few row counts per program that keep the tile within 4096 elements (one
        # row per program was measured slower for a LayerNorm over 128 rows of 768 on an H200:
        # 3.0 us against 2.7)
        xs = [x for x in (1, 2, 4, 8, 16, 32, 64, 128) if x * r <= 4096 and x <= _next_pow2(hint_x)] or [1]
        configs = [{"XBLOCK": x, "RBLOCK": r, "num_warps": _warps(x * r)} for x in reversed(xs[-2:])]
        if len(configs) == 1 and r >= 2048:  # one row per program: try fewer warps too
            configs.append({"XBLOCK": 1, "RBLOCK": r, "num_warps": 8})
        return configs
    if interpret:
        return [{"XBLOCK": max(1, min(_next_pow2(hint_x), 64)), "RBLOCK": 64}]
    if hint_x >= 1024 and tiling.rnumel_hint <= 8192:
        cands = [(8, 256, 4), (1, 2048, 8)]
    else:
        cands = [(1, 2048, 8), (1, 4096, 16)]
    return [{"XBLOCK": x, "RBLOCK": r, "num_warps": w} for x, r, w in cands]


class TritonCodegen:
    """One ``@triton.jit`` kernel per FusedGroup (see kernel.py); launchers autotune and cache
    their block sizes (see launcher.py)."""

    name = "triton"

    def __init__(self, interpret: bool | None = None):
        self.interpret = interpreting() if interpret is None else interpret
        self._count = 0

    def define_kernel(self, group: FusedGroup, sched: Schedule) -> KernelDef:
        plan = plan_kernel(group, sched)
        kernel = TritonKernel(plan, interpret=self.interpret)
        source = kernel.generate()
        name = f"triton_kernel_{self._count}"
        self._count += 1
        args = plan.signature.names() + list(kernel.derived)
        numels = {}
        for key, expr in kernel.tiling.numels.items():
            expr = sympy.sympify(expr)
            arg = "rnumel0" if key == "rnumel" else key  # a split reduction's (first) node
            numels[key] = int(expr) if expr.is_Integer else arg
        hint_x = plan.hint(kernel.tiling.numels["xnumel"])
        hint_y = plan.hint(kernel.tiling.numels.get("ynumel", 1))
        spec = KernelSpec(
            source=source,
            tiling=kernel.tiling.kind,
            configs=candidate_configs(kernel.tiling, hint_x, hint_y, self.interpret),
            numels=numels,
            arg_names=args,
            written=[i for i, a in enumerate(plan.signature.args) if a.written],
            arg_dtypes=[a.dtype if a.kind == "buffer" else "int" for a in plan.signature.args]
            + ["int"] * len(kernel.derived),
            arg_hints={**{a.name: plan.hint(sympy.Symbol(a.name)) for a in plan.signature.sizes},
                       **{name: plan.hint(e) for name, e in kernel.derived.items()}},
            split_dtypes=kernel.split_dtypes if kernel.tiling.split else (),
            cooperative_parts=kernel.coop_nparts if kernel.tiling.cooperative else 0,
        )
        # ``run(stream, *args)``: the stream is read once per wrapper call (wrapper_prelude)
        launch = KernelLaunch(kernel=f"{name}.run", args=["stream", *args], derived=dict(kernel.derived),
                              grid=str(kernel.tiling))
        return KernelDef(name=name, source=source, arg_names=args, group=group,
                         meta={"spec": spec, "tiling": str(kernel.tiling)}, launch=launch, plan=plan)

    def kernel_call(self, kernel: KernelDef) -> str:
        return kernel.launch.python()

    def extern_call(self, node: ExternNode) -> str:
        return extern_call_source(node)

    def wrapper_prelude(self, device) -> str:
        """Once per wrapper call, not per launch: the device guard of a CUDA wrapper (Triton
        launches on the current device, so make it the graph's, only when it differs) and the
        current stream every launch of this call goes to (``stream``; None off CUDA, where the
        interpreter runs the kernels)."""
        if getattr(device, "type", None) != "cuda":
            return "stream = None"
        if device.index is None:
            return "stream = get_raw_stream(torch.cuda.current_device())"
        return (f"if torch.cuda.current_device() != {device.index}:\n"
                f"    torch.cuda.set_device({device.index})\n"
                f"stream = get_raw_stream({device.index})")

    def finalize(self, kernels: list[KernelDef]) -> dict[str, Callable]:
        """Import every kernel (in parallel) and return name -> launcher, plus the stream
        query the prelude calls."""
        return {**load_kernels({k.name: k.meta["spec"] for k in kernels}), "get_raw_stream": raw_stream_function()}

    def standalone_source(self, kernels: list[KernelDef]) -> str:
        """Python that rebuilds the launchers by name (for output_code.py)."""
        lines = ["import torch", "from kiln_codegen_triton.launcher import KernelSpec, load_kernels, raw_stream_function", "",
                 "get_raw_stream = raw_stream_function()",
                 "_triton_kernels = {"]
        for k in kernels:
            s = k.meta["spec"]
            lines.append(f"    {k.name!r}: KernelSpec(source=r'''")
            lines.append(s.source.rstrip("\n"))
            lines.append(f"''', tiling={s.tiling!r}, configs={s.configs!r}, numels={s.numels!r}, "
                         f"arg_names={s.arg_names!r}, written={s.written!r}, "
                         f"split_dtypes={s.split_dtypes!r}, cooperative_parts={s.cooperative_parts!r}),")
            # (no arg_dtypes: a standalone file compiles each kernel at its first launch)
        lines.append("}")
        lines.append("globals().update(load_kernels(_triton_kernels))")
        return "\n".join(lines) + "\n"
