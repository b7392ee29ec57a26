"""One C++ function per FusedGroup.

How a group becomes C++ (``CppKernel(group, name).generate()``):

* A pre-pass runs every node body under loopir's dependency handler (``body_deps``) to learn
  which buffers the group reads and writes, and which internal buffers can live in a local
  variable instead of memory (written once per outer point by a reduction or by a node with no
  inner loop, read back only at the index it was stored at).
* Loop levels. A pure pointwise group (every node ``inner == []``) runs its outer loops with the
  first one(s) parallel (``#pragma omp parallel for``; the leading dims are flattened into one
  parallel loop when there are more than two) and the innermost one ``#pragma omp simd``
  (a single outer dim gets ``parallel for simd``). A group with inner loops runs all its outer
  dims as one flattened parallel loop; inside it, each node runs its own inner loop nest:
  a pointwise node's innermost loop is ``#pragma omp simd``; a reduction keeps ``LANES``
  accumulators, walks the innermost reduction dim in chunks of ``LANES`` with a
  ``#pragma omp simd`` lane loop, finishes the remainder in a scalar tail loop and combines the
  lanes horizontally (so float sums vectorize without -ffast-math, and max/min/argmax keep
  torch's NaN and tie rules). Float sums add in a cascade (block sums, then middle-level sums,
  then the lanes: ``CASCADE_BLOCK``), as accurate as torch.sum.
* Transposing copies (pure pointwise; every store contiguous along one loop, a load along
  another: ``kiln_loopir.kernel_plan.transposed_loops``) run those two loops in 2-D tiles
  (``_tiled_group``), so loads and stores both touch whole cache lines; full tiles of plain
  copies transpose 16x16 blocks in registers (``_register_transposes``). A dim read only as
  ``i // 64`` and ``i % 64`` is first split into two loops (``collapse_outer_loops(split=True)``).
* Rows (groups with inner loops): thread-local stack arrays over one node's inner loop, declared
  inside the outer loop. An internal buffer written by a pointwise node over inner loops and
  read back by later nodes over the same loop at the same index lives in a row (``row0``: an
  embedding sum its layernorm reads; never allocated). A costly value (``exp``, ``erf``...)
  that a node computes per inner point and a later node over the same loop computes again is
  kept in a row by the first (``saved0``: softmax's ``exp(x - max)``, computed once). This
  needs a second generation pass: the first finds the shared values (structural value keys).
* The ops handler (this class; the op spellings are ``ops.CppOps``') emits one typed C++
  statement per op (``float tmp3 = ...;``) with common-subexpression elimination, placing
  each statement in the outermost loop level its operands allow (loop-invariant code is
  hoisted; loads of buffers the group itself writes are never hoisted; a non-affine address
  part, such as a pooling window's clamps, is hoisted out of the innermost loop so GCC still
  vectorizes it).
* float16/bfloat16 values are raw ``uint16_t`` bit patterns; ``to_dtype`` converts them to/from
  float (``kiln_h2f``/``kiln_f2h``/``kiln_bf2f``/``kiln_f2bf`` in the prelude).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import sympy
import torch
from kiln_loopir.analysis import body_deps
from kiln_loopir.kernel_plan import (
    access_strides,
    collapse_outer_loops,
    on_chip_buffers,
    transposed_loops,
)
from kiln_loopir.ops_spec import WELFORD_TYPES, reduction_identity
from kiln_loopir.sizevars import (
    FloorDiv,
    ModularIndexing,
    index_symbol,
    reduction_symbol,
    simplify_index,
    statically_known_equal,
    symbol_kind,
)
from kiln_loopir.virtualized import MissingOpError, set_ops_handler

from .ops import HALF, CppOps, CppValue, _from_float, _to_float, c_literal, ctype
from .prelude import TRANSPOSE_WORDS, transpose_helper
from .printer import cexpr

LANES = 16  # accumulators per reduction (one AVX-512 register of floats)
#: float sums add each block of CASCADE_BLOCK elements (per lane: CASCADE_BLOCK / LANES) into
#: block accumulators first, CASCADE_FANOUT block sums into a middle level, that into the
#: lanes: a cascade, as torch's CPU sums do (one long chain per lane lost ~3x torch.sum's accuracy, issue 25)
CASCADE_BLOCK = 1024
CASCADE_FANOUT = 64  # block sums per middle-level sum (a third level: long sums, 1e7)
CASCADE = True  # False: one chain per lane (A/B measurements)
_NL = "@NL@"  # placeholder for the lane count of a lane-mode chunk
PARALLEL_THRESHOLD = 16384  # elements of work below which a kernel runs single-threaded
#: a transposing copy's 2-D tile: TILE_LOADS points along the loads' contiguous loop by
#: TILE_STORES along the stores' (32x32 measured best of 8..64 on the permute-copy microbenchmark)
TILE_LOADS = 32
TILE_STORES = 32
#: False: no 2-D tiles and no loop splitting for pointwise kernels (A/B measurements)
TILED_TRANSPOSES = True
ROW_LIMIT = 16384  # longest thread-local row (elements) a kernel keeps on the stack
ROW_BYTES_LIMIT = 256 * 1024  # all rows of one kernel, per thread

#: reduction type -> the C expression combining two partial results ``a`` and ``b``
_COMBINE = {
    "sum": "{a} + {b}",
    "prod": "{a} * {b}",
    "max": "kiln_maximum({a}, {b})",
    "min": "kiln_minimum({a}, {b})",
    "any": "{a} | {b}",
    "all": "{a} & {b}",
}
ROW_BYTES = {"float": 4, "double": 8, "uint16_t": 2, "int8_t": 1, "uint8_t": 1, "int16_t": 2,
             "int32_t": 4, "int64_t": 8, "bool": 1, "uint32_t": 4, "uint64_t": 8}
#: calls worth keeping in a row rather than computing twice
_COSTLY_CALL = re.compile(
    r"\b(?:kiln_)?(?:exp|exp2|expm1|log|log2|log10|log1p|sin|cos|tan|asin|acos|atan|sinh|cosh|"
    r"tanh|asinh|acosh|atanh|erf|erfc|erfinv|lgamma|pow|sigmoid|atan2|hypot)f?\(")
_TMP = re.compile(r"\btmp\d+\b")
_NON_AFFINE = (sympy.Min, sympy.Max, sympy.Piecewise, FloorDiv, ModularIndexing)


def _cascade_decls(mid: str, count: str, vt: str, ident: str) -> list[str]:
    """The cascade's middle level: CASCADE_FANOUT block sums are added here before the lanes."""
    return [f"{vt} {mid}[{LANES}];", f"for (int l = 0; l < {LANES}; l++) {{ {mid}[l] = {ident}; }}",
            f"int {count} = 0;"]


def _cascade_up(blk: str, mid: str, lanes: str, count: str) -> list[str]:
    return ["#pragma omp simd",
            f"for (int l = 0; l < {LANES}; l++) {{ {mid}[l] = {mid}[l] + {blk}[l]; }}",
            f"if (++{count} == {CASCADE_FANOUT})", "{",
            f"    for (int l = 0; l < {LANES}; l++) {{ {lanes}[l] = {lanes}[l] + {mid}[l]; {mid}[l] = 0; }}",
            f"    {count} = 0;", "}"]


def _cascade_flush(mid: str, lanes: str) -> list[str]:
    return [f"for (int l = 0; l < {LANES}; l++) {{ {lanes}[l] = {lanes}[l] + {mid}[l]; }}"]


@dataclass
class _Block:
    depth: int
    lines: list[str] = field(default_factory=list)
    cse: dict = field(default_factory=dict)


@dataclass
class _Reduction:
    dtype: torch.dtype
    src_dtype: torch.dtype
    rtype: str
    value: CppValue | None
    store_name: str | None = None
    store_index: sympy.Expr | None = None
    acc: str = "acc"


class CppKernel(CppOps):
    """Generates the C++ function for one FusedGroup (see the module docstring)."""

    def __init__(self, group, name: str, buffer_dtypes: dict[str, torch.dtype],
                 written_inputs: set[str] = frozenset(), in_place: set[str] = frozenset()):
        self.group = group
        self.name = name
        self.buffer_dtypes = buffer_dtypes  # every buffer name -> dtype
        self.written_inputs = set(written_inputs)  # graph inputs this kernel writes (mutations)
        # a buffer written over a buffer it reads, and that one (same storage): no __restrict__
        self.in_place = set(in_place)
        # value key -> (row name, producing node, consuming nodes) (see _plan_shared_rows)
        self.shared_rows: dict[tuple, tuple[str, int, frozenset[int]]] = {}
        self._reset()

    def _reset(self) -> None:
        """The state of one generation pass (``generate`` may run twice)."""
        self._tmp = 0
        self._ind = 0
        self.blocks: list[_Block] = []
        self.sym_depth: dict[str, int] = {}
        self.size_symbols: set[sympy.Symbol] = set()
        self.var_ranges: dict = {}
        self.reads: list[str] = []  # buffers read from memory, first-use order
        self.writes: list[str] = []  # buffers written to memory
        self.locals: dict[str, tuple[sympy.Expr, CppValue]] = {}
        self.local_buffers: set[str] = set()
        self.written_in_group: set[str] = set()
        self._reduction: _Reduction | None = None
        self._load_keys: dict[str, list] = {}
        self.cname: dict[str, str] = {}  # buffer name -> C parameter name (in_ptr0, out_ptr0, ...)
        self._node_no = 0
        self._no_simd = False  # set when the current loop has stores that forbid `omp simd`
        # while a tiled group generates: its loads (tmp -> (buffer, index)) and stores (buffer,
        # index, value, stored as is), to find plain copies (see _register_transposes)
        self._copies: tuple[dict, list] | None = None
        self.transpose_bytes: set[int] = set()  # kiln_transpose16_<bits> helpers the kernel calls
        # half -> float -> the same half (how a half copy is lowered): the narrowed tmp -> the
        # original value, and the tmps of such chains (a register transpose moves the bits)
        self._round_trips: dict[str, str] = {}
        self._round_trip_tmps: set[str] = set()
        self._widened: dict[str, CppValue] = {}
        self.stats = {"loads": 0, "stores": 0}
        self.derived: dict[str, sympy.Expr] = {}  # extra int64 args: name -> size expression
        # rows: thread-local arrays over one node's inner loop (see "rows" below): rowN hold
        # internal buffers, savedN values computed once for several nodes
        self.row_buffers: dict[str, str] = {}  # internal buffer kept in a row -> the row's name
        self.rows: dict[str, tuple[str, int]] = {}  # row name -> (C type, length)
        self._node: tuple[int, int, str] | None = None  # (node number, innermost depth, C row index)
        self._value_keys: dict[str, tuple] = {}  # tmp name -> structural key of its value
        self.inner_values: dict[int, dict[tuple, bool]] = {}  # node -> value key -> costly
        self.mode = ""  # "pointwise" | "lanes" | "mixed"

    # =========================================================================================
    # driver
    # =========================================================================================
    def generate(self) -> str:
        """The C++ function. A second pass runs when the first found costly values (``exp``)
        that a later node recomputes over the same inner loop (see ``_plan_shared_rows``)."""
        text = self._generate()
        shared = self._plan_shared_rows()
        if shared:
            rows = {row: self.rows[row] for row, _, _ in shared.values()}
            self._reset()
            self.shared_rows, self.rows = shared, rows
            text = self._generate()
        return text

    def _generate(self) -> str:
        g = self.group
        pure_pointwise = all(not n.inner for n in g.nodes) and all(n.kind == "pointwise" for n in g.nodes)
        outer_syms, self.loop_ranges, self.outer_index = self._plan_outer_loops(
            split=pure_pointwise and TILED_TRANSPOSES)
        self.var_ranges.update(zip(outer_syms, self.loop_ranges, strict=True))
        self._analyse()

        self.blocks = [_Block(0)]
        body: list[str]
        if pure_pointwise:
            self.mode = "pointwise"
            body = self._pointwise_group(outer_syms)
        elif self._lane_mode(outer_syms):
            self.mode = "lanes"
            body = self._lane_group(outer_syms)
        else:
            self.mode = "mixed"
            self._plan_row_buffers()
            body = self._mixed_group(outer_syms)
        prologue = self.blocks[0].lines
        return self._function(prologue + body)

    def _function(self, body: list[str]) -> str:
        params = []
        for name in self.arg_buffers():
            t = ctype(self.buffer_dtypes[name])
            if name in self.writes:
                restrict = "" if name in self.written_inputs | self.in_place else " __restrict__"
                params.append(f"{t}*{restrict} {self.cname[name]}")
            else:
                restrict = "" if name in self.in_place else " __restrict__"
                params.append(f"const {t}*{restrict} {self.cname[name]}")
        params += [f"const int64_t {s.name}" for s in self.arg_sizes()]
        params += [f"const int64_t {name}" for name in self.derived]
        lines = [transpose_helper(n) for n in sorted(self.transpose_bytes)]
        lines += [f'extern "C" void {self.name}({", ".join(params)})', "{"]
        lines += ["    " + ln if ln else ln for ln in body]
        lines.append("}")
        return "\n".join(lines) + "\n"

    def arg_buffers(self) -> list[str]:
        out = []
        for n in self.writes + self.reads:
            if n not in out:
                out.append(n)
        return out

    def arg_sizes(self) -> list[sympy.Symbol]:
        return sorted(self.size_symbols, key=lambda s: int(s.name[1:]))

    def arg_names(self) -> list[str]:
        """Buffers, size symbols, then derived sizes (``xnumel``) the wrapper computes."""
        return self.arg_buffers() + [s.name for s in self.arg_sizes()] + list(self.derived)

    # =========================================================================================
    # pre-pass: what is read/written, which internal buffers become locals
    # =========================================================================================
    def _deps(self, outer_index, loop_ranges: dict):
        """Per node: loopir's dependency analysis of its body at ``outer_index``."""
        out = []
        for node in self.group.nodes:
            inner_syms = [reduction_symbol(j) for j in range(len(node.inner))]
            vr = loop_ranges | dict(zip(inner_syms, node.inner, strict=True))
            out.append(body_deps(node.body, outer_index, inner_syms, var_ranges=vr))
        return out

    def _plan_outer_loops(self, split: bool = False):
        """loopir's kernel plan merges adjacent outer dims into one loop where every memory
        index stays free of division/modulo (``i1 + 8*i0`` over [n, 8] becomes ``i0`` over
        [8*n]; kiln_loopir.kernel_plan.collapse_outer_loops); with ``split`` (pure pointwise
        groups) it first splits a dim read as ``i // 64`` and ``i % 64`` into two loops.
        Returns (loop symbols, loop ranges, the outer index expressions in those symbols)."""
        ranges, index, _ = collapse_outer_loops(self.group, split=split)
        return [index_symbol(k) for k in range(len(ranges))], ranges, index

    def _analyse(self) -> None:
        g = self.group
        stores: dict[str, tuple[int, sympy.Expr]] = {}
        loads: dict[str, list[tuple[int, sympy.Expr]]] = {}
        loop_vr = {s: r for s, r in self.var_ranges.items()}
        self._node_deps = self._deps(self.outer_index, loop_vr)
        for k, deps in enumerate(self._node_deps):
            for d in deps.reads:
                loads.setdefault(d.name, []).append((k, d.index))
            for d in deps.writes:
                self.written_in_group.add(d.name)
                if d.name in stores or d.mode is not None:
                    stores[d.name] = (-1, d.index)  # written twice / accumulated: keep in memory
                else:
                    stores[d.name] = (k, d.index)
        self._stores, self._loads = stores, loads
        # the kernel plan's register buffers (written once per outer point by a reduction or a
        # node without inner loops, read back later only at that index) become locals
        self.local_buffers |= on_chip_buffers(g, self._node_deps)[0]

    # =========================================================================================
    # rows: thread-local arrays over one node's inner loop, inside the outer loop
    # =========================================================================================
    def _static_inner(self, node) -> int | None:
        n = sympy.Mul(*node.inner) if node.inner else sympy.Integer(0)
        return int(n) if n.is_Integer and 0 < int(n) <= ROW_LIMIT else None

    def _same_inner(self, a, b) -> bool:
        return len(a.inner) == len(b.inner) and all(
            statically_known_equal(x, y) for x, y in zip(a.inner, b.inner, strict=True))

    def _new_row(self, prefix: str, ctype_: str, length: int) -> str | None:
        used = sum(ROW_BYTES.get(t, 8) * n for t, n in self.rows.values())
        if used + ROW_BYTES.get(ctype_, 8) * length > ROW_BYTES_LIMIT:
            return None
        name = f"{prefix}{sum(1 for r in self.rows if r.startswith(prefix))}"
        self.rows[name] = (ctype_, length)
        return name

    def _plan_row_buffers(self) -> None:
        """An internal buffer written by a pointwise node over inner loops (an embedding sum a
        layernorm then reads) and read back only by later nodes over the same inner loop at
        the index it was stored at lives in a row: the outer point's slice, never in memory."""
        if not self.loop_ranges:
            return
        nodes = self.group.nodes
        for name in sorted(set(getattr(self.group, "internal_buffers", ()) or ())):
            if name not in self._stores or name in self.local_buffers:
                continue
            k, idx = self._stores[name]
            if k < 0 or nodes[k].kind != "pointwise" or not nodes[k].inner:
                continue
            if any(symbol_kind(s) == "ind" for s in idx.free_symbols) or self._static_inner(nodes[k]) is None:
                continue
            readers = self._loads.get(name, [])
            if all(j > k and lidx == idx and self._same_inner(nodes[j], nodes[k]) for j, lidx in readers):
                row = self._new_row("row", ctype(self.buffer_dtypes[name]), self._static_inner(nodes[k]))
                if row is not None:
                    self.row_buffers[name] = row

    def _plan_shared_rows(self) -> dict:
        """After a first pass: costly values (``expf(x - max)``) that a node computes per inner
        point and a later node over the same inner loop computes again (softmax's sum and its
        output). The first node stores them in a row, the later ones read the row."""
        if self.mode != "mixed" or not self.loop_ranges:
            return {}
        nodes = self.group.nodes
        plan: dict[tuple, tuple[str, int, set[int]]] = {}
        for j, later in enumerate(nodes):
            for key in self.inner_values.get(j, {}):
                if key in plan:
                    if self._same_inner(nodes[plan[key][1]], later):
                        plan[key][2].add(j)
                    continue
                for k in range(j):
                    first = self.inner_values.get(k, {})
                    if first.get(key) and self._same_inner(nodes[k], later) and self._static_inner(later):
                        row = self._new_row("saved", ctype(key[1]), self._static_inner(later))
                        if row is not None:
                            plan[key] = (row, k, {j})
                        break
        return {key: (row, k, frozenset(js)) for key, (row, k, js) in plan.items()}

    def _row_declarations(self) -> list[str]:
        return [f"{t} {name}[{n}];  // thread-local row" for name, (t, n) in self.rows.items()]

    def _set_node(self, number: int, inner_syms: list, inner: list) -> None:
        """The node now generating, its innermost block and its row index (inner linear index)."""
        lin = sympy.Integer(0)
        for s, r in zip(inner_syms, inner, strict=True):
            lin = lin * r + s
        self._node = (number, len(self.blocks) - 1, cexpr(lin))

    # =========================================================================================
    # loop structure
    # =========================================================================================
    def _open(self) -> _Block:
        b = _Block(len(self.blocks))
        self.blocks.append(b)
        return b

    def _close(self) -> _Block:
        return self.blocks.pop()

    def _omp_parallel(self, work: sympy.Expr, simd: bool) -> str | None:
        """The ``#pragma omp parallel for`` line for ``work`` elements (None: too little work)."""
        work = sympy.sympify(work)
        what = "parallel for simd" if simd else "parallel for"
        if work.is_Integer:
            if int(work) < PARALLEL_THRESHOLD:
                return "#pragma omp simd" if simd else None
            return f"#pragma omp {what} num_threads(kiln_num_threads)"
        return (f"#pragma omp {what} num_threads(kiln_num_threads) "
                f"if({self._c(work)} >= {PARALLEL_THRESHOLD})")

    def _c(self, expr) -> str:
        self._note_sizes(expr)
        return cexpr(expr)

    def _note_sizes(self, expr) -> None:
        for s in sympy.sympify(expr).free_symbols:
            if symbol_kind(s) == "s":
                self.size_symbols.add(s)

    def _flat_loop_header(self, syms, ranges, flat: str) -> tuple[sympy.Expr, list[str]]:
        """One loop over the product of ``ranges``; returns (trip count, lines that decode the
        flat index into ``syms`` at the top of the loop body)."""
        if len(syms) == 1:
            return ranges[0], []
        total = sympy.Mul(*ranges)
        decode = []
        stride = sympy.Integer(1)
        parts = []
        for s, r in reversed(list(zip(syms, ranges, strict=True))):
            parts.append((s, r, stride))
            stride = stride * r
        def operand(e) -> str:  # x / (s1*s2), never x / s1*s2
            return self._c(e) if sympy.sympify(e).is_Atom else f"({self._c(e)})"

        for s, r, st in reversed(parts):
            e = flat if st == 1 else f"({flat} / {operand(st)})"
            if s is not syms[0]:
                e = f"{e} % {operand(r)}"
            decode.append(f"const int64_t {s.name} = {e};")
        return total, decode

    def _pointwise_group(self, outer_syms) -> list[str]:
        ranges = self.loop_ranges
        n = len(outer_syms)
        if n == 0:
            blk = self._open()
            self._run_nodes([])
            self._close()
            return blk.lines
        if n == 1:
            s = outer_syms[0]
            self.sym_depth[s.name] = 1
            blk = self._open()
            self._run_nodes([])
            self._close()
            count = ranges[0]
            if not (count.is_Integer or count.is_Symbol):
                # a dynamic element count (s0*s1): the wrapper computes it once, as `xnumel`
                self.derived["xnumel"] = count
                count = sympy.Symbol("xnumel", integer=True, positive=True)
            bound = self._c(count)
            pragma = self._omp_parallel(count, simd=not self._no_simd)
            head = [pragma] if pragma else []
            return head + [f"for (int64_t {s} = 0; {s} < {bound}; {s}++)", "{",
                           *_indent(blk.lines), "}"]
        tiles = transposed_loops(ranges, self._node_deps) if TILED_TRANSPOSES else None
        if tiles is not None:
            return self._tiled_group(outer_syms, *tiles)
        # n >= 2: leading dims flattened into one parallel loop, the last one simd
        lead, last = outer_syms[:-1], outer_syms[-1]
        for s in lead:
            self.sym_depth[s.name] = 1
        self.sym_depth[last.name] = 2
        b1 = self._open()
        total, decode = self._flat_loop_header(lead, ranges[:-1], "x")
        b2 = self._open()
        self._run_nodes([])
        self._close()
        inner = [] if self._no_simd else ["#pragma omp simd"]
        inner += [f"for (int64_t {last} = 0; {last} < {self._c(ranges[-1])}; {last}++)", "{",
                  *_indent(b2.lines), "}"]
        self._close()
        pragma = self._omp_parallel(total * ranges[-1], simd=False)
        var = lead[0].name if len(lead) == 1 else "x"
        head = [pragma] if pragma else []
        return head + [f"for (int64_t {var} = 0; {var} < {self._c(total)}; {var}++)", "{",
                       *_indent(decode + b1.lines + inner), "}"]

    def _tiled_group(self, outer_syms, load_dim: int, store_dim: int) -> list[str]:
        """A transposing copy (loads contiguous along loop ``load_dim``, stores along
        ``store_dim``; kiln_loopir.kernel_plan.transposed_loops): both loops run in 2-D tiles
        (TILE_LOADS x TILE_STORES), the tiles and the other loops flattened into one parallel
        loop. Inside a tile the store loop is innermost (``omp simd``: whole-line stores); the
        tile's load lines stay in L1 across it, so each line is fetched once, not once per
        element."""
        ranges = self.loop_ranges
        sl, ss = outer_syms[load_dim], outer_syms[store_dim]
        tile_syms = {k: sympy.Symbol(f"{outer_syms[k]}_tile", integer=True, nonnegative=True)
                     for k in (load_dim, store_dim)}
        flat = [tile_syms.get(k, s) for k, s in enumerate(outer_syms)]
        tile = {load_dim: TILE_LOADS, store_dim: TILE_STORES}
        flat_ranges = [FloorDiv(ranges[k] + (tile[k] - 1), tile[k]) if k in tile else r
                       for k, r in enumerate(ranges)]
        for s in outer_syms:
            self.sym_depth[s.name] = 1
        self.sym_depth[sl.name], self.sym_depth[ss.name] = 2, 3
        b1 = self._open()
        total, decode = self._flat_loop_header(flat, flat_ranges, "x")
        b2 = self._open()
        b3 = self._open()
        self._no_simd = False
        self._copies = ({}, [])
        self._run_nodes([])
        copies, self._copies = self._copies, None
        self._close()
        self._close()
        self._close()
        bounds = []
        for k in (load_dim, store_dim):
            s, t = outer_syms[k], tile_syms[k]
            bounds += [f"const int64_t {s}_begin = {t} * {tile[k]};",
                       f"const int64_t {s}_end = {s}_begin + {tile[k]} < {self._c(ranges[k])} ? "
                       f"{s}_begin + {tile[k]} : {self._c(ranges[k])};"]
        simd = [] if self._no_simd else ["#pragma omp simd"]

        def nest(end_l: str, end_s: str) -> list[str]:
            return [f"for (int64_t {sl} = {sl}_begin; {sl} < {end_l}; {sl}++)", "{",
                    *_indent(b2.lines + simd + [
                        f"for (int64_t {ss} = {ss}_begin; {ss} < {end_s}; {ss}++)", "{",
                        *_indent(b3.lines), "}"]), "}"]

        # full tiles with constant trip counts, edge tiles with bounds (each only where the
        # static sizes say it can happen)
        static = {k: int(ranges[k]) for k in tile if ranges[k].is_Integer}
        only_full = len(static) == 2 and all(static[k] % tile[k] == 0 for k in tile)
        only_edge = any(static[k] < tile[k] for k in static)
        edge = nest(f"{sl}_end", f"{ss}_end")
        if only_edge:
            tiles = edge
        else:
            full = (self._register_transposes(copies, b1.lines + b2.lines + b3.lines, sl, ss,
                                              tile[load_dim], tile[store_dim])
                    or nest(f"{sl}_begin + {tile[load_dim]}", f"{ss}_begin + {tile[store_dim]}"))
            tiles = full if only_full else [
                f"if ({sl}_end - {sl}_begin == {tile[load_dim]} && "
                f"{ss}_end - {ss}_begin == {tile[store_dim]})",
                "{", *_indent(full), "}", "else", "{", *_indent(edge), "}"]
        body = decode + bounds + b1.lines + tiles
        pragma = self._omp_parallel(sympy.Mul(*ranges), simd=False)
        head = [f"// tiled transpose: {TILE_LOADS}x{TILE_STORES} tiles of {sl} (loads) x {ss} (stores)"]
        head += [pragma] if pragma else []
        return head + [f"for (int64_t x = 0; x < {self._c(total)}; x++)", "{",
                       *_indent(body), "}"]

    def _register_transposes(self, copies, lines, sl, ss, tile_l: int, tile_s: int) -> list[str] | None:
        """A full tile of a group whose nodes only copy (each store writes a value loaded as is,
        2- or 4-byte elements): each transposed copy as 16x16 blocks transposed in registers
        (``kiln_transpose16_<bits>``, prelude.transpose_helper: vector loads along the load
        loop, vector stores along the store loop; no gathers, which 16-bit types lack), each
        straight copy as a vector loop. None for anything else (the generic tile loop)."""
        loads, stores = copies
        statements = [ln for ln in lines if ln.startswith("const ")
                      and ln.split(" = ")[0].split()[-1] not in self._round_trip_tmps]
        if len(statements) != len(loads) or not stores:
            return None  # some statement computes (or hoists an address): not a plain copy
        if tile_l % 16 or tile_s % 16:
            return None
        syms = [sl, ss]
        blocks, straight = [], []
        at = {sl: sympy.Symbol(f"{sl}_begin") + sympy.Symbol("tl"),
              ss: sympy.Symbol(f"{ss}_begin") + sympy.Symbol("ts")}
        for name, index, value, plain in stores:
            value = self._round_trips.get(value, value)
            if not plain or value not in loads:
                return None
            src, src_index = loads[value]
            nbytes = ROW_BYTES.get(ctype(self.buffer_dtypes[name]), 0)
            if src in self.written_in_group or name in self.written_inputs or nbytes not in TRANSPOSE_WORDS:
                return None
            if any(symbol_kind(x) not in ("i", "s") for x in src_index.free_symbols):
                return None
            ls, st = access_strides(src_index, syms), access_strides(index, syms)
            dst, src_c = self._cname(name), self._cname(src)
            if ls[ss] == 1:
                straight.append(f"{dst}[{self._c(index)}] = {src_c}[{self._c(src_index)}];")
            elif ls[sl] == 1 and ls[ss] is not None and ls[ss] != 0 and st[sl] is not None:
                self.transpose_bytes.add(nbytes)
                blocks.append(f"kiln_transpose16_{nbytes * 8}(&{src_c}[{self._c(src_index.xreplace(at))}], "
                              f"{self._c(ls[ss])}, &{dst}[{self._c(index.xreplace(at))}], {self._c(st[sl])});")
            else:
                return None
        code = [f"// register transposes: 16x16 blocks of {sl} x {ss}"]
        if blocks:
            code += [f"for (int64_t tl = 0; tl < {tile_l}; tl += 16)", "{",
                     f"    for (int64_t ts = 0; ts < {tile_s}; ts += 16)", "    {",
                     *_indent(blocks, 2), "    }", "}"]
        if straight:
            code += [f"for (int64_t {sl} = {sl}_begin; {sl} < {sl}_begin + {tile_l}; {sl}++)",
                     "{", "    #pragma omp simd",
                     f"    for (int64_t {ss} = {ss}_begin; {ss} < {ss}_begin + {tile_s}; {ss}++)",
                     "    {", *_indent(straight, 2), "    }", "}"]
        return code

    def _mixed_group(self, outer_syms) -> list[str]:
        g = self.group
        outer_index = self.outer_index
        for s in outer_syms:
            self.sym_depth[s.name] = 1
        b1 = self._open()
        for number, node in enumerate(g.nodes):
            self._node_index = number
            if node.kind == "reduction":
                b1.lines += self._reduction_node(node, outer_index)
            elif node.inner:
                b1.lines += self._pointwise_node(node, outer_index)
            else:
                b1.lines.append(f"// node {self._node_no}: pointwise")
                self._node_no += 1
                self._run_body(node, outer_index, [])
        self._close()
        b1.lines[:0] = self._row_declarations()
        if not outer_syms:
            return b1.lines
        total, decode = self._flat_loop_header(outer_syms, self.loop_ranges, "x")
        work = total * max((sympy.Mul(*n.inner) for n in g.nodes if n.inner),
                           key=lambda e: 0 if not e.is_Integer else int(e), default=1)
        pragma = self._omp_parallel(work, simd=False)
        var = outer_syms[0].name if len(outer_syms) == 1 else "x"
        head = [pragma] if pragma else []
        return head + [f"for (int64_t {var} = 0; {var} < {self._c(total)}; {var}++)", "{",
                       *_indent(decode + b1.lines), "}"]

    # =========================================================================================
    # lane mode: vectorize across the innermost outer dim (reductions over non-last dims)
    # =========================================================================================
    def _lane_mode(self, outer_syms) -> bool:
        """True when the group's reductions read memory contiguously along the innermost OUTER
        dim rather than along their innermost reduction dim (``x.sum(0)`` of a row-major
        matrix): then LANES consecutive outer points are computed together, each reduction
        keeping one accumulator per lane, so every row access is one contiguous vector."""
        if not outer_syms:
            return False
        nodes = self.group.nodes
        if any(n.kind == "reduction" and not n.inner for n in nodes):
            return False
        if any(n.reduction_type in WELFORD_TYPES for n in nodes):  # scalar rows only
            return False
        last = outer_syms[-1]
        score = 0
        for node, deps in zip(nodes, self._node_deps, strict=True):
            if node.kind != "reduction":
                continue
            r_last = reduction_symbol(len(node.inner) - 1)
            for d in deps.reads:
                if r_last not in d.index.free_symbols:
                    continue
                if _stride(d.index, r_last) == 1:
                    score -= 1
                elif _stride(d.index, last) == 1:
                    score += 1
        return score > 0

    def _lane_group(self, outer_syms) -> list[str]:
        lead, last = outer_syms[:-1], outer_syms[-1]
        ranges = self.loop_ranges
        for s in lead:
            self.sym_depth[s.name] = 1
        b1 = self._open()
        for node in self.group.nodes:
            b1.lines += self._lane_node(node, last)
        self._close()
        n_last = self._c(ranges[-1])
        chunks = FloorDiv(ranges[-1] + (LANES - 1), LANES)
        flat_syms = lead + [sympy.Symbol("xc", integer=True, nonnegative=True)]
        total, decode = self._flat_loop_header(flat_syms, list(ranges[:-1]) + [chunks], "x")
        var = "xc" if not lead else "x"
        decode = decode + [f"const int64_t xb = xc * {LANES};"]
        # full chunks run with a constant lane count (registers, no remainder checks); the
        # last, partial chunk with nl < LANES lanes
        full = [ln.replace(_NL, str(LANES)) for ln in b1.lines]
        part = [ln.replace(_NL, "nl") for ln in b1.lines]
        body = decode + [f"if (xb + {LANES} <= {n_last})", "{", *_indent(full), "}", "else", "{",
                         *_indent([f"const int64_t nl = {n_last} - xb;", *part]), "}"]
        work = total * LANES * max((sympy.Mul(*n.inner) for n in self.group.nodes if n.inner),
                                   key=lambda e: 0 if not e.is_Integer else int(e), default=1)
        pragma = self._omp_parallel(work, simd=False)
        head = [f"// lanes: {LANES} consecutive {last} per iteration"] + ([pragma] if pragma else [])
        return head + [f"for (int64_t {var} = 0; {var} < {self._c(total)}; {var}++)", "{",
                       *_indent(body), "}"]

    def _lane_node(self, node, last) -> list[str]:
        inner_syms, blocks = self._open_inner_loops(node)
        self.sym_depth[last.name] = len(self.blocks)  # the lane loop, inside the inner ones
        blocks.append(self._open())
        self._reduction = None
        self._no_simd = False
        self._run_body(node, self.outer_index, inner_syms)
        red, self._reduction = self._reduction, None
        no_simd = self._no_simd
        for _ in blocks:
            self._close()
        for s in inner_syms:
            self.var_ranges.pop(s, None)
        node_no = self._node_no
        self._node_no += 1
        simd = [] if no_simd else ["#pragma omp simd"]

        def lane_loop(lines):
            return simd + [f"for (int64_t l = 0; l < {_NL}; l++)", "{",
                           *_indent([f"const int64_t {last} = xb + l;", *lines]), "}"]

        def wrap(code):
            for j in reversed(range(len(inner_syms))):
                s = inner_syms[j]
                code = [f"for (int64_t {s} = 0; {s} < {self._c(node.inner[j])}; {s}++)", "{",
                        *_indent(blocks[j].lines + code), "}"]
            return code

        lane_lines = blocks[-1].lines
        if node.kind != "reduction":
            return [f"// node {node_no}: pointwise", *wrap(lane_loop(lane_lines))]
        if red is None or red.store_name is None:
            raise ValueError(f"reduction node {node.buffer.name}: body did not call "
                             "ops.reduction + ops.store_reduction")
        rtype, arg = red.rtype, red.rtype in ("argmax", "argmin")
        val_dtype = red.src_dtype if arg else red.dtype
        vt = ctype(val_dtype) if val_dtype not in HALF else "float"
        acc = red.acc = f"acc{node_no}"
        ident = c_literal(reduction_identity(rtype, val_dtype), val_dtype)
        value = self._as_compute(red.value, val_dtype)
        if arg:
            lin = sympy.Integer(0)
            for s, r in zip(inner_syms, node.inner, strict=True):
                lin = lin * r + s
            update = [f"const bool take = kiln_{rtype}_take({value}, {acc}[l]);",
                      f"{acc}[l] = take ? {value} : {acc}[l];",
                      f"{acc}_idx[l] = take ? (int64_t)({self._c(lin)}) : {acc}_idx[l];"]
        else:
            update = [f"{acc}[l] = {self._combine(rtype, f'{acc}[l]', value, val_dtype)};"]
        decl = [f"// node {node_no}: {rtype} over [{', '.join(self._c(r) for r in node.inner)}], "
                f"{LANES} lanes of {last}",
                f"{vt} {acc}[{LANES}];"]
        init = f"{acc}[l] = {ident};"
        if arg:
            decl.append(f"int64_t {acc}_idx[{LANES}];")
            init += f" {acc}_idx[l] = 0;"
        decl.append(f"for (int l = 0; l < {LANES}; l++) {{ {init} }}")
        if CASCADE and rtype == "sum" and vt == "float":
            code = decl + self._lane_cascade(node, inner_syms, blocks, acc, vt, ident,
                                             lane_loop(lane_lines + [u.replace(f"{acc}[l]", f"{acc}_blk[l]")
                                                                     for u in update]))
        else:
            code = decl + wrap(lane_loop(lane_lines + update))
        result, rdtype = (f"{acc}_idx[l]", torch.int64) if arg else (f"{acc}[l]", red.dtype)
        if rdtype in HALF:
            rdtype = torch.float32
        out_dtype = self.buffer_dtypes[red.store_name]
        conv = self._convert_expr(result, rdtype, out_dtype)
        if red.store_name in self.local_buffers:
            self.locals[red.store_name] = (red.store_index, CppValue(conv, out_dtype, 1 << 30))
            return code
        ptr = self._note_write(red.store_name)
        self._forget_loads(red.store_name)
        self.stats["stores"] += 1
        return code + lane_loop([f"{ptr}[{self._c(red.store_index)}] = {conv};"])

    def _lane_cascade(self, node, inner_syms, blocks, acc, vt, ident, lanes) -> list[str]:
        """A lane-mode sum's loops with the outermost reduction dim cut into blocks of about
        CASCADE_BLOCK / LANES additions per lane, each summed apart, then added to the lanes."""
        code = lanes
        for j in reversed(range(1, len(inner_syms))):
            s = inner_syms[j]
            code = [f"for (int64_t {s} = 0; {s} < {self._c(node.inner[j])}; {s}++)", "{",
                    *_indent(blocks[j].lines + code), "}"]
        per = sympy.Mul(*node.inner[1:])
        step = max(1, (CASCADE_BLOCK // LANES) // int(per)) if per.is_Integer else 1
        r0, n0 = inner_syms[0], self._c(node.inner[0])
        return [*_cascade_decls(f"{acc}_mid", f"{acc}_nblk", vt, ident),
                f"for (int64_t {r0}_blk = 0; {r0}_blk < {n0}; {r0}_blk += {step})", "{",
                *_indent([f"{vt} {acc}_blk[{LANES}];",
                          f"for (int l = 0; l < {LANES}; l++) {{ {acc}_blk[l] = {ident}; }}",
                          f"const int64_t {r0}_bend = {r0}_blk + {step} < {n0} ? {r0}_blk + {step} : {n0};",
                          f"for (int64_t {r0} = {r0}_blk; {r0} < {r0}_bend; {r0}++)", "{",
                          *_indent(blocks[0].lines + code), "}",
                          *_cascade_up(f"{acc}_blk", f"{acc}_mid", acc, f"{acc}_nblk")]),
                "}", *_cascade_flush(f"{acc}_mid", acc)]

    def _run_nodes(self, inner_index) -> None:
        for node in self.group.nodes:
            self.blocks[-1].lines.append(f"// node {self._node_no}: pointwise")
            self._node_no += 1
            self._run_body(node, self.outer_index, inner_index)

    def _run_body(self, node, outer_syms, inner_syms) -> None:
        with set_ops_handler(self):
            node.body(outer_syms, inner_syms)

    def _open_inner_loops(self, node) -> tuple[list, list]:
        """A node's inner loop variables (``r0, r1, ...``) with their ranges and nesting depth
        registered, and one open block per loop for the body's lines."""
        inner_syms = [reduction_symbol(j) for j in range(len(node.inner))]
        base = len(self.blocks)
        for j, s in enumerate(inner_syms):
            self.sym_depth[s.name] = base + j
            self.var_ranges[s] = node.inner[j]
            self._note_sizes(node.inner[j])
        return inner_syms, [self._open() for _ in inner_syms]

    def _pointwise_node(self, node, outer_syms) -> list[str]:
        """A pointwise node with its own inner loops (innermost: omp simd)."""
        inner_syms, blocks = self._open_inner_loops(node)
        self._no_simd = False
        self._set_node(self._node_index, inner_syms, node.inner)
        self._run_body(node, outer_syms, inner_syms)
        self._node = None
        no_simd = self._no_simd
        for _ in inner_syms:
            self._close()
        code: list[str] = []
        n = len(inner_syms)
        for j in reversed(range(n)):
            s = inner_syms[j]
            simd = j == n - 1 and not no_simd
            pragma = ["#pragma omp simd"] if simd else []
            if j == 0 and not self.loop_ranges:  # no outer loop: the threads split this one
                p = self._omp_parallel(sympy.Mul(*node.inner), simd=simd)
                pragma = [p] if p else pragma
            code = pragma + [f"for (int64_t {s} = 0; {s} < {self._c(node.inner[j])}; {s}++)", "{",
                             *_indent(blocks[j].lines + code), "}"]
        for s in inner_syms:
            self.var_ranges.pop(s, None)
        node_no = self._node_no
        self._node_no += 1
        return [f"// node {node_no}: pointwise over [{', '.join(self._c(r) for r in node.inner)}]", *code]

    # =========================================================================================
    # reductions
    # =========================================================================================
    def _reduction_node(self, node, outer_syms) -> list[str]:
        inner_syms, blocks = self._open_inner_loops(node)
        self._reduction = None
        if inner_syms:
            self._set_node(self._node_index, inner_syms, node.inner)
        self._run_body(node, outer_syms, inner_syms)
        self._node = None
        red = self._reduction
        self._reduction = None
        node_no = self._node_no
        self._node_no += 1
        for _ in inner_syms:
            self._close()
        for s in inner_syms:
            self.var_ranges.pop(s, None)
        if red is None or red.store_name is None:
            raise ValueError(f"reduction node {node.buffer.name}: body did not call "
                             "ops.reduction + ops.store_reduction")
        if not inner_syms:  # a reduction over nothing: the value itself
            red.acc = f"acc{node_no}"
            if red.rtype == "welford_m2":
                return self._store_reduction_result(red, "0", red.dtype, [])
            return self._store_reduction_result(red, red.value.expr, red.value.dtype, [])
        if red.rtype in WELFORD_TYPES:
            return self._welford_node(node, red, inner_syms, blocks, node_no)

        acc_dtype = red.dtype
        rtype = red.rtype
        arg = rtype in ("argmax", "argmin")
        val_dtype = red.src_dtype if arg else acc_dtype
        vt = ctype(val_dtype) if val_dtype not in HALF else "float"
        acc = red.acc = f"acc{node_no}"
        ident = c_literal(reduction_identity(rtype, val_dtype), val_dtype)
        value = self._as_compute(red.value, val_dtype)

        # the linear reduction index (argmax/argmin)
        lin = sympy.Integer(0)
        for s, r in zip(inner_syms, node.inner, strict=True):
            lin = lin * r + s
        lin_c = self._c(lin)

        def update(a: str, ai: str | None) -> list[str]:
            if arg:
                return [f"{{ const bool take = kiln_{rtype}_take({value}, {a});",
                        f"  {a} = take ? {value} : {a};",
                        f"  {ai} = take ? (int64_t)({lin_c}) : {ai}; }}"]
            return [f"{a} = {self._combine(rtype, a, value, val_dtype)};"]

        last = len(inner_syms) - 1
        rl, rs = inner_syms[last], node.inner[last]
        r_c = self._c(rs)
        small = rs.is_Integer and int(rs) < 2 * LANES
        # a row that fits one block needs no cascade level of its own
        # (float32 and half; float64 sums of float data, batch norm's statistics, need none)
        cascade = (CASCADE and rtype == "sum" and vt == "float" and not small
                   and not (rs.is_Integer and int(rs) <= CASCADE_BLOCK and last == 0))
        # with no outer loop (x.sum()), the threads split the outermost reduction dim, each
        # keeping its own accumulators, combined in thread order afterwards (deterministic)
        work = sympy.Mul(*node.inner)
        parallel = not self.loop_ranges and not (work.is_Integer and int(work) < PARALLEL_THRESHOLD)
        a = f"{acc}_t" if parallel else acc  # the accumulator the loops update
        ai = f"{a}_idx" if arg else None

        def acc_decls(name: str) -> list[str]:
            out = [f"{vt} {name} = {ident};"]
            if arg:
                out.append(f"int64_t {name}_idx = 0;")
            return out

        lanes = [] if small else [
            f"{vt} {a}_lanes[{LANES}];", *([f"int64_t {a}_lanes_idx[{LANES}];"] if arg else []),
            f"for (int l = 0; l < {LANES}; l++) {{ {a}_lanes[l] = {ident};"
            + (f" {a}_lanes_idx[l] = 0;" if arg else "") + " }"]
        if cascade:
            lanes += _cascade_decls(f"{a}_mid", f"{a}_nblk", vt, ident)
        body_lines = blocks[last].lines
        # innermost reduction dim: LANES accumulators over full chunks + a scalar tail
        if small:
            chunks: list[str] = []
            tail = [f"for (int64_t {rl} = 0; {rl} < {r_c}; {rl}++)", "{",
                    *_indent(body_lines + update(a, ai)), "}"]
        elif cascade:
            vend, blk, bend = f"{acc}_vend", f"{a}_blk", f"{rl}_bend"
            chunks = [f"for (int64_t {rl}_blk = 0; {rl}_blk < {vend}; {rl}_blk += {CASCADE_BLOCK})", "{",
                      f"    {vt} {blk}[{LANES}];",
                      f"    for (int l = 0; l < {LANES}; l++) {{ {blk}[l] = {ident}; }}",
                      f"    const int64_t {bend} = {rl}_blk + {CASCADE_BLOCK} < {vend} ? "
                      f"{rl}_blk + {CASCADE_BLOCK} : {vend};",
                      f"    for (int64_t {rl}_base = {rl}_blk; {rl}_base < {bend}; {rl}_base += {LANES})",
                      "    {",
                      "        #pragma omp simd",
                      f"        for (int64_t l = 0; l < {LANES}; l++)", "        {",
                      f"            const int64_t {rl} = {rl}_base + l;",
                      *_indent(body_lines + update(f"{blk}[l]", None), 3),
                      "        }", "    }",
                      *_indent(_cascade_up(blk, f"{a}_mid", f"{a}_lanes", f"{a}_nblk")),
                      "}"]
            tail = [f"for (int64_t {rl} = {vend}; {rl} < {r_c}; {rl}++)", "{",
                    *_indent(body_lines + update(a, ai)), "}"]
        else:
            vend = f"{acc}_vend"
            chunks = [f"for (int64_t {rl}_base = 0; {rl}_base < {vend}; {rl}_base += {LANES})", "{",
                      "    #pragma omp simd",
                      f"    for (int64_t l = 0; l < {LANES}; l++)", "    {",
                      f"        const int64_t {rl} = {rl}_base + l;",
                      *_indent(body_lines + update(f"{a}_lanes[l]", f"{a}_lanes_idx[l]" if arg else None), 2),
                      "    }", "}"]
            tail = [f"for (int64_t {rl} = {vend}; {rl} < {r_c}; {rl}++)", "{",
                    *_indent(body_lines + update(a, ai)), "}"]
        vend_decl = [] if small else [f"const int64_t {acc}_vend = ({r_c}) - (({r_c}) % {LANES});"]
        omp_for = ["#pragma omp for schedule(static)"] if parallel else []
        shared: list[str] = []  # declared before the parallel region
        if last == 0:
            # one reduction dim: in parallel, the threads share the chunks; the tail runs after
            if parallel:
                shared, loops, after = vend_decl, omp_for + chunks, tail
            else:
                loops, after = vend_decl + chunks + tail, []
        else:
            code = vend_decl + chunks + tail
            for j in reversed(range(last)):
                sj = inner_syms[j]
                code = ([f"for (int64_t {sj} = 0; {sj} < {self._c(node.inner[j])}; {sj}++)", "{",
                         *_indent(blocks[j].lines + code), "}"])
            loops = omp_for + code if parallel else code
            after = []
        combine = _cascade_flush(f"{a}_mid", f"{a}_lanes") if cascade else []
        if not small:
            if arg:
                combine.append(
                    f"for (int l = 0; l < {LANES}; l++) {{ if (kiln_{rtype}_better({a}_lanes[l], "
                    f"{a}_lanes_idx[l], {a}, {a}_idx)) {{ {a} = {a}_lanes[l]; "
                    f"{a}_idx = {a}_lanes_idx[l]; }} }}")
            else:
                combine.append(f"for (int l = 0; l < {LANES}; l++) {{ {a} = "
                               f"{self._combine(rtype, a, f'{a}_lanes[l]', val_dtype)}; }}")
        head = [f"// node {node_no}: {rtype} over [{', '.join(self._c(r) for r in node.inner)}]"
                + (" (threads split the reduction)" if parallel else "")]
        if parallel:
            nt = "kiln_num_threads < KILN_MAX_THREADS ? kiln_num_threads : KILN_MAX_THREADS"
            cond = "" if work.is_Integer else f" if({self._c(work)} >= {PARALLEL_THRESHOLD})"
            parts = [f"{vt} {acc}_parts[KILN_MAX_THREADS];",
                     *([f"int64_t {acc}_parts_idx[KILN_MAX_THREADS];"] if arg else []),
                     f"for (int t = 0; t < KILN_MAX_THREADS; t++) {{ {acc}_parts[t] = {ident};"
                     + (f" {acc}_parts_idx[t] = 0;" if arg else "") + " }"]
            publish = [f"{acc}_parts[omp_get_thread_num()] = {a};"]
            if arg:
                publish.append(f"{acc}_parts_idx[omp_get_thread_num()] = {a}_idx;")
            region = [f"#pragma omp parallel num_threads({nt}){cond}", "{",
                      *_indent(acc_decls(a) + lanes + loops + combine + publish), "}"]
            if arg:
                gather = [f"for (int t = 0; t < KILN_MAX_THREADS; t++) {{ if (kiln_{rtype}_better("
                          f"{acc}_parts[t], {acc}_parts_idx[t], {acc}, {acc}_idx)) {{ "
                          f"{acc} = {acc}_parts[t]; {acc}_idx = {acc}_parts_idx[t]; }} }}"]
            else:
                gather = [f"for (int t = 0; t < KILN_MAX_THREADS; t++) {{ {acc} = "
                          f"{self._combine(rtype, acc, f'{acc}_parts[t]', val_dtype)}; }}"]
            # the tail after the region updates `a` = acc_t: alias it to the final accumulator
            after = [ln.replace(f"{a}_idx", f"{acc}_idx").replace(a, acc) for ln in after]
            lines = head + acc_decls(acc) + shared + parts + region + gather + after
        else:
            lines = head + acc_decls(acc) + lanes + loops + combine
        result, result_dtype = (f"{acc}_idx", torch.int64) if arg else (acc, acc_dtype)
        if result_dtype in HALF:
            result_dtype = torch.float32
        return lines + self._store_reduction_result(red, result, result_dtype, [])

    def _welford_node(self, node, red: _Reduction, inner_syms, blocks, node_no: int) -> list[str]:
        """welford_mean / welford_m2: one pass of Welford's update over the row (scalar, one
        thread per row: no lanes, no split of the row across threads)."""
        vt = ctype(red.dtype) if red.dtype not in HALF else "float"
        acc = red.acc = f"acc{node_no}"
        value = self._as_compute(red.value, red.dtype)
        update = [f"{{ const {vt} v = {value}; {acc}_n += 1;",
                  f"  const {vt} d = v - {acc}_mean; {acc}_mean += d / ({vt}){acc}_n;",
                  f"  {acc}_m2 += d * (v - {acc}_mean); }}"]
        code = blocks[-1].lines + update
        for j in reversed(range(len(inner_syms))):
            s = inner_syms[j]
            code = [f"for (int64_t {s} = 0; {s} < {self._c(node.inner[j])}; {s}++)", "{",
                    *_indent((blocks[j].lines if j < len(inner_syms) - 1 else []) + code), "}"]
        head = [f"// node {node_no}: {red.rtype} over [{', '.join(self._c(r) for r in node.inner)}]",
                f"{vt} {acc}_mean = 0; {vt} {acc}_m2 = 0; int64_t {acc}_n = 0;"]
        result = f"({acc}_n == 0 ? ({vt})NAN : {acc}_mean)" if red.rtype == "welford_mean" else f"{acc}_m2"
        rdtype = torch.float32 if red.dtype in HALF else red.dtype
        return self._store_reduction_result(red, result, rdtype, head + code)

    def _combine(self, rtype: str, a: str, b: str, dtype: torch.dtype) -> str:
        if rtype not in _COMBINE:
            raise MissingOpError(f"reduction {rtype!r}", self)
        return _COMBINE[rtype].format(a=a, b=b)

    def _as_compute(self, v: CppValue, dtype: torch.dtype) -> str:
        """``v`` as a C expression of ``dtype``'s compute type (half -> float)."""
        if v.dtype in HALF:
            f = _to_float(v.expr, v.dtype)
            return f if dtype in HALF or dtype == torch.float32 else f"(({ctype(dtype)}){f})"
        t = "float" if dtype in HALF else ctype(dtype)
        if v.dtype == dtype or (dtype in HALF and v.dtype == torch.float32):
            return v.expr
        return f"(({t}){v.expr})"

    def _store_reduction_result(self, red: _Reduction, expr: str, dtype: torch.dtype,
                                lines: list[str]) -> list[str]:
        name, index = red.store_name, red.store_index
        out_dtype = self.buffer_dtypes[name]
        conv = self._convert_expr(expr, dtype, out_dtype)
        if name in self.local_buffers:
            var = f"{red.acc}_result"
            self.locals[name] = (index, CppValue(var, out_dtype, len(self.blocks) - 1))
            return lines + [f"const {ctype(out_dtype)} {var} = {conv};"]
        ptr = self._note_write(name)
        self._forget_loads(name)
        self.stats["stores"] += 1
        return lines + [f"{ptr}[{self._c(index)}] = {conv};"]

    # =========================================================================================
    # emission helpers
    # =========================================================================================
    def _depth_of_index(self, index: sympy.Expr) -> int:
        d = 0
        for s in index.free_symbols:
            kind = symbol_kind(s)
            if kind == "s":
                self.size_symbols.add(s)
                continue
            if s.name not in self.sym_depth:
                raise ValueError(f"kernel {self.name}: index uses unknown symbol {s}")
            d = max(d, self.sym_depth[s.name])
        return d

    def _emit(self, expr: str, dtype: torch.dtype, deps, min_depth: int = 0, cse: bool = True) -> CppValue:
        depth = max([min_depth] + [d.depth for d in deps if isinstance(d, CppValue)])
        depth = min(depth, len(self.blocks) - 1)
        blk = self.blocks[depth]
        key = (expr, dtype)
        if cse and key in blk.cse:
            return blk.cse[key]
        name = f"tmp{self._tmp}"
        self._tmp += 1
        value_key = self._value_key(expr, dtype)
        node = self._node
        innermost = node is not None and depth == node[1]
        shared = self.shared_rows.get(value_key) if innermost else None
        if shared is not None and node[0] in shared[2]:  # computed by an earlier node: read its row
            blk.lines.append(f"const {ctype(dtype)} {name} = {shared[0]}[{node[2]}];")
        else:
            blk.lines.append(f"const {ctype(dtype)} {name} = {expr};")
            if shared is not None and node[0] == shared[1]:  # keep it for the later nodes
                blk.lines.append(f"{shared[0]}[{node[2]}] = {name};")
        self._value_keys[name] = value_key
        if innermost:
            self.inner_values.setdefault(node[0], {})[value_key] = bool(_COSTLY_CALL.search(expr))
        v = CppValue(name, dtype, depth)
        if cse:
            blk.cse[key] = v
        return v

    def _value_key(self, expr: str, dtype: torch.dtype) -> tuple:
        """What a statement computes, independent of tmp names: (the expression with its tmp
        operands as ``{}``, dtype, the operands' keys). Equal keys at one (outer, inner) point
        are equal values: loads read buffers no later node writes."""
        operands: list = []

        def operand(m):
            operands.append(self._value_keys.get(m.group(), m.group()))
            return "{}"

        return (_TMP.sub(operand, expr), dtype, *operands)

    def _note_read(self, name: str) -> str:
        if name not in self.reads:
            self.reads.append(name)
        return self._cname(name)

    def _note_write(self, name: str) -> str:
        if name not in self.writes:
            self.writes.append(name)
        return self._cname(name)

    def _cname(self, name: str) -> str:
        """Kernel sources name buffers by role and order, never by graph buffer name, so equal
        kernels of different graphs (or layers) have equal sources and share one compile."""
        c = self.cname.get(name)
        if c is None:
            prefix = "out_ptr" if name in self.written_in_group else "in_ptr"
            c = f"{prefix}{sum(1 for v in self.cname.values() if v.startswith(prefix))}"
            self.cname[name] = c
        return c

    def _index(self, index) -> sympy.Expr:
        return simplify_index(sympy.sympify(index), self.var_ranges)

    def _convert_expr(self, expr: str, src: torch.dtype, dst: torch.dtype) -> str:
        if src == dst:
            return expr
        if dst == torch.bool:
            if src in HALF:
                return f"({_to_float(expr, src)} != 0.0f)"
            return f"({expr} != 0)"
        if src in HALF:
            expr, src = _to_float(expr, src), torch.float32
            if dst == torch.float32:
                return expr
        if dst in HALF:
            if src != torch.float32:
                expr = f"((float){expr})"
            return _from_float(expr, dst)
        t = ctype(dst)
        if src.is_floating_point and not dst.is_floating_point and dst not in (torch.int64, torch.int32, torch.uint64, torch.uint32):
            return f"(({t})(int64_t){expr})"  # narrow ints wrap like torch's conversions
        return f"(({t}){expr})"

    # =========================================================================================
    # the ops handler: memory and indexing
    # =========================================================================================
    def load(self, name: str, index) -> CppValue:
        index = self._index(index)
        if name in self.locals and self.locals[name][0] == index:
            return self.locals[name][1]
        dtype = self.buffer_dtypes[name]
        if name in self.row_buffers and self._node is not None:
            return self._emit(f"{self.row_buffers[name]}[{self._node[2]}]", dtype, [],
                              min_depth=len(self.blocks) - 1)
        depth = self._depth_of_index(index)
        if name in self.written_in_group:
            depth = len(self.blocks) - 1  # never hoist above the loop that writes it
        ptr = self._note_read(name)
        self.stats["loads"] += 1
        expr = f"{ptr}[{self._address(index)}]"
        v = self._emit(expr, dtype, [], min_depth=depth)
        self._load_keys.setdefault(name, []).append((v.depth, (expr, dtype)))
        if self._copies is not None:
            self._copies[0][v.expr] = (name, index)
        return v

    def _address(self, index: sympy.Expr) -> str:
        """C text of a load/store index. A non-affine part (the clamps of a pooling window, cat,
        pad) that does not change in the innermost loop around the access is computed once
        outside it: GCC vectorizes a loop only when it sees its addresses as affine."""
        if not index.has(*_NON_AFFINE):
            return self._c(index)
        depth = self._depth_of_index(index)
        inner = {s for s in index.free_symbols if self.sym_depth.get(s.name) == depth and depth > 0}
        variant, invariant = [], []
        for term in sympy.Add.make_args(index):
            (variant if term.free_symbols & inner else invariant).append(term)
        base = sympy.Add(*invariant)
        if not variant or not base.has(*_NON_AFFINE):
            return self._c(index)
        hoisted = self._emit(self._c(base), torch.int64, [], min_depth=self._depth_of_index(base))
        return f"{self._c(sympy.Add(*variant))} + {hoisted}"

    def _forget_loads(self, name: str) -> None:
        """A store to ``name``: earlier loads of it must not be reused by CSE."""
        for depth, key in self._load_keys.pop(name, []):
            if depth < len(self.blocks):
                self.blocks[depth].cse.pop(key, None)

    def store(self, name: str, index, value, mode=None) -> None:
        index = self._index(index)
        value = self._value(value)
        dtype = self.buffer_dtypes[name]
        expr = self._convert_expr(value.expr, value.dtype, dtype)
        if any(symbol_kind(s) == "ind" for s in index.free_symbols):
            self._no_simd = True  # a scatter: lanes may collide
        if self._copies is not None:
            plain = mode is None and expr == value.expr and name not in self.local_buffers \
                and name not in self.row_buffers
            self._copies[1].append((name, index, value.expr, plain))
        if name in self.local_buffers and mode is None:
            self.locals[name] = (index, self._value(value) if value.dtype == dtype
                                 else self._emit(expr, dtype, [value]))
            return
        if name in self.row_buffers and mode is None and self._node is not None:
            self.blocks[-1].lines.append(f"{self.row_buffers[name]}[{self._node[2]}] = {expr};")
            return
        ptr = self._note_write(name)
        self._forget_loads(name)
        self.stats["stores"] += 1
        idx = self._address(index)
        if mode is None:
            self.blocks[-1].lines.append(f"{ptr}[{idx}] = {expr};")
        elif mode == "atomic_add":
            self._no_simd = True
            if dtype in HALF:
                f = self._convert_expr(value.expr, value.dtype, torch.float32)
                fn = "kiln_atomic_add_f16" if dtype == torch.float16 else "kiln_atomic_add_bf16"
                self.blocks[-1].lines.append(f"{fn}(&{ptr}[{idx}], {f});")
            else:
                self.blocks[-1].lines.append(f"kiln_atomic_add(&{ptr}[{idx}], ({ctype(dtype)}){expr});")
        else:
            raise MissingOpError(f"store mode {mode!r}", self)

    def reduction(self, dtype, src_dtype, reduction_type, value) -> CppValue:
        if reduction_type not in ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all",
                                  *WELFORD_TYPES):
            raise MissingOpError(f"reduction {reduction_type!r}", self)
        self._reduction = _Reduction(dtype, src_dtype, reduction_type, self._value(value))
        return CppValue("<reduction>", dtype, 0)

    def store_reduction(self, name: str, index, value) -> None:
        if self._reduction is None:
            raise ValueError("ops.store_reduction without ops.reduction")
        self._reduction.store_name = name
        self._reduction.store_index = self._index(index)

    def index_expr(self, expr, dtype) -> CppValue:
        expr = self._index(expr)
        return self._emit(f"static_cast<{ctype(dtype)}>({self._c(expr)})", dtype, [],
                          min_depth=self._depth_of_index(expr))

    def indirect_indexing(self, x, size, check=True) -> sympy.Symbol:
        x = self._value(x)
        size = sympy.sympify(size)
        depth = max(x.depth, self._depth_of_index(size))
        depth = min(depth, len(self.blocks) - 1)
        key = ("indirect_indexing", x.expr, size)
        known = self.blocks[depth].cse.get(key)
        if known is not None:
            return known
        sym = sympy.Symbol(f"ind{self._ind}", integer=True, nonnegative=True)
        self._ind += 1
        self.blocks[depth].lines.append(
            f"const int64_t {sym.name} = {x} < 0 ? (int64_t){x} + {self._c(size)} : (int64_t){x};")
        self.blocks[depth].cse[key] = sym
        self.sym_depth[sym.name] = depth
        return sym

    def constant(self, value, dtype) -> CppValue:
        return CppValue(c_literal(value, dtype), dtype)

    def to_dtype(self, x, dtype) -> CppValue:
        x = self._value(x)
        if x.dtype == dtype:
            return x
        v = self._emit(self._convert_expr(x.expr, x.dtype, dtype), dtype, [x])
        if x.dtype in HALF and dtype == torch.float32:
            self._widened[v.expr] = x
        elif dtype in HALF and x.expr in self._widened and self._widened[x.expr].dtype == dtype:
            self._round_trips[v.expr] = self._widened[x.expr].expr
            self._round_trip_tmps |= {x.expr, v.expr}
        return v

    def where(self, cond, a, b) -> CppValue:
        a = self._value(a, b if isinstance(b, CppValue) else None)
        b = self._value(b, a)
        cond = self._value(cond)
        return self._emit(f"{cond} ? {a} : {b}", a.dtype, [cond, a, b])


def _stride(index: sympy.Expr, sym: sympy.Symbol):
    """How far ``index`` moves when ``sym`` grows by one (a SymPy expr; 1 = contiguous)."""
    return sympy.simplify(index.xreplace({sym: sym + 1}) - index)


def _indent(lines: list[str], n: int = 1) -> list[str]:
    pad = "    " * n
    return [pad + ln if ln else ln for ln in lines]
