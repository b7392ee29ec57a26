"""What every codegen needs to know about one fused group, computed once: its kernel plan.

``plan_kernel(group, sched) -> KernelPlan`` gives:

* the **iteration space**: the group's outer ranges collapsed into as few loops as possible
  (adjacent dims merge when no memory index gets a division or modulo by doing so:
  ``i1 + 8*i0`` over ``[n, 8]`` becomes ``i0`` over ``[8*n]``), the pointwise numel, and per
  node its inner (reduction) ranges, reduction numel and reduction kind;
* the **loads and stores** of each node, with their SymPy index in the collapsed loop
  symbols ``i0, i1, ...`` and the node's inner symbols ``r0, r1, ...``;
* which internal buffers stay in **registers** (``register_buffers``: written once per outer
  point by a reduction or by a node without inner loops, read back only later at the index
  they were stored at) and which could live in a per-outer-point **row** (``row_buffers``:
  written by a pointwise node over inner loops and read only by later nodes over the same
  inner ranges at the same index; a codegen keeps them on chip when the row fits);
* the **signature** (``KernelSignature``): the kernel's arguments, buffers then size symbols,
  each with its dtype and whether the kernel reads and/or writes it.

``print(plan)`` is its text form (golden-tested in loopir's tests). Codegens read the plan;
they do not re-derive it. Helpers for loop shapes: ``access_strides`` (each access's stride
per loop symbol) and ``transposed_loops`` (the load and store loops a transposing copy tiles
in 2-D); ``collapse_outer_loops(group, split=True)`` also splits dims read as ``i // c`` and
``i % c`` (the C++ codegen's pointwise kernels; tested in codegen-cpp's
test_tiled_transposes.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import sympy
import torch

from .analysis import MemoryDep, body_deps
from .ir.schedule import FusedGroup, Schedule
from .ir.values import InputBuffer, dtype_str
from .sizevars import (
    FloorDiv,
    ModularIndexing,
    free_size_symbols,
    index_symbol,
    reduction_symbol,
    sexpr,
    simplify_index,
    statically_known_equal,
    symbol_kind,
)

__all__ = ["KernelArg", "KernelSignature", "NodePlan", "KernelPlan", "plan_kernel",
           "collapse_outer_loops", "split_inner_ranges", "on_chip_buffers", "access_strides",
           "transposed_loops",
           "is_outer_reduction"]


@dataclass(frozen=True)
class KernelArg:
    """One kernel argument: a buffer (``kind="buffer"``) or a size symbol (``kind="size"``)."""

    name: str
    kind: str  # "buffer" | "size"
    dtype: torch.dtype
    read: bool = False
    written: bool = False

    def __str__(self) -> str:
        if self.kind == "size":
            return f"{self.name}: int64"
        rw = ("r" if self.read else "") + ("w" if self.written else "")
        return f"{self.name}: {dtype_str(self.dtype)} {rw}"


@dataclass
class KernelSignature:
    """The kernel's arguments in order: buffers written, buffers only read, size symbols."""

    args: list[KernelArg]

    @property
    def buffers(self) -> list[KernelArg]:
        return [a for a in self.args if a.kind == "buffer"]

    @property
    def sizes(self) -> list[KernelArg]:
        return [a for a in self.args if a.kind == "size"]

    def names(self) -> list[str]:
        return [a.name for a in self.args]

    def param_names(self) -> dict[str, str]:
        """Buffer name -> a parameter name made from its position (``out_ptr0``, ``in_ptr1``):
        a codegen that names its parameters so prints the same source for the same kernel in
        every layer of a model, so the compile of one serves them all."""
        names, n_out, n_in = {}, 0, 0
        for a in self.buffers:
            if a.written:
                names[a.name], n_out = f"out_ptr{n_out}", n_out + 1
            else:
                names[a.name], n_in = f"in_ptr{n_in}", n_in + 1
        return names

    def __str__(self) -> str:
        return "(" + ", ".join(str(a) for a in self.args) + ")"


@dataclass
class NodePlan:
    """One node of the group: its kind, inner ranges and memory accesses (collapsed symbols)."""

    name: str
    kind: str  # "pointwise" | "reduction"
    inner: list[sympy.Expr]
    reduction_type: str | None
    reads: list[MemoryDep]
    writes: list[MemoryDep]
    indirect: int = 0  # how many indirect index symbols (ind*) its body makes

    @property
    def inner_symbols(self) -> list[sympy.Symbol]:
        return [reduction_symbol(k) for k in range(len(self.inner))]

    @property
    def rnumel(self) -> sympy.Expr:
        return sympy.Mul(*self.inner) if self.inner else sympy.Integer(1)

    def text(self) -> list[str]:
        head = f"{self.name}: {self.kind}"
        if self.inner:
            head += f" inner [{', '.join(sexpr(r) for r in self.inner)}] rnumel {sexpr(self.rnumel)}"
        if self.reduction_type:
            head += f" {self.reduction_type}"
        lines = [head]
        lines += [f"  load {d}" for d in self.reads]
        lines += [f"  store {d}" for d in self.writes]
        return lines


@dataclass
class KernelPlan:
    """See the module docstring. ``outer_index[k]``: original outer dim ``k`` as an expression
    of the collapsed loop symbols (what a node body is called with)."""

    group: FusedGroup
    outer: list[sympy.Expr]
    loop_ranges: list[sympy.Expr]
    outer_index: list[sympy.Expr]
    nodes: list[NodePlan]
    register_buffers: set[str]
    row_buffers: set[str]
    signature: KernelSignature
    size_hints: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.group.name

    @property
    def loop_symbols(self) -> list[sympy.Symbol]:
        return [index_symbol(k) for k in range(len(self.loop_ranges))]

    @property
    def var_ranges(self) -> dict:
        return dict(zip(self.loop_symbols, self.loop_ranges, strict=True))

    @property
    def numel(self) -> sympy.Expr:
        """Pointwise numel: the number of outer points."""
        return sympy.Mul(*self.loop_ranges) if self.loop_ranges else sympy.Integer(1)

    @property
    def kind(self) -> str:
        """``"pointwise"`` when no node has inner loops, else ``"reduction"`` (a reduction
        node, or a pointwise node over inner loops fused with one)."""
        return "reduction" if any(n.inner for n in self.nodes) else "pointwise"

    @property
    def reduction_types(self) -> list[str]:
        return [n.reduction_type for n in self.nodes if n.reduction_type]

    @property
    def size_symbols(self) -> list[sympy.Symbol]:
        return [sympy.Symbol(a.name, integer=True, positive=True) for a in self.signature.sizes]

    def hint(self, expr) -> int:
        """``expr`` at the example inputs' sizes (size symbols from ``size_hints``)."""
        expr = sympy.sympify(expr)
        subs = {s: self.size_hints.get(s.name, 8) for s in expr.free_symbols}
        return int(expr.subs(subs))

    def __str__(self) -> str:
        lines = [
            f"KernelPlan {self.name} ({self.kind})",
            f"  outer [{', '.join(sexpr(o) for o in self.outer)}] -> loops "
            f"[{', '.join(sexpr(r) for r in self.loop_ranges)}] numel {sexpr(self.numel)}",
        ]
        if self.outer_index != self.loop_symbols:
            lines.append(f"  outer index [{', '.join(sexpr(e) for e in self.outer_index)}]")
        for n in self.nodes:
            lines += ["  " + ln for ln in n.text()]
        if self.register_buffers:
            lines.append(f"  registers: {', '.join(sorted(self.register_buffers))}")
        if self.row_buffers:
            lines.append(f"  rows: {', '.join(sorted(self.row_buffers))}")
        lines.append(f"  signature {self.signature}")
        return "\n".join(lines)

    __repr__ = __str__


# =============================================================================================
# planning
# =============================================================================================


def _node_deps(group: FusedGroup, outer_index, loop_vr: dict):
    out = []
    for node in group.nodes:
        inner_syms = [reduction_symbol(j) for j in range(len(node.inner))]
        vr = loop_vr | dict(zip(inner_syms, node.inner, strict=True))
        out.append(body_deps(node.body, outer_index, inner_syms, var_ranges=vr))
    return out


def _build_loops(outer: list[sympy.Expr], groups: list[list[int]]):
    syms = [index_symbol(k) for k in range(len(groups))]
    ranges, index = [], [None] * len(outer)
    for sym, dims in zip(syms, groups, strict=True):
        ranges.append(sympy.Mul(*[outer[d] for d in dims]))
        inner = sympy.Integer(1)
        for d in reversed(dims):
            if d == dims[0]:
                index[d] = sym if inner == 1 else FloorDiv(sym, inner)
            else:
                index[d] = ModularIndexing(sym, inner, outer[d])
            inner = inner * outer[d]
    vr = dict(zip(syms, ranges, strict=True))
    return ranges, [simplify_index(e, vr) for e in index], vr


def _fine_symbol(k: int) -> sympy.Symbol:
    return sympy.Symbol(f"f{k}", integer=True, nonnegative=True)


def _dim_cuts(atom, sym) -> set | None:
    """Where ``atom`` (a FloorDiv/ModularIndexing of ``sym`` alone) cuts ``sym``'s range:
    ``sym // 64`` and ``sym % 64`` both cut at 64. None when it is not of that form."""
    if isinstance(atom, FloorDiv) and atom.args[0] == sym:
        return {atom.args[1]}
    if isinstance(atom, ModularIndexing) and atom.args[0] == sym:
        return {atom.args[1], atom.args[1] * atom.args[2]}
    return None


MIN_SPLIT_EXTENT = 16  # a split never leaves an innermost loop shorter than this


def _cut_chain(cuts: set | None, r: sympy.Expr) -> list:
    """``cuts`` inside ``(1, r)`` in order when they nest (each divides the next and ``r``,
    the innermost part at least MIN_SPLIT_EXTENT long), else []."""
    cs = sorted(c for c in (cuts or ()) if c != 1 and c != r)
    if cuts is None or not cs or not all(c.is_Integer for c in cs) or int(cs[0]) < MIN_SPLIT_EXTENT:
        return []
    bounds = [sympy.Integer(1), *cs, r]
    if any(sympy.simplify(b / a).is_integer is not True for a, b in zip(bounds, bounds[1:], strict=False)):
        return []
    return cs


def _split_outer_dims(group: FusedGroup, outer: list[sympy.Expr]):
    """Outer dims that every memory index reads only through ``i // c`` and ``i % c`` (the
    ``[b, t, 768]`` view of a ``[b, t, 12, 64]`` permute) split at those cuts into
    ``[12, 64]``, so each access is affine again. Returns (fine ranges, each original dim as
    an expression of the fine symbols ``f0, f1, ...``), or None when no dim splits."""
    syms = [index_symbol(k) for k in range(len(outer))]
    deps = _node_deps(group, syms, dict(zip(syms, outer, strict=True)))
    cuts: dict[int, set] = {k: set() for k in range(len(outer))}
    for d in deps:
        for m in list(d.reads) + list(d.writes):
            for atom in m.index.atoms(FloorDiv, ModularIndexing):
                for k in [k for k, s in enumerate(syms) if s in atom.free_symbols]:
                    c = _dim_cuts(atom, syms[k]) if cuts[k] is not None else None
                    cuts[k] = None if c is None else cuts[k] | c
    fine: list[sympy.Expr] = []
    expand: list[sympy.Expr] = []
    for k, r in enumerate(outer):
        bounds = [sympy.Integer(1), *_cut_chain(cuts[k], r), r]
        parts = [sympy.simplify(b / a) for a, b in zip(bounds, bounds[1:], strict=False)][::-1]
        first = len(fine)
        fine += parts
        expand.append(sympy.Add(*[bounds[len(parts) - 1 - j] * _fine_symbol(first + j)
                                  for j in range(len(parts))]))
    split = len(fine) > len(outer)
    return (fine, expand) if split else None


def _split_body(body, parts_expand):
    """``body(outer, [r0])`` seen as ``body(outer, [r0', r1', ...])`` with ``r0`` rebuilt from
    the split symbols."""
    def split_body(outer, inner):
        subs = {_fine_symbol(k): v for k, v in enumerate(inner)}
        return body(outer, [sympy.sympify(parts_expand).xreplace(subs)])

    return split_body


def _row_cuts(index: sympy.Expr, r0: sympy.Symbol, cuts: set | None) -> set | None:
    """``cuts`` plus where ``index`` cuts the row symbol ``r0`` (``r0 // 192``, ``r0 % 96``);
    None when ``index`` reads ``r0`` through a division or remainder of anything else than
    ``r0`` alone (``(2*i2 + r0 // 192) % 7`` is fine: ``r0`` is inside ``r0 // 192``)."""
    if cuts is None:
        return None
    for atom in index.atoms(FloorDiv, ModularIndexing):
        if r0 not in atom.free_symbols:
            continue
        c = _dim_cuts(atom, r0)
        if c is not None:
            cuts = cuts | c
            continue
        own = {a: sympy.Dummy() for a in atom.args[0].atoms(FloorDiv, ModularIndexing)
               if _dim_cuts(a, r0) is not None}
        if r0 in atom.args[0].xreplace(own).free_symbols:
            return None
    return cuts


def split_inner_ranges(group: FusedGroup) -> FusedGroup:
    """The group with each one-dim inner range that every node over it reads only through
    ``r // c`` and ``r % c`` split at those cuts (``[384]`` -> ``[4, 96]``), when that leaves
    every access affine in the split symbols; the group itself when nothing splits.

    Why: Swin's patch merging concatenates four neighbours (``[.., 4*96]``) and normalizes the
    row, so its LayerNorm's loads divided and took remainders of ``r0`` (and computed the
    shifted window's position) for every element; split, the innermost loop is a plain
    96-wide one and the rest is computed once per part. Elements are visited in the same row
    order (``r0 = 96*r0' + r1'``); a codegen's vector lanes group partial sums differently
    only when the innermost part is not a multiple of their count. The C++ codegen asks for
    it, as it asks ``collapse_outer_loops`` to split outer dims."""
    osyms = [index_symbol(k) for k in range(len(group.outer))]
    vr = dict(zip(osyms, [sympy.sympify(r) for r in group.outer], strict=True))
    r0 = reduction_symbol(0)
    by_range: dict[sympy.Expr, list[int]] = {}
    for k, n in enumerate(group.nodes):
        if len(n.inner) == 1 and sympy.sympify(n.inner[0]).is_Integer:
            by_range.setdefault(sympy.sympify(n.inner[0]), []).append(k)
    nodes = list(group.nodes)
    for r, members in by_range.items():
        if any(group.nodes[k].reduction_type in ("argmax", "argmin") for k in members):
            continue  # their result is a position along the row
        cuts: set | None = set()
        for k in members:
            d = body_deps(group.nodes[k].body, osyms, [r0], var_ranges=vr | {r0: r})
            for m in list(d.reads) + list(d.writes):
                cuts = _row_cuts(m.index, r0, cuts)
        chain = _cut_chain(cuts, r)
        if not chain:
            continue
        bounds = [sympy.Integer(1), *chain, r]
        parts = [sympy.simplify(b / a) for a, b in zip(bounds, bounds[1:], strict=False)][::-1]
        expand = sympy.Add(*[bounds[len(parts) - 1 - j] * _fine_symbol(j) for j in range(len(parts))])
        rsyms = [reduction_symbol(j) for j in range(len(parts))]
        rvr = vr | dict(zip(rsyms, parts, strict=True))
        trial = {}
        for k in members:
            n = group.nodes[k]
            body = _split_body(n.body, expand)
            d = body_deps(body, osyms, rsyms, var_ranges=rvr)
            if any(rsyms[-1] in atom.free_symbols for m in list(d.reads) + list(d.writes)
                   for atom in m.index.atoms(FloorDiv, ModularIndexing)):
                break  # the innermost part must be read affinely
            trial[k] = dataclasses.replace(n, inner=list(parts), body=body, reads=list(d.reads),
                                           writes=list(d.writes))
        else:
            for k, n in trial.items():
                nodes[k] = n
    if nodes == list(group.nodes):
        return group
    written: set[str] = set()
    reads: list[MemoryDep] = []
    writes: list[MemoryDep] = []
    for n in nodes:
        reads += [d for d in n.reads if d.name not in written and d not in reads]
        writes += n.writes
        written |= {d.name for d in n.writes}
    return dataclasses.replace(group, nodes=nodes, reads=reads, writes=writes)


def collapse_outer_loops(group: FusedGroup, split: bool = False):
    """Merge adjacent outer dims (innermost first) while every memory index stays free of
    division/modulo by the merged loop. Returns (loop ranges, outer index, node deps).

    ``split=True`` (the C++ codegen's pointwise kernels) first splits dims read only through
    ``i // c`` and ``i % c`` at those cuts (``_split_outer_dims``), when that leaves every
    access affine in the split dims."""
    outer = [sympy.sympify(r) for r in group.outer]
    expand = None
    if split:
        fine = _split_outer_dims(group, outer)
        if fine is not None:
            fine_ranges, fine_expand = fine
            ranges, index, vr = _build_loops(fine_ranges, [[k] for k in range(len(fine_ranges))])
            subs = {_fine_symbol(k): index[k] for k in range(len(fine_ranges))}
            trial = [simplify_index(e.xreplace(subs), vr) for e in fine_expand]
            deps = _node_deps(group, trial, vr)
            if not any(m.index.has(FloorDiv, ModularIndexing)
                       for d in deps for m in list(d.reads) + list(d.writes)):
                outer, expand = fine_ranges, fine_expand
    groups = [[k] for k in range(len(outer))]

    def build(trial):
        ranges, index, vr = _build_loops(outer, trial)
        if expand is not None:
            subs = {_fine_symbol(k): index[k] for k in range(len(outer))}
            index = [simplify_index(e.xreplace(subs), vr) for e in expand]
        return ranges, index, vr

    def deps_if_clean(trial):
        ranges, index, vr = build(trial)
        merged = {index_symbol(k) for k, dims in enumerate(trial) if len(dims) > 1}
        deps = _node_deps(group, index, vr)
        for d in deps:
            for m in list(d.reads) + list(d.writes):
                for f in m.index.atoms(FloorDiv, ModularIndexing):
                    if f.free_symbols & merged:
                        return None
        return deps

    while len(groups) > 1:
        trial = groups[:-2] + [groups[-2] + groups[-1]]
        if deps_if_clean(trial) is None:
            break
        groups = trial
    ranges, index, vr = build(groups)
    return ranges, index, _node_deps(group, index, vr)


def access_strides(index: sympy.Expr, symbols) -> dict:
    """How far ``index`` moves when each loop symbol grows by one: ``{i0: 768, i1: 1}``; a
    symbol the index reads non-affinely (``i1 // 64``) maps to None, one it ignores to 0."""
    out = {}
    for s in symbols:
        step = sympy.expand(index.xreplace({s: s + 1}) - index)
        out[s] = None if step.free_symbols & set(symbols) or step.has(FloorDiv, ModularIndexing) else step
    return out


def is_outer_reduction(plan: KernelPlan) -> bool:
    """Do the group's reductions read memory contiguously along the outputs rather than along
    the row (``x.sum(0)`` of a row-major matrix)? Votes over the loads of its nodes with inner
    loops (``access_strides``): a load stepping by 1 with the innermost output symbol and by
    more with the innermost row symbol is outer, one stepping by 1 along the row is inner;
    indices that are not affine abstain."""
    if not plan.loop_symbols:
        return False
    x = plan.loop_symbols[-1]
    outer = inner = 0
    for node in plan.nodes:
        if not node.inner:
            continue
        r = node.inner_symbols[-1]
        symbols = [*plan.loop_symbols, *node.inner_symbols]
        for dep in node.reads:
            if dep.name in plan.register_buffers or dep.name in plan.row_buffers:
                continue
            steps = access_strides(dep.index, symbols)
            if steps[r] == 1:
                inner += 1
            elif steps[x] == 1 and steps[r] not in (None, 0):
                outer += 1
    return outer > inner


def transposed_loops(loop_ranges: list[sympy.Expr], deps, min_extent: int = 8):
    """The two loops of a transposing copy, ``(load loop, store loop)``: every store is
    contiguous along the store loop, and a load is contiguous along the other (reading with a
    large stride along the store loop). A codegen tiles them in 2-D so both sides touch whole
    cache lines. None when the group is not such a copy (a store through an indirect index,
    loads and stores contiguous along one loop, a loop shorter than ``min_extent``)."""
    syms = [index_symbol(k) for k in range(len(loop_ranges))]
    stores = [m for d in deps for m in d.writes]
    loads = [m for d in deps for m in d.reads
             if not any(symbol_kind(s) == "ind" for s in m.index.free_symbols)]
    if len(syms) < 2 or not stores or any(
            m.mode is not None or any(symbol_kind(s) == "ind" for s in m.index.free_symbols)
            for m in stores):
        return None
    store_strides = [access_strides(m.index, syms) for m in stores]
    along = [s for s in syms if all(st[s] == 1 for st in store_strides)]
    if not along:
        return None
    store_loop = along[0]
    votes: dict = {}
    for m in loads:
        st = access_strides(m.index, syms)
        if st[store_loop] in (0, 1):
            continue  # already contiguous (or broadcast) along the store loop
        for s in syms:
            if s != store_loop and st[s] == 1:
                votes[s] = votes.get(s, 0) + 1
    if not votes:
        return None
    load_loop = max(votes, key=lambda s: (votes[s], syms.index(s)))
    for s in (load_loop, store_loop):
        r = loop_ranges[syms.index(s)]
        if r.is_Integer and int(r) < min_extent:
            return None
    return syms.index(load_loop), syms.index(store_loop)


def _same_inner(a, b) -> bool:
    return len(a.inner) == len(b.inner) and all(
        statically_known_equal(x, y) for x, y in zip(a.inner, b.inner, strict=True))


def on_chip_buffers(group: FusedGroup, nodes) -> tuple[set[str], set[str]]:
    """(register buffers, row buffers) among the group's internal buffers; ``nodes``: per
    group node, anything with ``reads``/``writes`` MemoryDeps (NodePlans, DepsHandlers)."""
    stores: dict[str, tuple[int, sympy.Expr]] = {}
    loads: dict[str, list[tuple[int, sympy.Expr]]] = {}
    for k, n in enumerate(nodes):
        for d in n.reads:
            loads.setdefault(d.name, []).append((k, d.index))
        for d in n.writes:
            # written twice or accumulated: stays in memory
            stores[d.name] = (-1, d.index) if (d.name in stores or d.mode is not None) else (k, d.index)
    registers, rows = set(), set()
    for name in sorted(set(group.internal_buffers or ())):
        if name not in stores:
            continue
        k, idx = stores[name]
        if k < 0 or any(symbol_kind(s) == "ind" for s in idx.free_symbols):
            continue
        readers = loads.get(name, [])
        if not all(j > k and lidx == idx for j, lidx in readers):
            continue
        writer = group.nodes[k]
        if writer.kind == "reduction" or not writer.inner:
            registers.add(name)
        elif all(_same_inner(group.nodes[j], writer) for j, _ in readers):
            rows.add(name)
    return registers, rows


def plan_kernel(group: FusedGroup, sched: Schedule) -> KernelPlan:
    """The kernel plan of one fused group of ``sched`` (see the module docstring)."""
    graph = sched.graph
    ranges, outer_index, deps = collapse_outer_loops(group)
    nodes = [
        NodePlan(name=n.name, kind=n.kind, inner=list(n.inner), reduction_type=n.reduction_type,
                 reads=list(d.reads), writes=list(d.writes), indirect=len(d.indirect))
        for n, d in zip(group.nodes, deps, strict=True)
    ]
    registers, rows = on_chip_buffers(group, nodes)
    written: list[str] = []
    read: list[str] = []
    for n in nodes:
        for d in n.writes:
            if d.name not in registers and d.name not in written:
                written.append(d.name)
        for d in n.reads:
            if d.name not in registers and d.name not in read:
                read.append(d.name)
    args = []
    for name in written + [r for r in read if r not in written]:
        buf = graph.get_buffer(name)
        args.append(KernelArg(name, "buffer", buf.layout.dtype, read=name in read, written=name in written))
    exprs = list(ranges) + [e for n in nodes for e in n.inner]
    exprs += [d.index for n in nodes for d in (*n.reads, *n.writes)]
    sizes = free_size_symbols(exprs)
    args += [KernelArg(s.name, "size", torch.int64, read=True) for s in sizes]
    hints = {str(k): int(v) for k, v in (getattr(graph, "size_hints", None) or {}).items()}
    return KernelPlan(
        group=group,
        outer=[sympy.sympify(r) for r in group.outer],
        loop_ranges=ranges,
        outer_index=outer_index,
        nodes=nodes,
        register_buffers=registers,
        row_buffers=rows,
        signature=KernelSignature(args),
        size_hints=hints,
    )


def written_inputs(plan: KernelPlan, sched: Schedule) -> set[str]:
    """Graph inputs the kernel writes (input mutations): they may alias other arguments."""
    inputs = {b.name for b in sched.graph.inputs if isinstance(b, InputBuffer)}
    return {a.name for a in plan.signature.buffers if a.written and a.name in inputs}
