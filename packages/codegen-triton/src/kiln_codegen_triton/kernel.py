"""One ``@triton.jit`` kernel per fused group, from loopir's kernel plan.

How a ``KernelPlan`` becomes Triton (``TritonKernel(plan).generate()``):

* Tiling. A pointwise plan with one loop (loopir collapsed every outer dim it could) is a 1-D
  tile: ``XBLOCK`` consecutive points per program, masked by ``xindex < xnumel``. A pointwise
  plan whose loops could not collapse (a transpose, a broadcast across non-contiguous dims)
  is a 2-D tile ``[YBLOCK, XBLOCK]``: x over the last loop, y over the others flattened, so
  loads and stores along either dim stay coalesced. A plan with inner loops (reductions, and
  pointwise nodes fused over the same rows) puts ``XBLOCK`` outer points on the tile's first
  axis and each node's inner (reduction) points on the second.
* Reductions are *persistent* when every node with inner loops has the same static inner
  ranges and the row fits one block (``PERSISTENT_MAX``): the row stays in registers and later
  nodes (softmax's output) reuse what earlier ones loaded and computed. Otherwise each node
  loops over its row in ``RBLOCK`` chunks with ``[XBLOCK, RBLOCK]`` accumulators, reduced
  along the row after the loop. Consecutive looped nodes over the same rows that do not read
  each other share one loop (``_row_runs``); a ``sum(exp(a - w(max)))`` joins its max's loop
  with online rescaling (``online_rescale``); long rows may be split over cooperating
  programs (``cooperative``, off by default).
* Welford (``welford_mean``/``welford_m2``): per-lane (mean, m2, count), merged with Chan's
  formula (``_kiln_welford``); nodes reducing the same value share the state.
* Values in loop bodies are typed Triton tensors; values that depend only on the outer point
  are computed once per node, before its row loop. Buffers the plan keeps in registers never
  touch memory; other buffers written and read inside the kernel pass through memory with a
  barrier between the nodes.
* SymPy indices print as Triton integer arithmetic (``printer.texpr``); size symbols and
  numels that are not constants are kernel arguments.
* fp16/bf16 loads are converted to fp32 by the IR itself (``ops.to_dtype``); stores convert
  back. max/min/argmax/argmin propagate NaN as torch does (first index wins ties).
* Math beyond ``tl.*`` calls ``kmath.<fn>``: libdevice on a GPU, ``interp_math`` under
  ``TRITON_INTERPRET=1`` (the interpreter cannot run extern calls).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import sympy
import torch
from kiln_loopir.kernel_plan import KernelPlan, is_outer_reduction
from kiln_loopir.ops_spec import WELFORD_TYPES, reduction_identity
from kiln_loopir.sizevars import FloorDiv, ModularIndexing, symbol_kind
from kiln_loopir.virtualized import MissingOpError, set_ops_handler

from . import cooperative as coop
from .online_rescale import OnlineSum, match_online_sum, replay, trace_body
from .ops import TritonOps, TVal, literal, tl_dtype
from .printer import texpr

#: longest row a reduction keeps in registers (one block); longer rows loop over RBLOCK chunks
PERSISTENT_MAX = 4096
#: split reductions: at most this many outputs (example sizes) and at least this long a row
SPLIT_MAX_OUTPUTS = 64
SPLIT_MIN_RNUMEL = 65536
SPLIT_TYPES = ("sum", "prod", "max", "min", "any", "all")
#: looped reductions: consecutive nodes over the same rows share one loop (one read of the row)
ROW_LOOP_FUSION = True
#: looped softmax: sum(exp(x - max)) joins the max's loop, rescaled online (``online_rescale``)
ONLINE_SOFTMAX = True
#: outer reductions over longer rows than this get their own tiling (``Tiling.outer``); a
#: shorter row fits a persistent block with many outputs per program, coalesced already
OUTER_MIN_RNUMEL = 256
#: the module-level names the launcher loads; each aliases the kernel's descriptive name
KERNEL_NAME = "kiln_kernel"
FINAL_NAME = "kiln_kernel_final"
#: at most this many op names in a kernel's descriptive name (``kiln_red_exp_sub_max_sum``)
NAME_OPS = 6

def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def _nan_propagating(fn: str) -> str:
    """``_kiln_max``/``_kiln_min``: ``tl.maximum``/``tl.minimum`` that propagate NaN, as
    torch.amax/amin and torch.maximum/minimum do."""
    return f'''
@triton.jit
def _kiln_{fn}(a, b):
    if a.dtype.is_floating():
        return tl.{fn}imum(a, b, propagate_nan=tl.PropagateNan.ALL)
    else:
        return tl.{fn}imum(a, b)

'''


def _arg_better(fn: str, compare: str) -> str:
    """``_kiln_argmax``/``_kiln_argmin``: the combine of (value, index) pairs; a NaN beats
    every number and the first index wins ties, as torch's."""
    return f'''
@triton.jit
def _kiln_{fn}(av, ai, bv, bi):
    a_nan = av != av
    b_nan = bv != bv
    take_a = (av {compare} bv) | (a_nan & ~b_nan) | ((av == bv) & (ai < bi)) | (a_nan & b_nan & (ai < bi))
    return tl.where(take_a, av, bv), tl.where(take_a, ai, bi)
'''


#: the @triton.jit helpers every kernel source starts with
HELPERS = _nan_propagating("max") + _nan_propagating("min") + '''
@triton.jit
def _kiln_prod(a, b):
    return a * b


@triton.jit
def _kiln_welford(ma, m2a, na, mb, m2b, nb):
    n = na + nb
    delta = mb - ma
    wb = tl.where(n == 0, 0.0, nb / tl.maximum(n, 1.0))
    return ma + delta * wb, m2a + m2b + delta * delta * na * wb, n


@triton.jit
def _kiln_randint64(seed, offset, low, high):
    r0, r1, _, _ = tl.randint4x(seed, offset)
    r = r0.to(tl.uint64) | (r1.to(tl.uint64) << 32)
    return low + (r % (high - low).to(tl.uint64)).to(tl.int64)

''' + _arg_better("argmax", ">") + "\n" + _arg_better("argmin", "<")


@dataclass
class Tiling:
    """How the kernel covers its iteration space (what the launcher needs for the grid)."""

    kind: str  # "pointwise1d" | "pointwise2d" | "reduction"
    numels: dict[str, sympy.Expr] = field(default_factory=dict)  # xnumel/ynumel/rnumel
    persistent_rblock: int | None = None  # RBLOCK of a persistent reduction (fixed)
    rnumel_hint: int = 1
    split: bool = False  # a split reduction: partial results per row chunk, then a final kernel
    #: an outer reduction: its loads are contiguous along the outputs, not along the row
    #: (``x.sum(0)`` of a row-major matrix: bias and LayerNorm weight gradients). A program
    #: takes a block of neighbouring outputs and walks the rows, so each load is coalesced;
    #: one output per program would read a column, a sector per element.
    outer: bool = False
    #: cooperative rows: K programs per row exchange partials in a workspace (``cooperative``)
    cooperative: bool = False
    #: ... each program's chunk is one RBLOCK block kept in registers (read once, no loops)
    coop_registers: bool = False
    #: ... as stats and normalize units of one launch, the normalize units lagging behind
    #: (``cooperative.py``, "Lagged units"): no program waits on one that starts after it
    coop_lagged: bool = False

    def __str__(self) -> str:
        nums = ", ".join(f"{k}={v}" for k, v in self.numels.items())
        p = f" persistent RBLOCK={self.persistent_rblock}" if self.persistent_rblock else ""
        return (f"{self.kind} ({nums}){p}{' split' if self.split else ''}"
                f"{' cooperative' if self.cooperative else ''}{' registers' if self.coop_registers else ''}"
                f"{' lagged' if self.coop_lagged else ''}")


def _same_ranges(a, b) -> bool:
    """Two nodes' inner (row) ranges are the same loop."""
    return len(a) == len(b) and all(sympy.simplify(x - y) == 0 for x, y in zip(a, b, strict=True))


def _reductions_apart(p: KernelPlan) -> bool:
    """The group's reductions are splittable, over the same rows, and read nothing the group
    writes; its other nodes are per-output work (no rows: casts of the results, an epilogue).
    Then each reduction's partial results (one per chunk of rows) combine on their own, and
    the epilogue runs after them in the final kernel. (A LayerNorm's weight and bias
    gradients: two sums over 4096 rows of 768 outputs, cast to float16; unsplit, 12 programs
    of 64 outputs walked all 4096 rows.)"""
    reductions = [n for n in p.nodes if n.inner]
    if not all(n.reduction_type in SPLIT_TYPES and _same_ranges(n.inner, reductions[0].inner)
               for n in reductions):
        return False
    if any(n.kind != "pointwise" for n in p.nodes if not n.inner):
        return False
    written = {d.name for n in p.nodes for d in n.writes}
    return not any(d.name in written for n in reductions for d in n.reads)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


class TritonKernel(TritonOps):
    """Generates the Triton source of one kernel plan (see the module docstring)."""

    def __init__(self, plan: KernelPlan, interpret: bool | None = None):
        self.plan = plan
        #: buffer -> parameter name by position: a model's repeated layers print one source
        self.ptr = plan.signature.param_names()
        self.interpret = interpreting() if interpret is None else interpret
        self.lines: list[str] = []  # kernel body (after the signature)
        self.derived: dict[str, sympy.Expr] = {}  # numel args the wrapper computes
        self._tmp = 0
        self._ind = 0
        self.ind_cls: dict[str, str] = {}
        self.registers: dict[str, TVal] = {}
        self.rows: dict[str, tuple[sympy.Expr, TVal]] = {}
        self.written_memory: set[str] = set()
        self.cache: dict[str, TVal] = {}  # x-scope CSE (expression text -> value)
        self.rcache: dict[str, TVal] = {}  # row-scope CSE
        self.names: dict[str, str] = {}  # sympy symbol name -> Triton variable
        self.welford: dict[str, tuple[str, str]] = {}  # value variable -> (state prefix, count)
        #: a split kernel's reductions, in store order: (type, partial dtype, identity, buffer, index)
        self.split_stores: list[tuple] = []
        self.op_names: dict[str, None] = {}  # ops in the order emitted: the kernel's name
        self.tiling = self._plan_tiling()
        self.online: dict[int, OnlineSum] = {}  # sum node -> its online rewrite over a max node
        self.online_max: dict[int, tuple[str, torch.dtype, str]] = {}  # max node -> (acc, dtype, result)
        self.online_parts: dict[int, tuple[str, str]] = {}  # sum node -> (lane sum, any -inf) variables
        self.coop_terms: dict[int, tuple[TVal, TVal, TVal]] = {}  # cooperative registers: (a, w(m), exp(a - w(m)))
        #: an eviction hint for loads and stores of row elements (lagged units: a stats unit's
        #: chunk stays in L2 for its normalize unit, which reads it and writes its result once)
        self.row_eviction = ""
        self.runs = self._row_runs()
        self.tiling.cooperative = self._cooperative_plan()

    # ------------------------------------------------------------------------------ planning
    def _plan_tiling(self) -> Tiling:
        p = self.plan
        if p.kind == "pointwise":
            if len(p.loop_ranges) >= 2:
                y = sympy.Mul(*p.loop_ranges[:-1])
                return Tiling("pointwise2d", {"xnumel": p.loop_ranges[-1], "ynumel": y})
            return Tiling("pointwise1d", {"xnumel": p.numel})
        inner = [n.inner for n in p.nodes if n.inner]
        rnumel = sympy.Mul(*inner[0])
        same = all(_same_ranges(i, inner[0]) for i in inner)
        t = Tiling("reduction", {"xnumel": p.numel})
        t.rnumel_hint = max(p.hint(sympy.Mul(*i)) for i in inner)
        if t.rnumel_hint > OUTER_MIN_RNUMEL and is_outer_reduction(p):
            t.outer = True
            if _reductions_apart(p):  # blocks of outputs x chunks of rows: enough programs
                t.split = True
                t.numels["rnumel"] = p.nodes[0].rnumel
            return t  # (unsplit: the codegen picks 64 outputs per program, or 16 when few)
        if same and rnumel.is_Integer and 0 < int(rnumel) <= PERSISTENT_MAX:
            t.persistent_rblock = _next_pow2(int(rnumel))
        elif (len(inner) == 1 and _reductions_apart(p)
              and p.hint(p.numel) <= SPLIT_MAX_OUTPUTS and t.rnumel_hint >= SPLIT_MIN_RNUMEL):
            # few outputs, long rows: spread each row over many programs (per-output work
            # after the reduction, e.g. an amax's ``448 / amax``, runs in the final kernel)
            t.split = True
            t.numels["rnumel"] = next(n for n in p.nodes if n.inner).rnumel
        return t

    @property
    def persistent(self) -> bool:
        """The row (or a cooperative program's chunk) is one block in registers: no loops."""
        return self.tiling.persistent_rblock is not None or self.tiling.coop_registers

    def _numel(self, name: str, expr) -> str:
        """A numel as kernel text: the constant, or an argument the wrapper computes."""
        expr = sympy.sympify(expr)
        if expr.is_Integer:
            return str(int(expr))
        self.derived[name] = expr
        return name

    # ------------------------------------------------------------------------------ emission
    def emit(self, line: str) -> None:
        self.target.append(line)

    def new_tmp(self) -> str:
        self._tmp += 1
        return f"tmp{self._tmp - 1}"

    def value(self, expr: str, dtype: torch.dtype, cls: str) -> TVal:
        """Bind ``expr`` to a new variable (or reuse an identical earlier one) in the scope its
        shape class allows: per-outer-point values go before the row loop."""
        cache = self.rcache if cls == "xr" else self.cache
        key = f"{expr}|{dtype}"
        if key in cache:
            return cache[key]
        name = self.new_tmp()
        line = f"{name} = {expr}"
        if cls == "xr" or self.row_lines is None:
            self.target.append(line)
        else:
            self.row_pre.append(line)
        v = TVal(name, dtype, cls)
        cache[key] = v
        return v

    @staticmethod
    def join_cls(*vals) -> str:
        classes = {v.cls for v in vals if isinstance(v, TVal)}
        if "xr" in classes:
            return "xr"
        if "x" in classes:
            return "x"
        return "s"

    # ------------------------------------------------------------------------------ driver
    def generate(self) -> str:
        p = self.plan
        params = [self.ptr.get(a.name, a.name) for a in p.signature.args]
        body_start = len(self.lines)
        self.target = self.lines
        self.row_lines = None
        self.row_pre = self.lines
        self._header()
        self.stats_start = len(self.lines)  # lagged units: where the stats branch starts
        for run in self.runs:
            if not (self.tiling.split and self._is_epilogue(run)):  # (split: in the final kernel)
                self._nodes(run)
        if self.tiling.coop_lagged:
            self._lagged_branches()
        numel_params = list(self.derived)
        consts = ["XBLOCK: tl.constexpr"]
        if self.tiling.kind == "pointwise2d":
            consts.append("YBLOCK: tl.constexpr")
        if self.tiling.kind == "reduction":
            consts.append("RBLOCK: tl.constexpr")
        split_params = []
        if self.tiling.split:
            split_params = [*self.partial_names, "rchunk", "nsplit"]
            consts.append("SPLITB: tl.constexpr")
        if self.tiling.cooperative:
            split_params = ["coop_ws", "coop_tickets", "rchunk", "nsplit"]
            if self.tiling.coop_lagged:
                split_params += ["nunits", "coop_lag"]
            consts.append("SPLITB: tl.constexpr")
        sig = ", ".join(params + numel_params + split_params + consts)
        name = self.kernel_name()
        out = [
            "import triton",
            "import triton.language as tl",
            ("from kiln_codegen_triton import interp_math as kmath" if self.interpret
             else "from triton.language.extra import libdevice as kmath"),
            HELPERS,
            "",
            "@triton.jit",
            f"def {name}({sig}):",
        ]
        out += ["    " + ln for ln in self.lines[body_start:]] or ["    pass"]
        out += ["", "", f"{KERNEL_NAME} = {name}"]
        if self.tiling.split:
            out += ["", "", "@triton.jit", f"def {name}_final({sig}):"]
            out += ["    " + ln for ln in self._final_kernel()]
            out += ["", "", f"{FINAL_NAME} = {name}_final"]
        return "\n".join(out) + "\n"

    def kernel_name(self) -> str:
        """What profilers show: tiling kind and the ops it runs (``kiln_per_sub_exp_sum_div``).

        Made from the kernel's content, never its position, so identical kernels (a model's
        repeated layers) keep identical sources and share one compile."""
        t = self.tiling
        kind = ("coop" if t.cooperative else "split" if t.split else "poi" if t.kind != "reduction"
                else "per" if self.persistent else "red")
        ops = [n for n in self.op_names if n.isidentifier()][:NAME_OPS]
        return "_".join(["kiln", kind, *(ops or ["copy"])])

    @property
    def partial_names(self) -> list[str]:
        """A split kernel's partial-result buffers, one per reduction it stores."""
        return [f"partial{j}" for j in range(len(self.split_stores))]

    @property
    def split_dtypes(self) -> tuple[torch.dtype, ...]:
        return tuple(work_t for _, work_t, *_ in self.split_stores)

    def _final_kernel(self) -> list[str]:
        """Stage 2 of a split reduction: reduce the ``nsplit`` partial results of each output
        of each reduction and store them where the nodes store (``self.split_stores``)."""
        lines: list[str] = []
        self.target, self.row_lines, self.cache, self.rcache = lines, None, {}, {}
        self.names = {s.name: s.name for s in self.plan.loop_symbols}
        self._header()
        xn = self.tiling.numels["xnumel"]
        xn = str(int(xn)) if sympy.sympify(xn).is_Integer else "xnumel"
        self.emit("sindex = tl.arange(0, SPLITB)[None, :]")
        self.tiling.split = False  # the real stores now
        for j, (rt, work_t, lit, name, index) in enumerate(self.split_stores):
            parts, result = f"parts{j}", f"result{j}"
            self.emit(f"{parts} = tl.load(partial{j} + (sindex * {xn} + xindex), (sindex < nsplit) & xmask, other={lit})")
            final = {"sum": f"tl.sum({parts}, 1)", "prod": f"tl.reduce({parts}, 1, _kiln_prod)",
                     "max": f"tl.reduce({parts}, 1, _kiln_max)", "min": f"tl.reduce({parts}, 1, _kiln_min)",
                     "any": f"tl.max({parts}, 1)", "all": f"tl.min({parts}, 1)"}[rt]
            if rt in ("any", "all"):
                self.emit(f"{result} = {final}[:, None] != 0")
                value = TVal(result, torch.bool, "x")
            else:
                self.emit(f"{result} = {final}[:, None]")
                value = TVal(result, work_t, "x")
            self.store(name, index, value)
        for run in self.runs:
            if self._is_epilogue(run):
                self._nodes(run)
        self.tiling.split = True
        return lines

    def _is_epilogue(self, run: list[int]) -> bool:
        """A run of per-output work after the reductions (no rows of its own)."""
        return not any(self.plan.nodes[k].inner for k in run)

    def _unflatten(self, flat: str, ranges: list[sympy.Expr], syms: list[str]) -> None:
        """``i0, i1, ...`` from one flat index over ``ranges`` (row-major)."""
        fs = sympy.Symbol("_flat", integer=True, nonnegative=True)
        names = dict(self.names)
        names["_flat"] = flat
        for k, s in enumerate(syms):
            below = sympy.Mul(*ranges[k + 1:]) if k + 1 < len(ranges) else sympy.Integer(1)
            e = FloorDiv(fs, below) if k == 0 else ModularIndexing(fs, below, ranges[k])
            self.emit(f"{s} = {texpr(e, names)}")

    def _header(self) -> None:
        p, t = self.plan, self.tiling
        syms = [s.name for s in p.loop_symbols]
        for s in syms:
            self.names[s] = s
        if t.kind == "pointwise1d":
            xn = self._numel("xnumel", t.numels["xnumel"])
            self.emit("xoffset = tl.program_id(0) * XBLOCK")
            self.emit("xindex = xoffset + tl.arange(0, XBLOCK)")
            self.emit(f"xmask = xindex < {xn}")
            self.emit("xzero = tl.zeros([XBLOCK], tl.int32)")
            if syms:
                self.emit(f"{syms[0]} = xindex")
            self.mask = {"x": "xmask", "xr": "xmask"}
            self.zero = {"x": "xzero", "xr": "xzero"}
        elif t.kind == "pointwise2d":
            xn = self._numel("xnumel", t.numels["xnumel"])
            yn = self._numel("ynumel", t.numels["ynumel"])
            self.emit(f"xtiles = tl.cdiv({xn}, XBLOCK)")
            self.emit("pid = tl.program_id(0)")
            self.emit("xindex = (pid % xtiles) * XBLOCK + tl.arange(0, XBLOCK)[None, :]")
            self.emit("yindex = (pid // xtiles) * YBLOCK + tl.arange(0, YBLOCK)[:, None]")
            self.emit(f"xmask = (xindex < {xn}) & (yindex < {yn})")
            self.emit("xzero = tl.zeros([YBLOCK, XBLOCK], tl.int32)")
            self.emit(f"{syms[-1]} = xindex")
            self._unflatten("yindex", p.loop_ranges[:-1], syms[:-1])
            self.mask = {"x": "xmask", "xr": "xmask"}
            self.zero = {"x": "xzero", "xr": "xzero"}
        else:
            xn = self._numel("xnumel", t.numels["xnumel"])
            if t.coop_lagged:  # stats and normalize units, in program order (cooperative.py)
                self.emit("pid = tl.program_id(0)")
                self.emit("lagq = pid - coop_lag")
                self.emit("lagtail = lagq - 2 * (nunits - coop_lag)")
                self.emit("is_stats = (lagq < 0) | ((lagq % 2 == 0) & (lagtail < 0))")
                self.emit("unit = tl.where(lagq < 0, pid, tl.where(lagtail >= 0, nunits - coop_lag + lagtail, "
                          "tl.where(lagq % 2 == 0, coop_lag + lagq // 2, lagq // 2)))")
                self.emit("kchunk = unit % nsplit")
                self.emit("xoffset = (unit // nsplit) * XBLOCK")
            elif t.cooperative:  # K consecutive programs per row (see cooperative.py)
                self.emit("pid = tl.program_id(0)")
                self.emit("kchunk = pid % nsplit")
                self.emit("xoffset = (pid // nsplit) * XBLOCK")
            else:
                self.emit("xoffset = tl.program_id(0) * XBLOCK")
            self.emit("xindex = xoffset + tl.arange(0, XBLOCK)[:, None]")
            self.emit(f"xmask = xindex < {xn}")
            self.emit("xzero = tl.zeros([XBLOCK, 1], tl.int32)")
            if syms:
                self._unflatten("xindex", p.loop_ranges, syms)
            self.mask = {"x": "xmask", "xr": "rxmask"}
            self.zero = {"x": "xzero", "xr": "rzero"}
            if t.cooperative:  # (registers: the chunk is the block, RBLOCK-aligned)
                chunk = "RBLOCK" if t.coop_registers else "rchunk"
                self.emit(f"rstart = kchunk * {chunk}")
                self.emit(f"rend = tl.minimum(rstart + {chunk}, {self._numel('rnumel0', p.nodes[0].rnumel)})")
            if self.persistent:
                inner = next(n for n in p.nodes if n.inner)
                if t.coop_registers:
                    self.emit("rindex = rstart + tl.arange(0, RBLOCK)[None, :]")
                    self.emit("rmask = rindex < rend")
                else:
                    self.emit("rindex = tl.arange(0, RBLOCK)[None, :]")
                    self.emit(f"rmask = rindex < {self._numel('rnumel', inner.rnumel)}")
                self.emit("rxmask = rmask & xmask")
                self.emit("rzero = tl.zeros([XBLOCK, RBLOCK], tl.int32)")
                self._unflatten("rindex", inner.inner, [s.name for s in inner.inner_symbols])

    # ------------------------------------------------------------------------------ nodes
    def _row_runs(self) -> list[list[int]]:
        """The nodes, in order, grouped into runs that share one loop over their rows (see
        ``_joins``); every other node is a run of its own."""
        runs: list[list[int]] = []
        for k in range(len(self.plan.nodes)):
            if runs and self._joins(runs[-1], k):
                runs[-1].append(k)
            else:
                runs.append([k])
        return runs

    def _joins(self, run: list[int], k: int) -> bool:
        """Node ``k`` joins the looped run ``run`` when it loops over the same inner ranges and
        touches nothing the run writes (nor writes what it reads), or when it is a ``sum`` the
        online rule rewrites over a ``max`` of the run (``online_rescale``)."""
        p = self.plan
        if self.persistent or not ROW_LOOP_FUSION:
            return False
        node, first = p.nodes[k], p.nodes[run[0]]
        if not node.inner or not first.inner or not _same_ranges(node.inner, first.inner):
            return False
        if [s.name for s in node.inner_symbols] != [s.name for s in first.inner_symbols]:
            return False
        written = {d.name for j in run for d in p.nodes[j].writes}
        read = {d.name for j in run for d in p.nodes[j].reads}
        mine_r, mine_w = {d.name for d in node.reads}, {d.name for d in node.writes}
        if mine_w & (read | written):
            return False
        clash = mine_r & written
        if not clash:
            return True
        if len(clash) != 1 or not ONLINE_SOFTMAX:
            return False
        (m_name,) = clash
        writer = next(j for j in run if m_name in {d.name for d in p.nodes[j].writes})
        if m_name not in p.register_buffers or writer in self.online_max:
            return False
        trace = [trace_body(p.group.nodes[j].body, list(p.outer_index), list(p.nodes[j].inner_symbols))
                 for j in (k, writer)]
        match = match_online_sum(trace[0], trace[1], writer, m_name)
        if match is None:
            return False
        self.online[k] = match
        self.online_max[writer] = None  # filled by reduction(): its accumulator's names
        return True

    def _nodes(self, run: list[int]) -> None:
        p = self.plan
        first = p.nodes[run[0]]
        if any(d.name in self.written_memory for k in run for d in p.nodes[k].reads):
            self.emit("tl.debug_barrier()")
        if first.inner and not self.persistent:
            rn = self._numel(f"rnumel{run[0]}", first.rnumel)
            self.row_pre = self.target  # per-outer-point values: before the loop
            loop: list[str] = []
            self.rcache = {}
            self.after: list[str] = []
            self.acc_init: list[str] = []
            start, end = "0", rn
            if self.tiling.split:  # this program's chunk of the row
                self.emit("rstart = tl.program_id(1) * rchunk")
                self.emit(f"rend = tl.minimum(rstart + rchunk, {rn})")
                start, end = "rstart", "rend"
            elif self.tiling.cooperative:  # this program's chunk (rstart/rend: the header)
                start, end = "rstart", "rend"
            header = [f"for roffset in range({start}, {end}, RBLOCK):",
                      "    rindex = roffset + tl.arange(0, RBLOCK)[None, :]",
                      f"    rmask = rindex < {end}",
                      "    rxmask = rmask & xmask",
                      "    rzero = tl.zeros([XBLOCK, RBLOCK], tl.int32)"]
            saved = self.target
            self.target = loop
            self.row_lines = loop
            self._unflatten("rindex", first.inner, [s.name for s in first.inner_symbols])
            for k in run:
                self.node_k, self.node_plan = k, p.nodes[k]
                self.target, self.row_lines = loop, loop
                if k in self.online:
                    self._online_sum(self.online[k])
                else:
                    self._run_body(p.group.nodes[k])
            self.target = saved
            saved.extend(self.acc_init)
            saved.extend(header)
            saved.extend("    " + ln for ln in loop)
            saved.extend(self.after)
            self.row_lines = None
            self.rcache = {}
            if self.tiling.cooperative and run is self.runs[0]:
                self._coop_exchange(run)
        else:
            (k,) = run
            self.node_k, self.node_plan = k, first
            self.row_lines = None
            self.after = self.target
            self.acc_init = self.target
            if not self.persistent:
                self.rcache = {}
            if k in self.online:  # cooperative registers: the chunk's sum, parts kept apart
                self._coop_chunk_sum(self.online[k])
            else:
                self._run_body(p.group.nodes[k])
            if self.tiling.coop_registers and k == self.coop_leading[-1]:
                self._coop_exchange(self.coop_leading)

    def _cooperative_plan(self) -> bool:
        """Cooperative rows (``cooperative.py``) when enabled, for a looped kernel whose first
        run reduces long float32 rows into registers (sum/max/min, online sums) and whose
        other nodes are per-element work over the same rows (no further reductions)."""
        p, t = self.plan, self.tiling
        mode = coop.mode(self.interpret)
        if mode == "off" or t.kind != "reduction":
            return False
        if self.persistent or t.split or t.rnumel_hint < coop.MIN_RNUMEL:
            return False
        first = [p.nodes[k] for k in self.runs[0]]
        if not all(n.kind == "reduction" and n.reduction_type in coop.COMBINABLE for n in first):
            return False
        for n in first:
            for d in n.writes:
                if d.name not in p.register_buffers or _dtype_of(p, d.name) != torch.float32:
                    return False
        for run in self.runs[1:]:
            for k in run:
                n = p.nodes[k]
                if n.kind == "reduction":
                    return False
                if n.inner and not _same_ranges(n.inner, first[0].inner):
                    return False
        self.tiling.numels["rnumel"] = first[0].rnumel
        rnumel = sympy.sympify(first[0].rnumel)
        if mode == "lagged":
            if not (rnumel.is_Integer and coop.lagged_configs(int(rnumel))):
                return False  # (no config fits: one program per row)
            # stats units reduce their chunk (one block) and publish; normalize units, later
            # in the launch, combine the row's partials and re-read their chunk from L2
            t.coop_lagged = True
            self.row_eviction = ", eviction_policy='evict_last'"
        if t.coop_lagged or (coop.registers_enabled() and rnumel.is_Integer and coop.register_configs(int(rnumel))):
            # the chunk one block (registers: kept across the exchange): persistent-style nodes
            # (one per run), the first run's reductions done on the block, then the exchange
            # (``_coop_exchange``)
            t.coop_registers = True
            self.coop_leading = list(self.runs[0])
            self.online_max = {}
            self.runs = [[k] for k in range(len(p.nodes))]
        return True

    def _coop_exchange(self, run: list[int]) -> None:
        """After the first run of a cooperative kernel: publish this chunk's partials, wait for
        the row's K programs (tickets, see cooperative.py), load and combine all K partials and
        make the combined values the registers later nodes read."""
        p = self.plan
        parts: list[tuple[int, str, str]] = []  # (node, kind, variable) in workspace order
        for k in run:
            name = p.nodes[k].writes[0].name
            if k in self.online:
                raw, ninf = self.online_parts[k]
                parts += [(k, "online_sum", raw), (k, "online_ninf", ninf)]
            else:
                parts.append((k, p.nodes[k].reduction_type, self.registers[name].name))
        self.coop_nparts = n = len(parts)
        self.emit("# cooperative rows: publish, wait for the row's K programs, combine")
        for j, (_, _, var) in enumerate(parts):
            self.emit(f"tl.store(coop_ws + ((xindex * nsplit + kchunk) * {n} + {j}), {var}.to(tl.float32), xmask)")
        if self.tiling.coop_lagged:
            self._lagged_wait()
        else:
            self._ticket_wait()
        self.emit("sindex = tl.arange(0, SPLITB)[None, :]")
        self.emit("smask = (sindex < nsplit) & xmask")
        part_of: dict[tuple[int, str], str] = {}
        for j, (k, kind, var) in enumerate(parts):
            other = {"max": 'float("-inf")', "min": 'float("inf")'}.get(kind, "0.0")
            # after the acquire, from L2 (.cg); volatile=True here costs Triton 3.6 128
            # registers and spills (cooperative.py, "Triton versions")
            self.emit(f"{var}_parts = tl.load(coop_ws + ((xindex * nsplit + sindex) * {n} + {j}), smask, "
                      f"other={other}, cache_modifier='.cg')")
            part_of[(k, kind)] = f"{var}_parts"
        if not self.persistent:
            self.rcache = {}
        final = {"sum": "tl.sum({}, 1)", "max": "tl.reduce({}, 1, _kiln_max)", "min": "tl.reduce({}, 1, _kiln_min)"}
        for k in run:  # in run order: a max is combined before the online sum over it
            name = p.nodes[k].writes[0].name
            res = self.new_tmp()
            if k in self.online:
                m = self.online[k]
                m_parts = TVal(part_of[(m.max_node, "max")], torch.float32, "xr")
                w_k = self._as(replay(m.shift, self, {m.m_name: m_parts}), torch.float32)
                w_row = self._as(replay(m.shift, self, {m.m_name: self.registers[m.m_name]}), torch.float32)
                s_parts, ninf_parts = part_of[(k, "online_sum")], part_of[(k, "online_ninf")]
                self.emit(f"{res} = tl.sum(tl.where({s_parts} == 0, 0.0, {s_parts} * tl.exp({w_k} - {w_row})), 1)"
                          f"[:, None] + tl.where(tl.max({ninf_parts}, 1)[:, None] > 0, "
                          f"tl.exp(float('-inf') - {w_row}), 0.0)")
                if k in self.coop_terms:
                    self._coop_one_exp(self.coop_terms[k], w_row)
            else:
                kind = p.nodes[k].reduction_type
                self.emit(f"{res} = {final[kind].format(part_of[(k, kind)])}[:, None]")
            self.registers[name] = TVal(res, torch.float32, "x")
        if not self.persistent:  # (registers: later nodes reuse the chunk's loaded values)
            self.rcache = {}

    def _ticket_wait(self) -> None:
        """Take this program's ticket on its row and wait for the row's K tickets of this
        launch. One row per program (XBLOCK is 1, cooperative.launch_configs): the row's
        counter is a scalar; the spin carries only a scalar (cooperative.py, "Triton
        versions")."""
        self.emit("tl.static_assert(XBLOCK == 1)")
        self.emit("ticket = tl.atomic_add(coop_tickets + xoffset, 1, sem='acq_rel')")
        self.emit("target = ticket - ticket % nsplit + nsplit")
        self.emit("seen = ticket + 1")
        self._spin_until_target()

    def _lagged_wait(self) -> None:
        """Lagged units: the stats unit counts itself on its row (release) and ends here (its
        branch); the normalize unit, from here on, takes a ticket on the row's second counter
        (its launch: ``ticket // K``) and waits until the row's K stats units of that launch
        are counted (they started earlier: done or running, see cooperative.py)."""
        self.emit("tl.static_assert(XBLOCK == 1)")
        self.emit("tl.atomic_add(coop_tickets + xoffset, 1, sem='release')")
        self.normalize_start = len(self.target)
        self.cache, self.rcache = {}, {}  # values of the stats branch do not exist in the other
        self.row_eviction = ", eviction_policy='evict_first'"
        self.emit("ticket = tl.atomic_add(coop_tickets + nunits // nsplit + xoffset, 1, sem='relaxed')")
        self.emit("target = (ticket // nsplit + 1) * nsplit")
        self.emit("seen = tl.atomic_add(coop_tickets + xoffset, 0, sem='acquire')")
        self._spin_until_target()

    def _spin_until_target(self) -> None:
        """Poll the row's counter (acquire) until it reaches ``target``."""
        self.emit("while seen < target:")
        self.emit("    seen = tl.atomic_add(coop_tickets + xoffset, 0, sem='acquire')")

    def _lagged_branches(self) -> None:
        """Put the lines of the stats unit (up to the publish) under ``if is_stats:`` and the
        rest (wait, combine, re-read, per-element work) under ``else:``."""
        start, split = self.stats_start, self.normalize_start
        stats, normalize = self.lines[start:split], self.lines[split:]
        self.lines[start:] = (["if is_stats:"] + ["    " + ln for ln in stats]
                              + ["else:"] + ["    " + ln for ln in normalize])

    def _coop_chunk_sum(self, m: OnlineSum) -> None:
        """Cooperative registers: the sum node ``m`` over this program's chunk (one block),
        relative to the chunk's max and with its ``-inf`` entries counted apart: the same two
        parts ``_online_sum`` leaves, which ``_coop_exchange`` rescales to the row max."""
        acc_t = m.reduction.args[0]
        tlt = tl_dtype(acc_t)
        a = self._as(replay(m.a, self, {}), acc_t)
        w_loc = self._as(replay(m.shift, self, {m.m_name: self.registers[m.m_name]}), acc_t)
        res_s = self.new_tmp()
        if m.shift_is_max:  # w(m) = m (softmax, log_softmax): the -inf entries without a reduction
            # (relative to the chunk max, an all -inf chunk's max taken as 0: its sum is 0). The
            # -inf entries matter only to a row whose max is -inf, where every chunk's is too
            w_safe = self.value(f"tl.where({w_loc} == float('-inf'), 0.0, {w_loc})", acc_t, "x")
            term = self.exp(self.sub(a, w_safe))
            self.emit(f"{res_s}_raw = tl.sum(tl.where(rxmask, {term}, 0.0), 1)[:, None]")
            self.emit(f"{res_s}_anyninf = ({w_loc} == float('-inf')).to({tlt})")
        else:
            term = self.exp(self.sub(a, w_loc))
            self.emit(f"{res_s}_raw = tl.sum(tl.where(rxmask & ({a} != float('-inf')), {term}, 0.0), 1)[:, None]")
            self.emit(f"{res_s}_anyninf = tl.max((rxmask & ({a} == float('-inf'))).to(tl.int32), 1)[:, None]"
                      f".to({tlt})")
        self.emit(f"{res_s} = ({res_s}_raw + tl.where({res_s}_anyninf > 0, "
                  f"tl.exp(float('-inf') - {w_loc}), 0.0)).to({tlt})")
        self.online_parts[self.node_k] = (f"{res_s}_raw", f"{res_s}_anyninf")
        if coop.ONE_EXP and not self.tiling.coop_lagged:  # (lagged: the terms stay in the stats unit)
            self.coop_terms[self.node_k] = (a, w_loc, term)
        name, index, _ = m.store.args
        self.store_reduction(name, index, TVal(res_s, acc_t, "x"))

    def _coop_one_exp(self, terms: tuple[TVal, TVal, TVal], w_row: TVal) -> None:
        """Cooperative registers: ``exp(a - w(M))``, which softmax's per-element work computes
        again, as the chunk's ``exp(a - w(m))`` (still in registers) times the per-row
        ``exp(w(m) - w(M))``: one exp per element instead of two. Seeded into the row cache
        under the text the later node will ask for (unused: dead code, dropped by Triton). A
        chunk of only ``-inf`` (w(m) = -inf) gives ``exp(-inf - w(M))`` as eager does."""
        a, w_loc, term = terms
        dtype = term.dtype
        diff = self.sub(a, self._as(w_row, a.dtype))
        key = f"{self.spell('exp', [diff.name], diff.dtype)}|{diff.dtype}"
        res = self.new_tmp()
        self.emit(f"{res} = tl.where({w_loc} == float('-inf'), tl.exp(float('-inf') - {w_row}), "
                  f"{term} * tl.exp({w_loc} - {w_row}))")
        self.rcache[key] = TVal(res, dtype, "xr")

    def _online_sum(self, m: OnlineSum) -> None:
        """Emit the sum node ``m`` inside its max's loop: each lane's partial sum is relative
        to the lane's running max and rescaled when that max moves; after the loop the lanes
        are rescaled to the row max and summed (``online_rescale`` says why it is exact)."""
        acc, work_t, res = self.online_max[m.max_node]
        acc_t = m.reduction.args[0]
        tlt = tl_dtype(acc_t)
        a = self._as(replay(m.a, self, {}), acc_t)
        w_new = replay(m.shift, self, {m.m_name: TVal(acc, work_t, "xr")})
        w_prev = replay(m.shift, self, {m.m_name: TVal(f"{acc}_prev", work_t, "xr")})
        term = self.exp(self.sub(a, self._as(w_new, acc_t)))
        scale = self.exp(self.sub(self._as(w_prev, acc_t), self._as(w_new, acc_t)))
        res_s = self.new_tmp()
        sacc, ninf = f"{res_s}_acc", f"{res_s}_ninf"
        self.acc_init.append(f"{sacc} = tl.full([XBLOCK, RBLOCK], 0.0, {tlt})")
        self.acc_init.append(f"{ninf} = tl.zeros([XBLOCK, RBLOCK], tl.int32)")
        # a lane with nothing summed yet stays 0 (its max may still be -inf: no inf * 0); an
        # a of -inf adds exp(-inf - shift(M)) (0, or NaN when M is -inf too): added after
        is_ninf = f"rxmask & ({a} == float('-inf'))"
        self.emit(f"{sacc} = tl.where({sacc} == 0, 0.0, {sacc} * {scale}) + "
                  f"tl.where(rxmask & ({a} != float('-inf')), {term}, 0.0)")
        self.emit(f"{ninf} = tl.maximum({ninf}, ({is_ninf}).to(tl.int32))")
        # after the loop: lanes to the row max. Values made here must not leak into the loop.
        saved_caches = dict(self.cache), self.rcache
        self.target, self.row_lines, self.rcache = self.after, None, {}
        w_lane = self._as(replay(m.shift, self, {m.m_name: TVal(acc, work_t, "xr")}), acc_t)
        w_row = self._as(replay(m.shift, self, {m.m_name: TVal(res, work_t, "x")}), acc_t)
        self.emit(f"{res_s}_raw = tl.sum(tl.where({sacc} == 0, 0.0, {sacc} * tl.exp({w_lane} - {w_row})), 1)[:, None]")
        self.emit(f"{res_s}_anyninf = tl.max({ninf}, 1)[:, None].to({tlt})")
        self.emit(f"{res_s} = ({res_s}_raw + tl.where({res_s}_anyninf > 0, "
                  f"tl.exp(float('-inf') - {w_row}), 0.0)).to({tlt})")
        self.cache, self.rcache = saved_caches
        self.online_parts[self.node_k] = (f"{res_s}_raw", f"{res_s}_anyninf")
        name, index, _ = m.store.args
        self.store_reduction(name, index, TVal(res_s, acc_t, "x"))

    def _run_body(self, node) -> None:
        outer = list(self.plan.outer_index)
        inner = list(self.node_plan.inner_symbols)
        with set_ops_handler(self):
            node.body(outer, inner)

    # ------------------------------------------------------------------------------ indices
    def _index_cls(self, index: sympy.Expr) -> str:
        cls = "s"
        for s in index.free_symbols:
            kind = symbol_kind(s)
            if kind == "r":
                return "xr"
            if kind == "i":
                cls = "x"
            if kind == "ind":
                c = self.ind_cls.get(s.name, "x")
                if c == "xr":
                    return "xr"
                if c == "x":
                    cls = "x"
        return cls

    def _index(self, index) -> str:
        return texpr(sympy.sympify(index), self.names)

    # ------------------------------------------------------------------------------ ops: memory
    def load(self, name: str, index) -> TVal:
        index = sympy.sympify(index)
        if name in self.registers:
            return self.registers[name]
        if name in self.rows and self.rows[name][0] == index:
            return self.rows[name][1]
        arg = next((a for a in self.plan.signature.buffers if a.name == name), None)
        if arg is None:
            raise MissingOpError(f"load of {name}, which is not an argument of this kernel")
        dtype = arg.dtype
        cls = self._index_cls(index)
        idx = self._index(index)
        if cls == "s":
            return self.value(f"tl.load({self.ptr[name]} + ({idx}))", dtype, "s")
        hint = self.row_eviction if cls == "xr" else ""
        return self.value(f"tl.load({self.ptr[name]} + ({idx}), {self.mask[cls]}, other=0{hint})", dtype, cls)

    def _forget(self, name: str) -> None:
        for cache in (self.cache, self.rcache):
            for key in [k for k in cache if k.startswith(f"tl.load({self.ptr[name]} +")]:
                del cache[key]

    def store(self, name: str, index, value: TVal, mode=None) -> None:
        index = sympy.sympify(index)
        if name in self.plan.register_buffers:
            self.registers[name] = self._as(value, self._buffer_dtype(name))
            return
        if self.persistent and name in self.plan.row_buffers:
            self.rows[name] = (index, self._as(value, self._buffer_dtype(name)))
            return
        cls = self._index_cls(index)
        if cls == "s":
            cls = "xr" if value.cls == "xr" else "x"
        idx = self._index(index)
        if not any(symbol_kind(s) in ("i", "r") for s in index.free_symbols):
            idx = f"{idx} + {self.zero[cls]}"
        if name not in self.ptr:
            raise MissingOpError(f"store to {name}, which is not an argument of this kernel")
        ptr = f"{self.ptr[name]} + ({idx})"
        v = self._as(value, self._buffer_dtype(name)).name
        if mode == "atomic_add":
            # the pointers as wide as the tile: an index missing a tile dimension (a constant
            # index, embedding rows all 0: every point of that dimension adds into one place)
            # gives narrower pointers than the values, which tl.atomic_add does not broadcast
            self.emit(f"tl.atomic_add({ptr} + {self.zero[cls]}, {v}, {self.mask[cls]})")
        elif mode is None:
            hint = self.row_eviction if cls == "xr" else ""
            self.emit(f"tl.store({ptr}, {v}, {self.mask[cls]}{hint})")
        else:
            raise MissingOpError(f"store mode {mode!r}")
        self.written_memory.add(name)
        self._forget(name)

    def store_reduction(self, name: str, index, value: TVal) -> None:
        if self.tiling.split:
            rt, work_t, lit = self.split_kind
            j = len(self.split_stores)
            self.split_stores.append((rt, work_t, lit, name, sympy.sympify(index)))
            xn = self.tiling.numels["xnumel"]
            xn = str(int(xn)) if sympy.sympify(xn).is_Integer else "xnumel"
            v = value.name if rt not in ("any", "all") else f"{value.name}.to(tl.int32)"
            self.emit(f"tl.store(partial{j} + (tl.program_id(1) * {xn} + xindex), {v}, xmask)")
            return
        self.store(name, index, value)

    def _buffer_dtype(self, name: str) -> torch.dtype:
        for a in self.plan.signature.buffers:
            if a.name == name:
                return a.dtype
        return _dtype_of(self.plan, name)

    def _as(self, v: TVal, dtype: torch.dtype) -> TVal:
        if v.dtype == dtype:
            return v
        return self.to_dtype(v, dtype)

    # ------------------------------------------------------------------------------ ops: reduction
    def reduction(self, dtype, src_dtype, reduction_type: str, value: TVal) -> TVal:
        rt = reduction_type
        self.op_names[rt] = None
        acc_t = dtype
        if not self.node_plan.inner:  # a reduction over no dims: one element per output
            if rt in ("argmax", "argmin"):
                return self.constant(0, torch.int64)
            if rt == "welford_m2":
                return self.constant(0.0, acc_t)
            return self.to_dtype(value, torch.bool if rt in ("any", "all") else acc_t)
        if rt in WELFORD_TYPES:
            return self._welford(rt, acc_t, value)
        if rt in ("argmax", "argmin", "max", "min"):
            work_t = value.dtype if value.dtype != torch.bool else torch.int8
        elif rt in ("any", "all"):
            work_t = torch.int32
        else:
            work_t = acc_t
        v = self._as(value, work_t) if work_t != torch.bool else value
        shape = "[XBLOCK, RBLOCK]"
        vb = f"tl.broadcast_to({v.name}, {shape})"
        if rt in ("any", "all"):
            vb = f"tl.broadcast_to(({value.name} != 0).to(tl.int32), {shape})"
        ident = reduction_identity(rt if rt not in ("any", "all") else "sum", work_t) \
            if rt not in ("any", "all") else (0 if rt == "any" else 1)
        lit = literal(ident, work_t)
        tlt = tl_dtype(work_t)
        self.split_kind = (rt, acc_t if rt not in ("any", "all") else torch.int32, lit)
        masked = f"tl.where(rxmask, {vb}, {lit})"
        res = self.new_tmp()
        if rt in ("argmax", "argmin"):
            ridx = f"tl.where(rxmask, tl.broadcast_to(rindex, {shape}), 2147483647)"
            if self.persistent:
                self.emit(f"_, {res} = tl.reduce(({masked}, {ridx}), 1, _kiln_{rt})")
            else:
                av, ai = f"{res}_v", f"{res}_i"
                self.acc_init.append(f"{av} = tl.full({shape}, {lit}, {tlt})")
                self.acc_init.append(f"{ai} = tl.full({shape}, 2147483647, tl.int32)")
                self.emit(f"{av}, {ai} = _kiln_{rt}({av}, {ai}, {masked}, {ridx})")
                self.after.append(f"_, {res} = tl.reduce(({av}, {ai}), 1, _kiln_{rt})")
            self.after.append(f"{res} = {res}[:, None].to(tl.int64)")
            self.target, self.row_lines = self.after, None
            return TVal(res, torch.int64, "x")
        final = {
            "sum": lambda a: f"tl.sum({a}, 1)",
            "prod": lambda a: f"tl.reduce({a}, 1, _kiln_prod)",
            "max": lambda a: f"tl.reduce({a}, 1, _kiln_max)",
            "min": lambda a: f"tl.reduce({a}, 1, _kiln_min)",
            "any": lambda a: f"tl.max({a}, 1)",
            "all": lambda a: f"tl.min({a}, 1)",
        }
        combine = {
            "sum": lambda a, b: f"{a} + {b}",
            "prod": lambda a, b: f"{a} * {b}",
            "max": lambda a, b: f"_kiln_max({a}, {b})",
            "min": lambda a, b: f"_kiln_min({a}, {b})",
            "any": lambda a, b: f"tl.maximum({a}, {b})",
            "all": lambda a, b: f"tl.minimum({a}, {b})",
        }
        if rt not in final:
            raise MissingOpError(f"reduction {rt!r}")
        if self.persistent:
            self.emit(f"{res} = {final[rt](masked)}")
        else:
            acc = f"{res}_acc"
            self.acc_init.append(f"{acc} = tl.full({shape}, {lit}, {tlt})")
            if self.node_k in self.online_max:  # a sum rescales over this running max
                self.emit(f"{acc}_prev = {acc}")
                self.online_max[self.node_k] = (acc, work_t, res)
            self.emit(f"{acc} = {combine[rt](acc, masked)}")
            self.after.append(f"{res} = {final[rt](acc)}")
        out_t = torch.bool if rt in ("any", "all") else acc_t
        if rt in ("any", "all"):
            self.after.append(f"{res} = {res}[:, None] != 0")
        else:
            self.after.append(f"{res} = {res}[:, None].to({tl_dtype(out_t)})")
        self.target, self.row_lines = self.after, None
        return TVal(res, out_t, "x")

    def _welford(self, rt: str, acc_t: torch.dtype, value: TVal) -> TVal:
        """welford_mean / welford_m2 of the row. Looped: per-lane (mean, m2, count) updated by
        Welford's rule, merged across lanes with Chan's formula (``_kiln_welford``).
        Persistent: the row is in registers, so mean then squared deviations, exactly. Nodes
        reducing the same value (var_mean: mean and m2) share one state."""
        tlt = tl_dtype(acc_t)
        shape = "[XBLOCK, RBLOCK]"
        v = self._as(value, acc_t)
        state = self.welford.get(v.name)
        if state is None:
            w = self.new_tmp() + "_w"
            vb = f"tl.broadcast_to({v.name}, {shape})"
            if self.persistent:
                self.emit(f"{w}_n = tl.sum(rxmask.to({tlt}), 1)[:, None]")
                self.emit(f"{w}_mean = tl.sum(tl.where(rxmask, {vb}, 0.0), 1)[:, None] / {w}_n")
                self.emit(f"{w}_d = tl.where(rxmask, {vb} - {w}_mean, 0.0)")
                self.emit(f"{w}_m2 = tl.sum({w}_d * {w}_d, 1)[:, None]")
            else:
                for part in ("mean", "m2", "n"):
                    self.acc_init.append(f"{w}_{part}_acc = tl.zeros({shape}, {tlt})")
                self.emit(f"{w}_n_acc = {w}_n_acc + rxmask.to({tlt})")
                self.emit(f"{w}_d = {vb} - {w}_mean_acc")
                self.emit(f"{w}_mean_acc = tl.where(rxmask, {w}_mean_acc + {w}_d / tl.maximum({w}_n_acc, 1.0), "
                          f"{w}_mean_acc)")
                self.emit(f"{w}_m2_acc = tl.where(rxmask, {w}_m2_acc + {w}_d * ({vb} - {w}_mean_acc), {w}_m2_acc)")
                self.after.append(f"{w}_mean, {w}_m2, {w}_n = tl.reduce(({w}_mean_acc, {w}_m2_acc, {w}_n_acc), "
                                  "1, _kiln_welford)")
                self.after.append(f"{w}_mean, {w}_m2, {w}_n = {w}_mean[:, None], {w}_m2[:, None], {w}_n[:, None]")
            state = self.welford[v.name] = w
        res = self.new_tmp()
        if rt == "welford_mean":  # an empty row's mean is NaN, as torch's
            self.after.append(f"{res} = tl.where({state}_n == 0, float('nan'), {state}_mean).to({tlt})")
        else:
            self.after.append(f"{res} = {state}_m2.to({tlt})")
        self.target, self.row_lines = self.after, None
        return TVal(res, acc_t, "x")


def _dtype_of(plan: KernelPlan, name: str) -> torch.dtype:
    for n in plan.group.nodes:
        buf = n.buffer
        if buf.name == name:
            return buf.layout.dtype
        target = getattr(buf, "target", None)
        if target is not None and target.name == name:
            return target.layout.dtype
    raise KeyError(f"dtype of buffer {name} in {plan.name}")
