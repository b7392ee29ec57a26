"""LoopGraph -> Schedule: fusion, loop order, memory plan.

Steps, in order (``schedule(graph)``):

1. dead code: ComputedBuffers nobody reads (and no output) are dropped; identical reductions
   (same layout, ranges, type and body, e.g. ``x.sum()`` beside the sum inside ``x.mean()``)
   are computed once: later copies are dropped and their readers load the first;
   collectives move up and their waits down across compute (collective_order.py);
2. greedy fusion in topological order. Each ComputedBuffer becomes a SchedNode placed into an
   existing FusedGroup when legal and useful, else into a new group:
   * candidates: the group holding its latest producer (vertical fusion) and later groups that
     read the same buffers (horizontal fusion); a node may join a group only if none of its
     producers comes after that group;
   * shapes: size-1 dims are dropped; the node's ranges must map onto the group's ``outer``
     ranges (any dim order, equal sizes); a pointwise node's extra dims become its ``inner``
     loop, a reduction's reduction dims its ``inner`` loop. A purely pointwise group is
     re-split (``outer`` shortened to a prefix, its nodes get the rest as ``inner``) when a
     reduction over its trailing dims joins it (softmax, layernorm: one group). Iteration
     spaces equal up to a reshape also fuse: the group's outer ranges and the node's leading
     dims are lined up by their common refinement (a layernorm's statistics over [2, 32] and
     its normalized rows seen as [64, 768]: the node's dim 0 is ``32*i0 + i1``);
   * memory dependencies: every read of a buffer written inside the group must read what the
     group wrote at the SAME outer point (equal index after renaming the writer's inner loop
     to the reader's); reads through indirect indices of group buffers never fuse;
   * a long row with few outputs (``x.abs().amax()`` of a whole weight: one output, millions
     of row points) keeps one node walking the row: a codegen can then split that row over
     programs or threads, where a second row walk in the same group (the ``x * scale`` that
     reads the amax, or the clone that feeds it) would run the whole tensor on one program.
   Every refusal is logged on the ``kiln.fusion`` logger (DEBUG) with its reason.
3. loop order: a new group orders its outer dims by decreasing stride of the node's store (the
   innermost loop is the contiguous one); a reduction orders its reduction dims by decreasing
   stride of its loads (argmax/argmin keep the declared order: their result is a linear index).
4. memory plan: ComputedBuffers are allocated before their step (reusing the storage of a freed
   ComputedBuffer with the same layout, dtype and device when one is free), and every
   intermediate is freed after its last use; inputs, constants and outputs never are.
   ``internal_buffers``: written and read only inside one group, at the same outer point. They
   neither reuse nor lend storage: a codegen may keep them in registers and never allocate.
"""

from __future__ import annotations

import functools
import itertools
import logging
from dataclasses import dataclass, field

import sympy

from .analysis import DepsHandler, MemoryDep
from .collective_order import is_collective, overlap_collectives, pinned_by_collectives
from .counters import counters
from .ir.graph import LoopGraph, collect_deps
from .ir.printer import PrintHandler
from .ir.schedule import Allocation, ExternNode, FusedGroup, SchedNode, Schedule
from .ir.values import (
    Buffer,
    ComputedBuffer,
    ExternKernel,
    Layout,
    MultiOutput,
    Reduction,
    ScatterBuffer,
    body_indices,
)
from .ir.verify import verify_enabled, verify_graph, verify_schedule
from .sizevars import (
    index_symbol,
    reduction_symbol,
    simplify_index,
    statically_known_equal,
    symbol_kind,
    sympify,
)
from .virtualized import get_ops_handler, set_ops_handler

log = logging.getLogger("kiln.fusion")

__all__ = ["schedule", "IndexSimplifyingHandler"]

MAX_PERMUTATIONS = 24
#: a group with at most this many outputs ...
ROW_STARVED_MAX_OUTPUTS = 64
#: ... whose rows are at least this long keeps a single node walking the rows
ROW_STARVED_MIN_ROW = 65536


# --------------------------------------------------------------------------------------------
# index simplification around a codegen's handler
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8192)
def _simplify_cached(expr, ranges_key):
    return simplify_index(expr, dict(ranges_key))


class IndexSimplifyingHandler:
    """Wraps a handler: index arguments of load/store/store_reduction/index_expr are simplified
    with the loop ranges (``ModularIndexing(i1, 1, s1) -> i1`` ...) before the inner handler
    sees them. ``renames`` redirects loads (``{"buf7": "buf3"}``: buf7 was a duplicate of buf3
    and is never computed)."""

    def __init__(self, inner, var_ranges: dict, renames: dict | None = None):
        self._inner = inner
        self._key = tuple(sorted(((k, sympify(v)) for k, v in var_ranges.items()),
                                 key=lambda kv: kv[0].name))
        self._renames = renames or {}

    def _s(self, index):
        if isinstance(index, sympy.Basic) and not index.is_Atom:
            return _simplify_cached(index, self._key)
        return index

    def load(self, name, index):
        return self._inner.load(self._renames.get(name, name), self._s(index))

    def store(self, name, index, value, mode=None):
        if mode is None:
            return self._inner.store(name, self._s(index), value)
        return self._inner.store(name, self._s(index), value, mode=mode)

    def store_reduction(self, name, index, value):
        return self._inner.store_reduction(name, self._s(index), value)

    def index_expr(self, expr, dtype):
        return self._inner.index_expr(self._s(expr), dtype)

    def __getattr__(self, name):
        return getattr(self._inner, name)


# --------------------------------------------------------------------------------------------
# per-node information
# --------------------------------------------------------------------------------------------


@dataclass
class _Info:
    buf: ComputedBuffer
    kind: str
    dims: list[int]  # kept (size != 1) dims of data.ranges
    sizes: list
    rdims: list[int]  # kept dims of data.reduction_ranges
    rsizes: list
    reads: set[str]
    own_reads: list[MemoryDep]
    own_writes: list[MemoryDep]
    indirect: bool
    renames: dict = field(default_factory=dict)  # loads redirected (deduplicated buffers)


def _info(buf: ComputedBuffer, renames: dict | None = None) -> _Info:
    d = buf.data
    dims = [k for k, r in enumerate(d.ranges) if sympify(r) != 1]
    sizes = [sympify(d.ranges[k]) for k in dims]
    if isinstance(d, Reduction):
        rdims = [k for k, r in enumerate(d.reduction_ranges) if sympify(r) != 1]
        rsizes = [sympify(d.reduction_ranges[k]) for k in rdims]
        kind = "reduction"
    else:
        rdims, rsizes, kind = [], [], "pointwise"
    reads, writes = collect_deps(buf)
    used = {k: v for k, v in (renames or {}).items() if any(r.name == k for r in reads)}
    reads = [MemoryDep(used.get(r.name, r.name), r.index, r.mode) for r in reads]
    indirect = any(symbol_kind(s) == "ind" for dep in reads for s in dep.index.free_symbols)
    return _Info(buf, kind, dims, sizes, rdims, rsizes, {r.name for r in reads}, reads, writes,
                 indirect, used)


def _numeric(e) -> float:
    e = sympify(e)
    if e.is_Number:
        return float(e)
    subs = {s: 97 + 13 * k for k, s in enumerate(sorted(e.free_symbols, key=lambda s: s.name))}
    try:
        return float(e.xreplace(subs))
    except Exception:
        return 0.0


def _stride_of(expr, var) -> float:
    """Numeric stride of ``var`` in an index expression (others at 0)."""
    others = {s: 0 for s in expr.free_symbols if s != var and symbol_kind(s) in ("i", "r")}
    e = expr.xreplace(others)
    try:
        return abs(_numeric(e.xreplace({var: 1})) - _numeric(e.xreplace({var: 0})))
    except Exception:
        return 0.0


def _order_by_stride(dims, syms, deps) -> list[int]:
    """Order ``dims`` (with loop symbols ``syms``) so the smallest stride is innermost."""
    def key(k):
        d, s = k
        total = sum(_stride_of(dep.index, s) for dep in deps)
        return -total

    pairs = list(zip(dims, syms, strict=False))
    # stable: equal strides keep their order
    ordered = sorted(enumerate(pairs), key=lambda e: (key(e[1]), e[0]))
    return [p[1][0] for p in ordered]


# --------------------------------------------------------------------------------------------
# placements: a node inside a group
# --------------------------------------------------------------------------------------------


@dataclass
class _Placement:
    """Where a node's loops sit in its group. Group loop positions (outer, then the node's
    inner) map to dims of the node's ranges (reduction ranges for a reduction's inner);
    positions mapping to one dim make that dim row-major (``outer_map = [0, 0]`` over group
    sizes [2, 32]: the node's dim 0 of size 64 is ``32*i0 + i1``: a reshape)."""

    info: _Info
    outer_map: list[int]  # group outer position j -> dim of data.ranges
    inner_map: list[int]  # inner position -> dim of data.ranges (pointwise) / reduction_ranges
    inner: list = field(default_factory=list)  # sizes of the inner positions
    outer_sizes: list = field(default_factory=list)  # sizes of the outer positions

    @property
    def kind(self):
        return self.info.kind

    def make_body(self):
        buf = self.info.buf
        data = buf.data
        store = buf.store_body()
        nr = len(data.ranges)
        outer_map, inner_map = list(self.outer_map), list(self.inner_map)
        outer_sizes, inner_sizes = list(self.outer_sizes), list(self.inner)
        renames = dict(self.info.renames)
        if self.kind == "reduction":
            nrr = len(data.reduction_ranges)

            def body(outer_index, inner_index):
                idx = _combine(nr, outer_map, outer_sizes, outer_index)
                ridx = _combine(nrr, inner_map, inner_sizes, inner_index)
                vr = _ranges(outer_index, outer_sizes, inner_index, inner_sizes)
                with set_ops_handler(IndexSimplifyingHandler(get_ops_handler(), vr, renames)):
                    return store(idx, ridx)
        else:
            positions, sizes = outer_map + inner_map, outer_sizes + inner_sizes

            def body(outer_index, inner_index):
                idx = _combine(nr, positions, sizes, list(outer_index) + list(inner_index))
                vr = _ranges(outer_index, outer_sizes, inner_index, inner_sizes)
                with set_ops_handler(IndexSimplifyingHandler(get_ops_handler(), vr, renames)):
                    return store(idx)

        return body

    def deps(self, outer_syms, inner_syms) -> DepsHandler:
        h = DepsHandler()
        with set_ops_handler(h):
            self.make_body()(outer_syms, inner_syms)
        return h


_ZERO = sympy.Integer(0)


def _combine(n: int, positions: list[int], sizes: list, index: list) -> list:
    """The node's ``n`` loop indices from the group's: each dim is the row-major combination
    of the positions mapping to it (usually exactly one)."""
    idx = [_ZERO] * n
    for d, size, var in zip(positions, sizes, index, strict=True):
        idx[d] = idx[d] * size + var
    return idx


def _ranges(outer_index, outer_sizes, inner_index, inner_sizes) -> dict:
    vr = {}
    for s, r in zip(outer_index, outer_sizes, strict=False):
        if isinstance(s, sympy.Symbol):
            vr[s] = r
    for s, r in zip(inner_index, inner_sizes, strict=False):
        if isinstance(s, sympy.Symbol):
            vr[s] = r
    return vr


@functools.lru_cache(None)
def _q(k):
    return sympy.Symbol(f"q{k}", integer=True, nonnegative=True)


class _Group:
    def __init__(self, name, outer, placement, sealed=False):
        self.name = name
        self.outer = list(outer)
        self.placements: list[_Placement] = [placement]
        self.sealed = sealed  # nothing fuses into it (scatters)

    @property
    def written(self) -> dict[str, _Placement]:
        return {p.info.buf.name: p for p in self.placements}

    def reads(self) -> set[str]:
        out = set()
        for p in self.placements:
            out |= p.info.reads
        return out

    def pure_pointwise(self) -> bool:
        return all(p.kind == "pointwise" and not p.inner_map for p in self.placements)


# --------------------------------------------------------------------------------------------
# fusion
# --------------------------------------------------------------------------------------------


def _reduction_order(info: _Info) -> list[int]:
    """The reduction dims in loop order: by stride of the reads, except argmax/argmin, which
    keep the logical order (their tie-break is the first index in it)."""
    if info.buf.data.reduction_type in ("argmax", "argmin"):
        return list(info.rdims)
    rsyms = [reduction_symbol(k) for k in info.rdims]
    return _order_by_stride(info.rdims, rsyms, info.own_reads)


def _new_group(name, info: _Info) -> _Group:
    osyms = [index_symbol(k) for k in info.dims]
    order = _order_by_stride(info.dims, osyms, info.own_writes) if info.dims else []
    if info.kind == "reduction":
        rorder = _reduction_order(info)
        p = _Placement(info, order, rorder)
        p.inner = [sympify(info.buf.data.reduction_ranges[d]) for d in rorder]
    else:
        p = _Placement(info, order, [])
    outer = [sympify(info.buf.data.ranges[d]) for d in order]
    p.outer_sizes = list(outer)
    return _Group(name, outer, p)


def _assignments(target: list, dims: list[int], sizes: list, exact: bool):
    """Ordered injections of ``target`` sizes into ``dims`` (equal sizes). With ``exact`` all
    dims must be used. Yields (outer_map, remaining dims)."""
    if exact and len(target) != len(dims):
        return
    if len(target) > len(dims):
        return
    count = 0
    # identity-like first: try in-order matching, then permutations
    for perm in itertools.permutations(range(len(dims)), len(target)):
        if all(statically_known_equal(sizes[p], t) for p, t in zip(perm, target, strict=False)):
            rest = [dims[k] for k in range(len(dims)) if k not in perm]
            yield [dims[p] for p in perm], rest
            count += 1
            if count >= MAX_PERMUTATIONS:
                return


def _candidate_placements(group: _Group, info: _Info, outer: list):
    """Placements of ``info`` into a group with ``outer`` ranges."""
    if info.kind == "reduction":
        rorder = _reduction_order(info)
        for omap, _ in _assignments(outer, info.dims, info.sizes, exact=True):
            p = _Placement(info, omap, rorder, outer_sizes=list(outer))
            p.inner = [sympify(info.buf.data.reduction_ranges[d]) for d in rorder]
            yield p
    else:
        for omap, rest in _assignments(outer, info.dims, info.sizes, exact=False):
            yield _pointwise_placement(info, omap, rest, outer)


def _pointwise_placement(info: _Info, omap: list[int], rest: list[int], outer: list) -> _Placement:
    """A pointwise node over ``outer`` (positions -> dims ``omap``); its ``rest`` dims become
    its inner loops, the contiguous one innermost."""
    syms = [index_symbol(k) for k in rest]
    imap = _order_by_stride(rest, syms, info.own_writes) if rest else []
    p = _Placement(info, omap, imap, outer_sizes=list(outer))
    p.inner = [sympify(info.buf.data.ranges[d]) for d in imap]
    return p


def _exact_quotient(a, b):
    """``a / b`` when it is a whole number greater than 1 (static or symbolic), else None."""
    q = sympy.simplify(sympify(a) / sympify(b))
    if q.is_Integer:
        return q if q > 1 else None
    return q if q.is_integer and q.is_positive and not q.is_Number else None


def _refinement(outer: list, sizes: list):
    """Line up the group's ``outer`` sizes with a node's (kept, in order) dim sizes when they
    are the same iteration space up to a reshape: the common refinement of both (``[2, 32]``
    and ``[64, 768]`` -> ``[2, 32]`` with the node's dim 0 = positions 0 and 1; the node's
    remaining dims, here ``[768]``, are left over). Returns (refined sizes, positions of each
    outer range, positions of each node dim, number of node dims covered) or None."""
    refined: list = []
    outer_runs: list[list[int]] = [[] for _ in outer]
    node_runs: list[list[int]] = [[] for _ in sizes]
    j = t = 0
    g = sympify(outer[0]) if outer else None
    n = sympify(sizes[0]) if sizes else None
    while j < len(outer):
        if t >= len(sizes):
            return None  # the node is smaller than the group
        pos = len(refined)
        if statically_known_equal(g, n):
            refined.append(g)
            outer_runs[j].append(pos)
            node_runs[t].append(pos)
            j, t = j + 1, t + 1
            g = sympify(outer[j]) if j < len(outer) else None
            n = sympify(sizes[t]) if t < len(sizes) else None
            continue
        q = _exact_quotient(g, n)
        if q is not None:  # the group's range splits into the node's dim and more
            refined.append(n)
            outer_runs[j].append(pos)
            node_runs[t].append(pos)
            g, t = q, t + 1
            n = sympify(sizes[t]) if t < len(sizes) else None
            continue
        q = _exact_quotient(n, g)
        if q is not None:  # the node's dim spans this range and more
            refined.append(g)
            outer_runs[j].append(pos)
            node_runs[t].append(pos)
            n, j = q, j + 1
            g = sympify(outer[j]) if j < len(outer) else None
            if g is None:
                return None  # the group ends inside a node dim
            continue
        return None
    return refined, outer_runs, node_runs, t


def _refined_placements(placements: list[_Placement], outer: list, info: _Info):
    """(the group's placements over the refined outer, refined outer, the node's placement)
    when the node sees the group's iteration space through a reshape, else None."""
    r = _refinement(outer, info.sizes)
    if r is None:
        return None
    refined, outer_runs, node_runs, covered = r
    if all(len(run) == 1 for run in outer_runs + node_runs[:covered]):
        return None  # no reshape: the plain placements covered this
    rest = info.dims[covered:]
    if info.kind == "reduction" and rest:
        return None
    omap = [info.dims[t] for t, run in enumerate(node_runs) for _ in run]
    moved = []
    for p in placements:
        q = _Placement(p.info, [p.outer_map[j] for j, run in enumerate(outer_runs) for _ in run],
                       list(p.inner_map), list(p.inner), list(refined))
        moved.append(q)
    if info.kind == "reduction":
        rorder = _reduction_order(info)
        cand = _Placement(info, omap, rorder, outer_sizes=list(refined))
        cand.inner = [sympify(info.buf.data.reduction_ranges[d]) for d in rorder]
    else:
        cand = _pointwise_placement(info, omap, rest, refined)
    return moved, list(refined), cand


def _regrouped(group: _Group, k: int) -> list[_Placement] | None:
    """The group's placements with ``outer`` cut to its first ``k`` ranges (pure pointwise)."""
    if not group.pure_pointwise() or k >= len(group.outer):
        return None
    out = []
    for p in group.placements:
        q = _Placement(p.info, p.outer_map[:k], p.outer_map[k:], list(group.outer[k:]),
                       list(group.outer[:k]))
        out.append(q)
    return out


def _deps_ok(placements: list[_Placement], outer: list, cand: _Placement) -> str | None:
    """None if ``cand`` may run after ``placements`` per outer point, else the reason."""
    written = {p.info.buf.name: p for p in placements}
    needed = cand.info.reads & set(written)
    if not needed:
        return None
    osyms = [index_symbol(k) for k in range(len(outer))]
    rsyms = [reduction_symbol(k) for k in range(len(cand.inner))]
    ch = cand.deps(osyms, rsyms)
    for d in ch.reads:
        if d.name not in written:
            continue
        if any(symbol_kind(s) == "ind" for s in d.index.free_symbols):
            return f"reads {d.name} through an indirect index"
        w = written[d.name]
        qsyms = [_q(k) for k in range(len(w.inner))]
        wh = w.deps(osyms, qsyms)
        wdeps = [x for x in wh.writes if x.name == d.name]
        if not wdeps:
            return f"cannot see how {d.name} is written"
        widx = wdeps[0].index
        if w.kind == "pointwise" and w.inner:
            if len(w.inner) != len(cand.inner) or not all(
                    statically_known_equal(a, b) for a, b in zip(w.inner, cand.inner, strict=False)):
                return (f"reads {d.name} (written over inner {list(map(str, w.inner))}) from "
                        f"inner {list(map(str, cand.inner))}")
            widx = widx.xreplace(dict(zip(qsyms, rsyms, strict=False)))
        if sympy.expand(d.index - widx) != 0:
            return f"reads {d.name}[{d.index}] but the group writes {d.name}[{widx}] at this outer point"
    return None


def _try_fuse(group: _Group, info: _Info) -> tuple[list[_Placement], list, _Placement] | str:
    """(new placements of the group, new outer, placement of info) or the reason it fails."""
    res = _find_placement(group, info)
    if not isinstance(res, str) and _row_starved(res[0] + [res[2]], res[1]):
        return "a long row over few outputs stays one walk"
    return res


def _find_placement(group: _Group, info: _Info) -> tuple[list[_Placement], list, _Placement] | str:
    """Where ``info`` fits in ``group`` by shape and memory dependencies, or why not."""
    options = [(list(group.placements), list(group.outer))]
    n_outer = len(info.dims) if info.kind == "reduction" else None
    if n_outer is not None and n_outer < len(group.outer):
        rg = _regrouped(group, n_outer)
        if rg is not None:
            options.append((rg, list(group.outer[:n_outer])))
    # shorter outer loops of a pure pointwise group (its trailing dims become inner loops)
    for k in range(len(group.outer) - 1, 0, -1):
        if k != n_outer and (info.kind == "reduction" or len(info.dims) < len(group.outer)):
            rg = _regrouped(group, k)
            if rg is not None:
                options.append((rg, list(group.outer[:k])))
    reasons = []
    for placements, outer in options:
        any_shape = False
        for cand in _candidate_placements(group, info, outer):
            any_shape = True
            why = _deps_ok(placements, outer, cand)
            if why is None:
                return placements, outer, cand
            reasons.append(why)
        if not any_shape:
            refined = _refined_placements(placements, outer, info)
            if refined is not None:
                any_shape = True
                why = _deps_ok(refined[0], refined[1], refined[2])
                if why is None:
                    return refined
                reasons.append(why)
        if not any_shape:
            rr = [str(s) for s in info.sizes]
            if info.kind == "reduction":
                rr_txt = f"ranges {rr} reducing {[str(s) for s in info.rsizes]}"
            else:
                rr_txt = f"ranges {rr}"
            reasons.append(f"{rr_txt} do not match outer {[str(s) for s in outer]}")
    return "; ".join(dict.fromkeys(reasons)) or "no placement"


def _row_starved(placements: list[_Placement], outer: list) -> bool:
    """Few outputs, long rows, and more than one node walking them: the group's only
    parallelism would be its few outputs (see step 2's last rule)."""
    if _numeric(sympy.Mul(*outer)) > ROW_STARVED_MAX_OUTPUTS:
        return False
    rows = [_numeric(sympy.Mul(*p.inner)) for p in placements if p.inner]
    return len(rows) > 1 and max(rows) >= ROW_STARVED_MIN_ROW


# --------------------------------------------------------------------------------------------
# the schedule
# --------------------------------------------------------------------------------------------


def _extern_reads(b: Buffer) -> set[str]:
    if isinstance(b, ExternKernel):
        return set(b.input_buffers())
    if isinstance(b, MultiOutput):
        return {b.source.name}
    return set()


def _reads(b: Buffer) -> set[str]:
    if isinstance(b, ComputedBuffer):
        return {d.name for d in collect_deps(b)[0]}
    return _extern_reads(b)


def _dead_code(graph: LoopGraph) -> list[Buffer]:
    live = set(graph.output_names())
    bufs = list(graph.buffers)
    keep = [True] * len(bufs)
    reads_of: dict[str, set[str]] = {}
    for b in bufs:
        if isinstance(b, ComputedBuffer):
            reads_of[b.name] = {d.name for d in collect_deps(b)[0]}
        else:
            reads_of[b.name] = _extern_reads(b)
    needed = set(live)
    for k in range(len(bufs) - 1, -1, -1):
        b = bufs[k]
        if isinstance(b, ScatterBuffer):
            if b.target.name not in needed:
                keep[k] = False
            else:
                needed |= reads_of[b.name]
            continue
        if isinstance(b, ComputedBuffer) and b.name not in needed:
            keep[k] = False
            continue
        if isinstance(b, MultiOutput) and b.name not in needed:
            # keep the multi-output binding only if used; the extern itself always runs
            needed |= reads_of[b.name]
            continue
        needed |= reads_of[b.name]
    return [b for b, k in zip(bufs, keep, strict=False) if k]


class _KeyHandler(IndexSimplifyingHandler):
    """Prints a body for comparison: loads of deduplicated buffers renamed, the node's own
    store named ``<out>``."""

    def store(self, name, index, value, mode=None):
        return super().store("<out>", index, value, mode)

    def store_reduction(self, name, index, value):
        return super().store_reduction("<out>", index, value)


def _reduction_key(b: ComputedBuffer, renames: dict):
    d = b.data
    index_lists, vr = body_indices(b)
    printer = PrintHandler(vr)
    with set_ops_handler(_KeyHandler(printer, vr, renames)):
        b.store_body()(*index_lists)
    return (b.layout, d.dtype, d.src_dtype, d.acc_dtype, d.reduction_type, tuple(d.ranges),
            tuple(d.reduction_ranges), tuple(printer.lines))


def _deduplicate(buffers: list[Buffer], graph: LoopGraph) -> tuple[list[Buffer], dict[str, str]]:
    """Identical reductions (same layout, ranges, type and body: ``x.sum()`` next to the sum
    inside ``x.mean()``) are computed once: later copies are dropped and their readers load
    the first (``renames``). Outputs and buffers read by externs are kept."""
    keep_names = set(graph.output_names())
    scatter_targets = set()
    for b in buffers:
        keep_names |= _extern_reads(b)
        if isinstance(b, ScatterBuffer):
            scatter_targets.add(b.target.name)
    seen: dict = {}
    renames: dict[str, str] = {}
    out = []
    for b in buffers:
        if (type(b) is ComputedBuffer and isinstance(b.data, Reduction) and b.name not in keep_names
                and not {r.name for r in collect_deps(b)[0]} & scatter_targets):
            key = _reduction_key(b, renames)
            if key in seen:
                renames[b.name] = seen[key]
                log.debug("%s is computed by %s already (identical reduction)", b.name, seen[key])
                continue
            seen[key] = b.name
        out.append(b)
    return out, renames


def schedule(graph: LoopGraph) -> Schedule:
    buffers, renames = _deduplicate(_dead_code(graph), graph)
    # collectives issued early, waited for late (collective_order.py)
    buffers = overlap_collectives(buffers, lambda b: {renames.get(n, n) for n in _reads(b)})
    steps: list = []  # _Group | ExternKernel
    producer_step: dict[str, int] = {}
    ngroups = itertools.count()

    for b in buffers:
        if isinstance(b, MultiOutput):
            producer_step[b.name] = producer_step[b.source.name]
            continue
        if isinstance(b, ExternKernel):
            steps.append(b)
            producer_step[b.name] = len(steps) - 1
            continue
        if not isinstance(b, ComputedBuffer):
            continue
        info = _info(b, renames)
        counters["nodes"] += 1
        prods = [producer_step[r] for r in info.reads if r in producer_step]
        if isinstance(b, ScatterBuffer):
            # writes anywhere in its target: runs alone, after everything the target needs
            prods.append(producer_step[b.target.name])
            g = _new_group(f"group{next(ngroups)}", info)
            g.sealed = True
            steps.append(g)
            producer_step[b.name] = producer_step[b.target.name] = len(steps) - 1
            log.debug("%s (scatter into %s) runs as its own group", b.name, b.target.name)
            continue
        lo = max(prods) if prods else -1
        # candidate groups: the producer's group first (vertical), then later groups that
        # read the same data (horizontal), latest first
        cands: list[int] = []
        if lo >= 0 and isinstance(steps[lo], _Group) and not steps[lo].sealed:
            cands.append(lo)
        for k in range(len(steps) - 1, max(lo, -1), -1):
            if k in cands or not isinstance(steps[k], _Group) or steps[k].sealed:
                continue
            g = steps[k]
            if g.reads() & info.reads:
                cands.append(k)
        placed = False
        for k in cands:
            g = steps[k]
            res = _try_fuse(g, info)
            if isinstance(res, str):
                log.debug("%s not fused into %s: %s", b.name, g.name, res)
                continue
            placements, outer, p = res
            g.placements = placements + [p]
            g.outer = outer
            producer_step[b.name] = k
            counters["fusions"] += 1
            log.debug("%s fused into %s (%s)", b.name, g.name,
                      "vertical" if k == lo else "horizontal")
            placed = True
            break
        if not placed:
            if not cands:
                log.debug("%s starts a new group: no producer group and no shared reads", b.name)
            g = _new_group(f"group{next(ngroups)}", info)
            steps.append(g)
            producer_step[b.name] = len(steps) - 1

    _order_by_memory_stores(steps, graph, renames)
    # build the public steps
    out_steps = []
    for s in steps:
        if isinstance(s, _Group):
            out_steps.append(_finish_group(s, graph))
        else:
            out_steps.append(ExternNode(s))
    counters["fused_groups"] += sum(1 for s in out_steps if isinstance(s, FusedGroup))
    sched = Schedule(graph, out_steps)
    _internal_buffers(sched)
    _plan_memory(sched)
    deep = verify_enabled()  # KILN_VERIFY_IR=1: also the rules that trace bodies
    if deep:
        verify_graph(graph)
    verify_schedule(sched, trace_bodies=deep)
    return sched


def _order_by_memory_stores(steps: list, graph: LoopGraph, renames: dict) -> None:
    """Re-order the outer loops of each pure pointwise group by the strides of the stores that
    reach memory. A group's order is its first node's store order (``_new_group``), but that
    node's buffer often ends internal (kept in registers: a BatchNorm before its activation,
    with eager's NCHW layout) while the group's real store is channels-last: the
    contiguous channel dim then sat outside a strided innermost loop (EfficientNet's
    BatchNormAct: 16x the memory traffic)."""
    outputs = set(graph.output_names())
    read_by: dict[str, set[int]] = {}
    for k, st in enumerate(steps):
        names = st.reads() if isinstance(st, _Group) else {renames.get(n, n) for n in _reads(st)}
        for nm in names:
            read_by.setdefault(nm, set()).add(k)
    for k, g in enumerate(steps):
        if not isinstance(g, _Group) or g.sealed or not g.pure_pointwise() or len(g.outer) < 2:
            continue
        if any(len(set(p.outer_map)) != len(p.outer_map) for p in g.placements):
            continue  # a reshaped placement: positions are not one dim each
        stored = [p for p in g.placements
                  if p.info.buf.name in outputs or read_by.get(p.info.buf.name, set()) - {k}]
        if len(stored) == len(g.placements) or not stored:
            continue  # every store reaches memory: the first node's order stands

        strides = [sum(_stride_of(dep.index, index_symbol(p.outer_map[j]))
                       for p in stored for dep in p.info.own_writes) for j in range(len(g.outer))]
        order = sorted(range(len(g.outer)), key=lambda j: (-strides[j], j))
        if order == list(range(len(g.outer))):
            continue
        g.outer = [g.outer[j] for j in order]
        for p in g.placements:
            p.outer_map = [p.outer_map[j] for j in order]
            p.outer_sizes = [p.outer_sizes[j] for j in order]
        counters["groups_reordered"] += 1
        log.debug("%s: outer loops reordered %s by the stores that reach memory", g.name, order)


def _finish_group(g: _Group, graph: LoopGraph) -> FusedGroup:
    osyms = [index_symbol(k) for k in range(len(g.outer))]
    nodes = []
    written = set()
    reads: list[MemoryDep] = []
    writes: list[MemoryDep] = []
    for p in g.placements:
        rsyms = [reduction_symbol(k) for k in range(len(p.inner))]
        h = p.deps(osyms, rsyms)
        node = SchedNode(p.info.buf, p.kind, list(p.inner), p.make_body(), list(h.reads), list(h.writes))
        nodes.append(node)
        for d in h.reads:
            if d.name not in written and d not in reads:
                reads.append(d)
        for d in h.writes:
            writes.append(d)
            written.add(d.name)
    return FusedGroup(g.name, list(g.outer), nodes, graph.device, reads, writes)


def _uses(sched: Schedule) -> dict[str, list[int]]:
    """buffer name -> indices of the steps that read it."""
    uses: dict[str, list[int]] = {}
    for k, s in enumerate(sched.steps):
        if isinstance(s, FusedGroup):
            names = {d.name for n in s.nodes for d in n.reads}
            names |= {d.name for n in s.nodes for d in n.writes if d.name != n.buffer.name}
        else:
            names = set(s.reads)
        for nm in names:
            uses.setdefault(nm, []).append(k)
    return uses


def _internal_buffers(sched: Schedule) -> None:
    outputs = set(sched.graph.output_names())
    uses = _uses(sched)
    for k, s in enumerate(sched.steps):
        if not isinstance(s, FusedGroup):
            continue
        for n in s.nodes:
            nm = n.buffer.name
            if nm in outputs or isinstance(n.buffer, ScatterBuffer):
                continue
            if any(u != k for u in uses.get(nm, [])):
                continue
            s.internal_buffers.add(nm)


def _plan_memory(sched: Schedule) -> None:
    graph = sched.graph
    keep = set(graph.output_names()) | {b.name for b in graph.inputs} | set(graph.constants)
    uses = _uses(sched)
    last_use: dict[str, int] = {}
    produced_at: dict[str, int] = {}
    for k, s in enumerate(sched.steps):
        if isinstance(s, FusedGroup):
            names = [n.buffer.name for n in s.nodes if not isinstance(n.buffer, ScatterBuffer)]
        else:
            names = s.writes
        for nm in names:
            produced_at[nm] = k
            last_use[nm] = max(last_use.get(nm, k), k)
    for nm, ks in uses.items():
        if nm in last_use:
            last_use[nm] = max(last_use[nm], max(ks))
    frees_at: dict[int, list[str]] = {}
    for nm, k in last_use.items():
        if nm in keep:
            continue
        frees_at.setdefault(k, []).append(nm)
    internal = {nm for s in sched.steps if isinstance(s, FusedGroup) for nm in s.internal_buffers}
    # an extern whose result may alias an input (a view-returning aten op): that input's
    # storage lives as long as the result, so it is never lent to a later buffer
    aliased = {nm for s in sched.steps if isinstance(s, ExternNode) and _returns_alias(s.kernel.op)
               for nm in s.reads}
    aliased |= pinned_by_collectives([s.kernel for s in sched.steps if isinstance(s, ExternNode)])
    pool: list[tuple[int, str]] = []  # (freed after step, name) of reusable buffers
    for k, s in enumerate(sched.steps):
        s.frees = sorted(frees_at.get(k, []), key=lambda n: (len(n), n))
        taken: set[str] = set()  # dying here, their storage taken over in place
        if isinstance(s, FusedGroup):
            allocs = []
            for n in s.nodes:
                if isinstance(n.buffer, ScatterBuffer):
                    continue  # writes into its target's storage
                lay = n.buffer.layout
                reuse, in_place = None, False
                if n.buffer.name not in internal:
                    dying = [nm for nm in s.frees if nm not in taken
                             and _lendable(graph.name_to_buffer.get(nm), internal, aliased)]
                    reuse = in_place_source(s, n, dying, graph)
                    if reuse is not None:
                        in_place = True
                        taken.add(reuse)
                        counters["in_place_buffers"] += 1
                    else:
                        for j, (when, cand) in enumerate(pool):
                            if when < k and same_storage(graph.get_buffer(cand).layout, lay):
                                reuse = cand
                                pool.pop(j)
                                counters["reused_buffers"] += 1
                                break
                allocs.append(Allocation(n.buffer.name, lay, reuse, n.buffer.name in s.internal_buffers,
                                         in_place))
            s.allocations = allocs
        for nm in s.frees:
            if nm not in taken and _lendable(graph.name_to_buffer.get(nm), internal, aliased):
                pool.append((k, nm))


def _lendable(b: Buffer | None, internal: set[str], aliased: set[str]) -> bool:
    """May a later buffer take over ``b``'s storage once ``b`` is dead? A kernel's buffer (an
    internal one may never have had storage: a codegen keeps it in registers), or the fresh
    result of an extern (a convolution's, a matmul's: aten allocated it, nothing else holds it),
    never one whose op may return a view of an input, nor an input of such an op or of a
    collective (``aliased``), nor a collective's or a wait's result: ``wait_tensor`` returns
    its input's storage though its schema declares no alias, so the collective's result lives
    on in the wait's."""
    if b is None or b.name in internal or b.name in aliased or is_collective(b):
        return False
    if isinstance(b, ComputedBuffer):
        return True
    if isinstance(b, MultiOutput):
        return not _returns_alias(b.source.op)
    return isinstance(b, ExternKernel) and b.layout is not None and not _returns_alias(b.op)


def same_storage(a: Layout, b: Layout) -> bool:
    """Can a buffer of layout ``b`` live in the storage of one of layout ``a``: same dtype,
    device and storage size, both from its start (the wrapper reinterprets it when the sizes
    or strides differ: a channels-last convolution's result lent to an NCHW buffer)."""
    if a == b:
        return True
    if (a.dtype, a.device) != (b.dtype, b.device) or a.offset != 0 or b.offset != 0:
        return False
    return statically_known_equal(a.storage_size(), b.storage_size())


def in_place_source(group: FusedGroup, node: SchedNode, dying: list[str],
                    graph: LoopGraph) -> str | None:
    """A buffer among ``dying`` (last read by ``group``) whose storage ``node`` can write its
    result into while it reads it: the node alone reads it, only at the element it stores to
    (the same storage position, no indirection), with the same dtype, device and storage size.
    Each element is then loaded before it is overwritten in every codegen (the store depends
    on the load), and no other node or iteration sees the new value. Saves an allocation and
    the memory traffic of a fresh buffer: a convolution's BatchNorm+SiLU epilogue, a gate's
    multiply, a residual add write over their input as inductor's in-place buffers do."""
    stores = [d for d in node.writes if d.name == node.buffer.name]
    if len(stores) != 1 or stores[0].mode is not None:
        return None
    index = stores[0].index
    if any(symbol_kind(s) == "ind" for s in index.free_symbols):
        return None
    lay = node.buffer.layout
    for name in dying:
        if not same_storage(graph.get_buffer(name).layout, lay):
            continue
        reads = [(m, d) for m in group.nodes for d in m.reads if d.name == name]
        if any(d.name == name for m in group.nodes for d in m.writes):
            continue
        if reads and all(m is node and d.index == index for m, d in reads):
            return name
    return None


def _returns_alias(op) -> bool:
    """The op's schema says a result may share storage with an input (``Tensor(a)``)."""
    schema = getattr(op, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)
