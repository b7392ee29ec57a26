"""FlexAttention's forward as one fused Triton kernel (a flash-attention template).

``FlexAttentionKernel(score_gm, mask_gm, ...)`` generates and loads one ``@triton.jit`` kernel
for a ``torch.ops.higher_order.flex_attention`` node: each program owns ``BLOCK_M`` query rows
of one (batch, head) and walks only the key/value blocks its BlockMask row lists
(``kv_num_blocks``/``kv_indices``: partial blocks, ``mask_mod`` applied; then
``full_kv_num_blocks``/``full_kv_indices``: blocks the mask keeps whole, ``mask_mod`` skipped),
``BLOCK_N`` keys at a time, with an online softmax in float32. Scores never reach memory.

``score_mod`` and ``mask_mod`` are the node's ATen subgraphs. Each is lowered by loopir like
any graph (0-d inputs: the score, then int32 ``b, h, q_idx, kv_idx``, then its captured
tensors) and its loop body is emitted inline by ``ModEmitter``, an ops handler speaking
codegen-triton's pointwise formatting (``kernel._MATH``): the score becomes the
``[BLOCK_M, BLOCK_N]`` tile, ``q_idx`` a column ``[BLOCK_M, 1]``, ``kv_idx`` a row
``[1, BLOCK_N]``, so every op broadcasts to the tile and a captured table indexed by them
(``bias[q_idx - kv_idx]``, ``slopes[h]``, ``doc[q_idx]``) is a gather from its pointer.

Grouped-query attention reads kv head ``h // (Hq // Hkv)``. Results are the operator's:
``out`` (in the query's dim order), the logsumexp and the row max, both in log2 units
(divided by ln 2), -inf on a row with every score masked (whose output is zeros).

Where this kernel does not apply (``unsupported_reason``) the caller keeps the dense path.
The module registers itself as the ``triton`` codegen's FlexAttention template (loopir's
``FLEX_ATTENTION_TEMPLATES``), which kiln looks up by the compile's codegen.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence

import sympy
import torch
from kiln_loopir.ir import ComputedBuffer, InputBuffer, Pointwise, ReinterpretView
from kiln_loopir.lowerings.higher_order import (
    FlexAttentionTemplate,
    register_flex_attention_template,
)
from kiln_loopir.ops_spec import OPS, result_dtype
from kiln_loopir.virtualized import MissingOpError, set_ops_handler

from .kernel import _MATH, TVal, _next_pow2, interpreting, literal, tl_dtype
from .launcher import TritonCompileError, _source_path
from .printer import texpr

__all__ = ["FlexAttentionKernel", "FlexModError", "unsupported_reason"]

_LN2 = math.log(2.0)
#: input dtypes the kernel takes (float64 stays on the dense path)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: largest head dim kept in registers
MAX_HEAD_DIM = 256


def gpu_tiles(dtype: torch.dtype, head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M query rows, BLOCK_N keys, warps, pipeline stages) on a GPU, by what fits an
    H100/H200's registers and shared memory (torch's flex defaults for sm_90 are alike):
    128 x 64 tiles for 16-bit inputs up to head dim 128, smaller for float32 and dim 256."""
    if dtype == torch.float32:
        return 64, 32, 4, 2
    if head_dim <= 64:
        return 128, 64, 4, 3
    if head_dim <= 128:
        return 128, 64, 8, 3
    return 64, 32, 4, 2


class FlexModError(Exception):
    """A score_mod/mask_mod the template cannot emit inline (the dense path takes it)."""


def unsupported_reason(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       block_sizes: tuple[int, int], interpret: bool) -> str | None:
    """Why the fused kernel does not take these inputs (None: it does)."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return "inputs are not [B, H, L, D]"
    if query.dtype not in DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        return f"dtype {query.dtype} (fused: float16, bfloat16, float32, all alike)"
    if query.size(-1) > MAX_HEAD_DIM or value.size(-1) > MAX_HEAD_DIM:
        return f"head dim over {MAX_HEAD_DIM}"
    if query.size(1) % key.size(1) != 0:
        return "query heads not a multiple of kv heads"
    if key.size(0) not in (1, query.size(0)) or value.size(0) != key.size(0):
        return "batch sizes of query and key/value differ"
    if max(t.numel() for t in (query, key, value)) >= 2**31:
        return "over 2**31 elements (the kernel's offsets are int32)"
    if not interpret:
        q_bs, kv_bs = block_sizes
        block_m, block_n, _, _ = gpu_tiles(query.dtype, max(query.size(-1), value.size(-1)))
        if q_bs % min(block_m, q_bs) or kv_bs % min(block_n, kv_bs) or min(q_bs, kv_bs) < 16:
            return f"BlockMask block sizes {block_sizes} (fused: multiples of 16 dividing into tiles)"
        if query.size(-1) < 16 or value.size(-1) < 16:
            return "head dim under 16"
    return None


# ------------------------------------------------------------------------------- mod emission


class ModEmitter:
    """Ops handler emitting one lowered mod's loop body as Triton lines over the tile.

    ``inputs`` names what the mod's first placeholders are in the kernel (the score tile,
    ``off_b``, ``off_h``, the query/key index vectors); later placeholders are captured
    tensors, read through the pointer arguments ``tables`` (loads masked by ``valid``, the
    tile's in-range mask: a padded row's index may point outside a table)."""

    def __init__(self, prefix: str, inputs: dict[str, TVal], tables: dict[str, str], valid: str):
        self.prefix = prefix
        self.registers: dict[str, TVal] = dict(inputs)
        self.tables = tables
        self.valid = valid
        self.lines: list[str] = []
        self.names: dict[str, str] = {}
        self._tmp = 0
        self._ind = 0

    def _value(self, expr: str, dtype: torch.dtype) -> TVal:
        name = f"{self.prefix}{self._tmp}"
        self._tmp += 1
        self.lines.append(f"{name} = {expr}")
        return TVal(name, dtype, "xr")

    def _index(self, index) -> str:
        return texpr(sympy.sympify(index), self.names)

    def load(self, name: str, index) -> TVal:
        if name in self.registers:
            return self.registers[name]
        if name not in self.tables:
            raise FlexModError(f"load of {name}, which the mod does not have")
        ptr, dtype = self.tables[name]
        index = sympy.sympify(index)
        if index.free_symbols:
            # (``tile0``: zeros as wide as the tile, so a gather by ``h`` alone is masked too)
            return self._value(f"tl.load({ptr} + ({self._index(index)}) + tile0, {self.valid}, "
                               "other=0)", dtype)
        return self._value(f"tl.load({ptr} + ({self._index(index)}))", dtype)

    def store(self, name: str, index, value: TVal, mode=None) -> None:
        if mode is not None:
            raise FlexModError(f"store mode {mode!r} in a mod")
        self.registers[name] = value

    def index_expr(self, expr, dtype) -> TVal:
        return self._value(f"tl.full([], {self._index(expr)}, {tl_dtype(dtype)})"
                           if not sympy.sympify(expr).free_symbols
                           else f"({self._index(expr)}).to({tl_dtype(dtype)})", dtype)

    def indirect_indexing(self, x: TVal, size, check=True) -> sympy.Symbol:
        sym = sympy.Symbol(f"ind{self._ind}", integer=True, nonnegative=True)
        self._ind += 1
        v = self._value(f"tl.where({x.name} < 0, {x.name} + {self._index(size)}, {x.name})", x.dtype)
        self.names[sym.name] = v.name
        return sym

    def constant(self, value, dtype) -> TVal:
        return self._value(f"tl.full([], {literal(value, dtype)}, {tl_dtype(dtype)})", dtype)

    def to_dtype(self, x: TVal, dtype, src_dtype=None) -> TVal:
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:
            return self._value(f"{x.name} != 0", dtype)
        return self._value(f"{x.name}.to({tl_dtype(dtype)})", dtype)

    def where(self, cond: TVal, a: TVal, b: TVal) -> TVal:
        return self._value(f"tl.where({cond.name}, {a.name}, {b.name})", a.dtype)

    def __getattr__(self, name):
        if name.startswith("_") or name not in OPS:
            raise AttributeError(name)
        fmt = _MATH.get(name)
        if fmt is None:
            raise FlexModError(f"op {name!r} in a mod")

        def op(*args):
            vals = [a for a in args if isinstance(a, TVal)]
            out = result_dtype(name, [v.dtype for v in vals])
            return self._value(fmt(*[v.name for v in vals], dtype=vals[0].dtype), out)

        return op


def _lower_mod(gm: torch.fx.GraphModule, example: list[torch.Tensor]):
    """loopir's graph of a mod, decomposed to aotgrad's core ops first (a joint graph holds
    backward ops such as ``tanh_backward``, made by torch's autograd of the operator)."""
    import kiln_aotgrad
    import kiln_loopir
    from torch.fx.experimental.proxy_tensor import make_fx

    # (one tensor object per placeholder: make_fx maps a repeated object to one proxy)
    example = [t.clone() for t in example]
    try:
        gm = make_fx(gm, decomposition_table=kiln_aotgrad.core_decompositions())(*example)
        return kiln_loopir.lower(gm, example)
    except Exception as e:  # an op loopir cannot lower as a 0-d loop: not inline-able
        raise FlexModError(f"lowering the mod: {type(e).__name__}: {e}") from e


def emit_mod(gm: torch.fx.GraphModule, example: list[torch.Tensor], prefix: str,
             inputs: list[TVal], table_ptrs: list[str], valid: str,
             ) -> tuple[list[str], TVal, dict[str, torch.Tensor]]:
    """(Triton lines, the result, constants by pointer name) of ``gm`` applied to ``inputs``
    then its tables. Tensors the mod holds as constants (not lifted to inputs) are pointer
    arguments too, named ``<prefix>C<i>``."""
    graph = _lower_mod(gm, example)
    constants = {f"{prefix}C{i}": value.contiguous() for i, value in enumerate(graph.constants.values())}
    names = [b.name for b in graph.inputs]
    positions = graph.input_positions
    regs, tables = {}, {}
    for pos, idx in enumerate(positions):
        if idx is None:
            continue
        if pos < len(inputs):
            regs[names[idx]] = inputs[pos]
        else:
            tables[names[idx]] = (table_ptrs[pos - len(inputs)], example[pos].dtype)
    for ptr, name in zip(constants, graph.constants, strict=True):
        tables[name] = (ptr, constants[ptr].dtype)
    em = ModEmitter(prefix, regs, tables, valid)
    with set_ops_handler(em):
        for buf in graph.buffers:
            if not isinstance(buf, ComputedBuffer) or not isinstance(buf.data, Pointwise) \
                    or buf.data.ranges:
                raise FlexModError(f"{type(buf).__name__} {buf.name} is not a 0-d pointwise value")
            try:
                buf.store_body()([])
            except MissingOpError as e:
                raise FlexModError(str(e)) from e
    # one value; a joint graph's other outputs (gradients of the indices, of tables that
    # need none) are None
    if not graph.outputs or any(o is not None for o in graph.outputs[1:]):
        raise FlexModError(f"outputs {graph.outputs} (one value expected)")
    out = graph.outputs[0]
    out = out.data if isinstance(out, ReinterpretView) else out
    if not isinstance(out, (ComputedBuffer, InputBuffer)) or out.name not in em.registers:
        raise FlexModError(f"output {out!r} is not a value of the mod")
    return em.lines, em.registers[out.name], constants


# ------------------------------------------------------------------------------- the template

_TEMPLATE = '''
import triton
import triton.language as tl
{kmath}


@triton.jit
def _tile(q, K, V, k_base, v_base, off_b, off_h, offs_m, offs_d, offs_dv, start_n, m_i, l_i, acc,
          L, S, skn, skd, svn, svd, SCALE, {tables}
          D: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr,
          APPLY_MASK: tl.constexpr, IEEE: tl.constexpr):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = tl.load(K + k_base + offs_n[None, :] * skn + offs_d[:, None] * skd,
                (offs_n[None, :] < S) & (offs_d[:, None] < D), other=0.0)
    if IEEE:
        qk = tl.dot(q, k, input_precision="ieee")
    else:
        qk = tl.dot(q, k)
    score = qk * SCALE
    q_idx = offs_m[:, None]
    kv_idx = offs_n[None, :]
    valid = (q_idx < L) & (kv_idx < S)
    tile0 = q_idx * 0 + kv_idx * 0
{score_mod}
    s = {score_out}.to(tl.float32)
    if APPLY_MASK:
{mask_mod}
        valid = valid & ({mask_out} != 0)
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(V + v_base + offs_n[:, None] * svn + offs_dv[None, :] * svd,
                (offs_n[:, None] < S) & (offs_dv[None, :] < DV), other=0.0)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _blocks(q, K, V, k_base, v_base, off_b, off_h, offs_m, offs_d, offs_dv, m_i, l_i, acc,
            NUM, IDX, n_off, i_off, sin, SPARSE_KV, SUBS,
            L, S, skn, skd, svn, svd, SCALE, {tables}
            D: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr,
            APPLY_MASK: tl.constexpr, IEEE: tl.constexpr):
    # one flat loop over (listed block, tile in it), so Triton pipelines the loads across
    # blocks; SUBS tiles per block (a block past S is cut to S: torch's empty mask is one
    # block of 2**30)
    nb = tl.load(NUM + n_off)
    for it in range(0, nb * SUBS):
        j = it // SUBS
        start_n = tl.load(IDX + i_off + j * sin) * SPARSE_KV + (it - j * SUBS) * BLOCK_N
        m_i, l_i, acc = _tile(q, K, V, k_base, v_base, off_b, off_h, offs_m, offs_d, offs_dv,
                              start_n, m_i, l_i, acc, L, S, skn, skd, svn, svd, SCALE,
                              {table_args} D, DV, BLOCK_N, APPLY_MASK, IEEE)
    return m_i, l_i, acc


@triton.jit
def kiln_kernel(Q, K, V, OUT, LSE, MAXS, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, {tables}
                L, S, HQ, GROUPS, SCALE, SPARSE_Q, SPARSE_KV, SUBS,
                sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                sob, soh, som, sod,
                snb, snh, snm, sib, sih, sim, sin, sfnb, sfnh, sfnm, sfib, sfih, sfim, sfin,
                D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_FULL: tl.constexpr,
                IEEE: tl.constexpr):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // HQ
    off_h = off_bh % HQ
    off_hkv = off_h // GROUPS
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(Q + off_b * sqb + off_h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                (offs_m[:, None] < L) & (offs_d[None, :] < D), other=0.0)
    k_base = off_b * skb + off_hkv * skh
    v_base = off_b * svb + off_hkv * svh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    q_blk = (start_m * BLOCK_M) // SPARSE_Q
    m_i, l_i, acc = _blocks(q, K, V, k_base, v_base, off_b, off_h, offs_m, offs_d, offs_dv,
                            m_i, l_i, acc, KV_NUM, KV_IDX, off_b * snb + off_h * snh + q_blk * snm,
                            off_b * sib + off_h * sih + q_blk * sim, sin, SPARSE_KV, SUBS,
                            L, S, skn, skd, svn, svd, SCALE, {table_args} D, DV, BLOCK_N, True, IEEE)
    if HAS_FULL:
        m_i, l_i, acc = _blocks(q, K, V, k_base, v_base, off_b, off_h, offs_m, offs_d, offs_dv,
                                m_i, l_i, acc, FULL_NUM, FULL_IDX,
                                off_b * sfnb + off_h * sfnh + q_blk * sfnm,
                                off_b * sfib + off_h * sfih + q_blk * sfim, sfin, SPARSE_KV, SUBS,
                                L, S, skn, skd, svn, svd, SCALE, {table_args} D, DV, BLOCK_N, False,
                                IEEE)
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    row = offs_m < L
    tl.store(OUT + off_b * sob + off_h * soh + offs_m[:, None] * som + offs_dv[None, :] * sod,
             out.to(OUT.dtype.element_ty), (offs_m[:, None] < L) & (offs_dv[None, :] < DV))
    lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log(l_safe))
    tl.store(LSE + off_bh * L + offs_m, lse / {ln2!r}, row)
    tl.store(MAXS + off_bh * L + offs_m, m_i / {ln2!r}, row)
'''


#: source -> (module, path): identical kernels (a model's repeated layers) load once
_MODULES: dict[str, tuple] = {}


def _load(name: str, source: str):
    """Import a generated kernel module from the on-disk source cache (Triton reads a
    ``@triton.jit`` function's source from its file)."""
    if source not in _MODULES:
        path = _source_path(name, source)
        try:
            spec = importlib.util.spec_from_file_location(f"kiln_triton_{name}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except Exception as e:
            raise TritonCompileError(name, path, f"{type(e).__name__}: {e}") from e
        _MODULES[source] = (module, path)
    return _MODULES[source]


def _indent(lines: list[str], n: int) -> str:
    return "\n".join(" " * n + ln for ln in lines) or " " * n + "pass"


def _example(meta) -> torch.Tensor:
    """A real, contiguous example value for a mod placeholder (loopir indexes tables by the
    layouts it lowers with; the kernel is passed contiguous tables)."""
    return torch.zeros(tuple(int(s) for s in meta.shape), dtype=meta.dtype)


def _constants_on(kernel, device: torch.device) -> list[torch.Tensor]:
    """A kernel's mod constants on ``device``, copied there once (not at every call)."""
    cache = kernel.__dict__.setdefault("_constants_on_device", {})
    if str(device) not in cache:
        cache[str(device)] = [c.to(device) for c in kernel.constants.values()]
    return cache[str(device)]


def out_like(query: torch.Tensor, value_dim: int) -> torch.Tensor:
    """The operator's output: the query's dim order (stride-descending), last dim innermost."""
    shape = (*query.shape[:-1], value_dim)
    order = sorted(range(3), key=lambda d: -query.stride(d)) + [3]
    return torch.empty_permuted(shape, order, dtype=query.dtype, device=query.device)


def _bm_strides(t: torch.Tensor | None, n: int) -> list[int]:
    """A block-mask tensor's strides, 0 along a broadcast (size-1) batch/head dim."""
    if t is None:
        return [0] * n
    return [0 if t.size(i) == 1 and i < 2 else t.stride(i) for i in range(n)]


class FlexAttentionKernel:
    """A generated, loaded forward kernel for one flex_attention node; called with the
    node's tensors it returns ``(out, logsumexp / ln 2, max / ln 2)``."""

    def __init__(self, score_gm: torch.fx.GraphModule, mask_gm: torch.fx.GraphModule,
                 score_tables: Sequence, mask_tables: Sequence, dtype: torch.dtype,
                 head_dim: int, value_dim: int, interpret: bool | None = None):
        self.interpret = interpreting() if interpret is None else interpret
        self.n_score, self.n_mask = len(score_tables), len(mask_tables)
        self.head_dim, self.value_dim = head_dim, value_dim
        self.dtype = dtype
        s_ptrs = [f"ST{i}" for i in range(self.n_score)]
        m_ptrs = [f"MT{i}" for i in range(self.n_mask)]
        grid = [TVal("off_b", torch.int32), TVal("off_h", torch.int32),
                TVal("q_idx", torch.int32), TVal("kv_idx", torch.int32)]
        i32 = torch.zeros((), dtype=torch.int32)
        score_lines, score_out, s_consts = emit_mod(
            score_gm, [torch.zeros(()), i32, i32, i32, i32, *map(_example, score_tables)],
            "sm", [TVal("score", torch.float32), *grid], s_ptrs, "valid")
        mask_lines, mask_out, m_consts = emit_mod(
            mask_gm, [i32, i32, i32, i32, *map(_example, mask_tables)], "mm", grid, m_ptrs, "valid")
        self.constants = {**s_consts, **m_consts}
        tables = "".join(f"{p}, " for p in [*s_ptrs, *m_ptrs, *self.constants])
        kmath = ("from kiln_codegen_triton import interp_math as kmath" if self.interpret
                 else "from triton.language.extra import libdevice as kmath")
        self.source = _TEMPLATE.format(
            kmath=kmath, tables=tables, table_args=tables, ln2=_LN2,
            score_mod=_indent(score_lines, 4), score_out=score_out.name,
            mask_mod=_indent(mask_lines, 8), mask_out=mask_out.name)
        module, self.path = _load("flex_attention", self.source)
        self.kernel = module.kiln_kernel

    def tiles(self, sparse_q: int, sparse_kv: int) -> tuple[int, int, dict]:
        """(BLOCK_M, BLOCK_N, launch options) for these BlockMask block sizes."""
        if self.interpret:  # small tiles: the interpreter's cost grows with tile size
            return _next_pow2(min(sparse_q, 16)), _next_pow2(min(sparse_kv, 16)), {}
        block_m, block_n, warps, stages = gpu_tiles(self.dtype, max(self.head_dim, self.value_dim))
        return (min(block_m, sparse_q), min(block_n, sparse_kv),
                {"num_warps": warps, "num_stages": stages})

    def __call__(self, query, key, value, kv_num, kv_idx, full_num, full_idx, sparse_q: int,
                 sparse_kv: int, scale: float, score_tables: Sequence, mask_tables: Sequence):
        B, HQ, L, D = query.shape
        S, DV = key.size(2), value.size(3)
        out = out_like(query, DV)
        lse = torch.empty((B, HQ, L), dtype=torch.float32, device=query.device)
        maxs = torch.empty((B, HQ, L), dtype=torch.float32, device=query.device)
        block_m, block_n, launch = self.tiles(sparse_q, sparse_kv)
        if sparse_q % block_m or sparse_kv % block_n:
            raise ValueError(f"block sizes {(sparse_q, sparse_kv)} do not divide into "
                             f"tiles {(block_m, block_n)}")
        kb = 0 if key.size(0) == 1 else key.stride(0)
        vb = 0 if value.size(0) == 1 else value.stride(0)
        has_full = full_num is not None
        tables = [t.contiguous() for t in (*score_tables, *mask_tables)]
        tables += _constants_on(self, query.device)
        grid = (triton_cdiv(L, block_m), B * HQ)
        self.kernel[grid](
            query, key, value, out, lse, maxs, kv_num, kv_idx,
            full_num if has_full else kv_num, full_idx if has_full else kv_idx, *tables,
            L, S, HQ, HQ // key.size(1), float(scale), sparse_q, sparse_kv,
            triton_cdiv(min(sparse_kv, S), block_n),
            *query.stride(), kb, *key.stride()[1:], vb, *value.stride()[1:], *out.stride(),
            *_bm_strides(kv_num, 3), *_bm_strides(kv_idx, 4),
            *_bm_strides(full_num, 3), *_bm_strides(full_idx, 4),
            D=D, DV=DV, BLOCK_M=block_m, BLOCK_N=block_n,
            BLOCK_D=max(16, _next_pow2(D)), BLOCK_DV=max(16, _next_pow2(DV)),
            HAS_FULL=has_full, IEEE=query.dtype == torch.float32, **launch)
        return out, lse, maxs


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _unsupported(query, key, value, block_sizes) -> str | None:
    return unsupported_reason(query, key, value, block_sizes, interpreting())


def _build(score_gm, mask_gm, score_tables, mask_tables, query, key, value) -> FlexAttentionKernel:
    return FlexAttentionKernel(score_gm, mask_gm, score_tables, mask_tables, query.dtype,
                               query.size(-1), value.size(-1))




# ------------------------------------------------------------------------------- the backward
# Two kernels, as flash attention's: ``kiln_kernel_dq`` per BLOCK_M query rows walks the same
# kv block lists as the forward; ``kiln_kernel`` (dk, dv) per BLOCK_N keys of one kv head walks
# the BlockMask's transposed lists (``q_num_blocks``/``q_indices``, then ``full_q_*``) for each
# query head of its group. Both recompute the scores (score_mod, mask_mod inline), the
# probabilities from the forward's logsumexp, and the score gradient through score_mod by the
# operator's joint graph (inline too: its inputs are the score, the indices and the gradient
# of score_mod's output). ``delta = rowsum(dO * O)`` (minus the logsumexp's own gradient) is
# computed by torch before them.

_BWD_TEMPLATE = '''
import triton
import triton.language as tl
{kmath}


@triton.jit
def _dq_tile(q, do, lse, delta, K, V, k_base, v_base, off_b, off_h, offs_m, offs_d, offs_dv,
             start_n, dq, L, S, skn, skd, svn, svd, SCALE, {tables}
             D: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr,
             APPLY_MASK: tl.constexpr, IEEE: tl.constexpr):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kT = tl.load(K + k_base + offs_n[None, :] * skn + offs_d[:, None] * skd,
                 (offs_n[None, :] < S) & (offs_d[:, None] < D), other=0.0)
    vT = tl.load(V + v_base + offs_n[None, :] * svn + offs_dv[:, None] * svd,
                 (offs_n[None, :] < S) & (offs_dv[:, None] < DV), other=0.0)
    if IEEE:
        qk = tl.dot(q, kT, input_precision="ieee")
        dp = tl.dot(do, vT, input_precision="ieee")
    else:
        qk = tl.dot(q, kT)
        dp = tl.dot(do, vT)
    score = qk * SCALE
    q_idx = offs_m[:, None]
    kv_idx = offs_n[None, :]
    valid = (q_idx < L) & (kv_idx < S)
    tile0 = q_idx * 0 + kv_idx * 0
{score_mod}
    s = {score_out}.to(tl.float32)
    if APPLY_MASK:
{mask_mod}
        valid = valid & ({mask_out} != 0)
    p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
    grad = p * (dp - delta[:, None])
{joint_mod}
    g = tl.where(valid, {joint_out}.to(tl.float32), 0.0)
    if IEEE:
        dq += tl.dot(g.to(kT.dtype), tl.trans(kT), input_precision="ieee")
    else:
        dq += tl.dot(g.to(kT.dtype), tl.trans(kT))
    return dq


@triton.jit
def _kv_tile(k, v, Q, DO, LSE, DELTA, q_base, do_base, r_base, off_b, off_h, offs_n, offs_d,
             offs_dv, start_m, dk, dv, L, S, sqm, sqd, sdm, sdd, SCALE, {tables}
             D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr,
             APPLY_MASK: tl.constexpr, IEEE: tl.constexpr):
    offs_m = start_m + tl.arange(0, BLOCK_M)
    qT = tl.load(Q + q_base + offs_m[None, :] * sqm + offs_d[:, None] * sqd,
                 (offs_m[None, :] < L) & (offs_d[:, None] < D), other=0.0)
    do = tl.load(DO + do_base + offs_m[:, None] * sdm + offs_dv[None, :] * sdd,
                 (offs_m[:, None] < L) & (offs_dv[None, :] < DV), other=0.0)
    lse = tl.load(LSE + r_base + offs_m, offs_m < L, other=0.0)
    delta = tl.load(DELTA + r_base + offs_m, offs_m < L, other=0.0)
    if IEEE:
        qkT = tl.dot(k, qT, input_precision="ieee")
        dpT = tl.dot(v, tl.trans(do), input_precision="ieee")
    else:
        qkT = tl.dot(k, qT)
        dpT = tl.dot(v, tl.trans(do))
    score = qkT * SCALE
    q_idx = offs_m[None, :]
    kv_idx = offs_n[:, None]
    valid = (q_idx < L) & (kv_idx < S)
    tile0 = q_idx * 0 + kv_idx * 0
{score_mod}
    s = {score_out}.to(tl.float32)
    if APPLY_MASK:
{mask_mod}
        valid = valid & ({mask_out} != 0)
    pT = tl.where(valid, tl.exp(s - lse[None, :]), 0.0)
    grad = pT * (dpT - delta[None, :])
{joint_mod}
    g = tl.where(valid, {joint_out}.to(tl.float32), 0.0)
    if IEEE:
        dv += tl.dot(pT.to(do.dtype), do, input_precision="ieee")
        dk += tl.dot(g.to(qT.dtype), tl.trans(qT), input_precision="ieee")
    else:
        dv += tl.dot(pT.to(do.dtype), do)
        dk += tl.dot(g.to(qT.dtype), tl.trans(qT))
    return dk, dv


@triton.jit
def kiln_kernel_dq(Q, K, V, DO, LSE, DELTA, DQ, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, {tables}
                   L, S, HQ, GROUPS, SCALE, SPARSE_Q, SPARSE_KV, SUBS,
                   sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                   sdb, sdh, sdm, sdd, sgb, sgh, sgm, sgd,
                   snb, snh, snm, sib, sih, sim, sin, sfnb, sfnh, sfnm, sfib, sfih, sfim, sfin,
                   D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                   HAS_FULL: tl.constexpr, IEEE: tl.constexpr):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // HQ
    off_h = off_bh % HQ
    off_hkv = off_h // GROUPS
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    rows = offs_m[:, None] < L
    q = tl.load(Q + off_b * sqb + off_h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                rows & (offs_d[None, :] < D), other=0.0)
    do = tl.load(DO + off_b * sdb + off_h * sdh + offs_m[:, None] * sdm + offs_dv[None, :] * sdd,
                 rows & (offs_dv[None, :] < DV), other=0.0)
    lse = tl.load(LSE + off_bh * L + offs_m, offs_m < L, other=0.0)
    delta = tl.load(DELTA + off_bh * L + offs_m, offs_m < L, other=0.0)
    k_base = off_b * skb + off_hkv * skh
    v_base = off_b * svb + off_hkv * svh
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    q_blk = (start_m * BLOCK_M) // SPARSE_Q
    nb = tl.load(KV_NUM + off_b * snb + off_h * snh + q_blk * snm)
    i_off = off_b * sib + off_h * sih + q_blk * sim
    for it in range(0, nb * SUBS):
        j = it // SUBS
        start_n = tl.load(KV_IDX + i_off + j * sin) * SPARSE_KV + (it - j * SUBS) * BLOCK_N
        dq = _dq_tile(q, do, lse, delta, K, V, k_base, v_base, off_b, off_h, offs_m, offs_d,
                      offs_dv, start_n, dq, L, S, skn, skd, svn, svd, SCALE, {table_args}
                      D, DV, BLOCK_N, True, IEEE)
    if HAS_FULL:
        nb = tl.load(FULL_NUM + off_b * sfnb + off_h * sfnh + q_blk * sfnm)
        i_off = off_b * sfib + off_h * sfih + q_blk * sfim
        for it in range(0, nb * SUBS):
            j = it // SUBS
            start_n = tl.load(FULL_IDX + i_off + j * sfin) * SPARSE_KV + (it - j * SUBS) * BLOCK_N
            dq = _dq_tile(q, do, lse, delta, K, V, k_base, v_base, off_b, off_h, offs_m, offs_d,
                          offs_dv, start_n, dq, L, S, skn, skd, svn, svd, SCALE, {table_args}
                          D, DV, BLOCK_N, False, IEEE)
    tl.store(DQ + off_b * sgb + off_h * sgh + offs_m[:, None] * sgm + offs_d[None, :] * sgd,
             (dq * SCALE).to(DQ.dtype.element_ty), rows & (offs_d[None, :] < D))


@triton.jit
def kiln_kernel(Q, K, V, DO, LSE, DELTA, DK, DV_, Q_NUM, Q_IDX, FULL_NUM, FULL_IDX, {tables}
                L, S, HQ, HKV, GROUPS, SCALE, SPARSE_Q, SPARSE_KV, SUBS,
                sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                sdb, sdh, sdm, sdd, skgb, skgh, skgn, skgd, svgb, svgh, svgn, svgd,
                snb, snh, snm, sib, sih, sim, sin, sfnb, sfnh, sfnm, sfib, sfih, sfim, sfin,
                D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                HAS_FULL: tl.constexpr, IEEE: tl.constexpr):
    start_n = tl.program_id(0)
    off_bk = tl.program_id(1)
    off_b = off_bk // HKV
    off_hkv = off_bk % HKV
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    cols = offs_n[:, None] < S
    k = tl.load(K + off_b * skb + off_hkv * skh + offs_n[:, None] * skn + offs_d[None, :] * skd,
                cols & (offs_d[None, :] < D), other=0.0)
    v = tl.load(V + off_b * svb + off_hkv * svh + offs_n[:, None] * svn + offs_dv[None, :] * svd,
                cols & (offs_dv[None, :] < DV), other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    kv_blk = (start_n * BLOCK_N) // SPARSE_KV
    for g in range(0, GROUPS):
        off_h = off_hkv * GROUPS + g
        q_base = off_b * sqb + off_h * sqh
        do_base = off_b * sdb + off_h * sdh
        r_base = (off_b * HQ + off_h) * L
        nb = tl.load(Q_NUM + off_b * snb + off_h * snh + kv_blk * snm)
        i_off = off_b * sib + off_h * sih + kv_blk * sim
        for it in range(0, nb * SUBS):
            j = it // SUBS
            start_m = tl.load(Q_IDX + i_off + j * sin) * SPARSE_Q + (it - j * SUBS) * BLOCK_M
            dk, dv = _kv_tile(k, v, Q, DO, LSE, DELTA, q_base, do_base, r_base, off_b, off_h,
                              offs_n, offs_d, offs_dv, start_m, dk, dv, L, S, sqm, sqd, sdm, sdd,
                              SCALE, {table_args} D, DV, BLOCK_M, True, IEEE)
        if HAS_FULL:
            nb = tl.load(FULL_NUM + off_b * sfnb + off_h * sfnh + kv_blk * sfnm)
            i_off = off_b * sfib + off_h * sfih + kv_blk * sfim
            for it in range(0, nb * SUBS):
                j = it // SUBS
                start_m = tl.load(FULL_IDX + i_off + j * sfin) * SPARSE_Q + (it - j * SUBS) * BLOCK_M
                dk, dv = _kv_tile(k, v, Q, DO, LSE, DELTA, q_base, do_base, r_base, off_b, off_h,
                                  offs_n, offs_d, offs_dv, start_m, dk, dv, L, S, sqm, sqd, sdm,
                                  sdd, SCALE, {table_args} D, DV, BLOCK_M, False, IEEE)
    tl.store(DK + off_b * skgb + off_hkv * skgh + offs_n[:, None] * skgn + offs_d[None, :] * skgd,
             (dk * SCALE).to(DK.dtype.element_ty), cols & (offs_d[None, :] < D))
    tl.store(DV_ + off_b * svgb + off_hkv * svgh + offs_n[:, None] * svgn + offs_dv[None, :] * svgd,
             dv.to(DV_.dtype.element_ty), cols & (offs_dv[None, :] < DV))
'''


def gpu_bwd_tiles(dtype: torch.dtype, head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, warps, stages) of both backward kernels on a GPU: each holds two
    accumulators (dk and dv) or recomputes two dots per tile, so tiles are smaller than the
    forward's."""
    if dtype == torch.float32 or head_dim > 128:
        return 32, 32, 4, 2
    return 64, 64, 4, 3


class FlexAttentionBackwardKernel:
    """The generated backward of one flex_attention node: called with the node's tensors it
    returns ``(dq, dk, dv)``. Gradients of captured tables are not computed here (a call
    whose tables need grad keeps the dense rule)."""

    def __init__(self, score_gm: torch.fx.GraphModule, joint_gm: torch.fx.GraphModule,
                 mask_gm: torch.fx.GraphModule, score_tables: Sequence, mask_tables: Sequence,
                 dtype: torch.dtype, head_dim: int, value_dim: int, interpret: bool | None = None):
        self.interpret = interpreting() if interpret is None else interpret
        self.dtype, self.head_dim, self.value_dim = dtype, head_dim, value_dim
        s_ptrs = [f"ST{i}" for i in range(len(score_tables))]
        m_ptrs = [f"MT{i}" for i in range(len(mask_tables))]
        grid = [TVal("off_b", torch.int32), TVal("off_h", torch.int32),
                TVal("q_idx", torch.int32), TVal("kv_idx", torch.int32)]
        i32 = torch.zeros((), dtype=torch.int32)
        s_examples = list(map(_example, score_tables))
        score_lines, score_out, s_consts = emit_mod(
            score_gm, [torch.zeros(()), i32, i32, i32, i32, *s_examples],
            "sm", [TVal("score", torch.float32), *grid], s_ptrs, "valid")
        mask_lines, mask_out, m_consts = emit_mod(
            mask_gm, [i32, i32, i32, i32, *map(_example, mask_tables)], "mm", grid, m_ptrs, "valid")
        # the joint graph reads the same tables as score_mod (its constants get their own)
        joint_lines, joint_out, j_consts = emit_mod(
            joint_gm, [torch.zeros(()), i32, i32, i32, i32, torch.zeros(()), *s_examples],
            "jm", [TVal("score", torch.float32), *grid, TVal("grad", torch.float32)], s_ptrs, "valid")
        self.constants = {**s_consts, **m_consts, **j_consts}  # (named by their mod's prefix)
        tables = "".join(f"{p}, " for p in [*s_ptrs, *m_ptrs, *self.constants])
        kmath = ("from kiln_codegen_triton import interp_math as kmath" if self.interpret
                 else "from triton.language.extra import libdevice as kmath")
        self.source = _BWD_TEMPLATE.format(
            kmath=kmath, tables=tables, table_args=tables,
            score_mod=_indent(score_lines, 4), score_out=score_out.name,
            mask_mod=_indent(mask_lines, 8), mask_out=mask_out.name,
            joint_mod=_indent(joint_lines, 4), joint_out=joint_out.name)
        module, self.path = _load("flex_attention_backward", self.source)
        self.kernel, self.dq_kernel = module.kiln_kernel, module.kiln_kernel_dq

    def tiles(self, sparse_q: int, sparse_kv: int) -> tuple[int, int, dict]:
        if self.interpret:
            return _next_pow2(min(sparse_q, 16)), _next_pow2(min(sparse_kv, 16)), {}
        block_m, block_n, warps, stages = gpu_bwd_tiles(self.dtype, max(self.head_dim, self.value_dim))
        return (min(block_m, sparse_q), min(block_n, sparse_kv),
                {"num_warps": warps, "num_stages": stages})

    def __call__(self, query, key, value, out, lse, grad_out, grad_lse, kv_num, kv_idx, full_kv_num,
                 full_kv_idx, q_num, q_idx, full_q_num, full_q_idx, sparse_q: int, sparse_kv: int,
                 scale: float, score_tables: Sequence, mask_tables: Sequence):
        B, HQ, L, D = query.shape
        HKV, S, DV = key.size(1), key.size(2), value.size(3)
        block_m, block_n, launch = self.tiles(sparse_q, sparse_kv)
        if sparse_q % block_m or sparse_kv % block_n:
            raise ValueError(f"block sizes {(sparse_q, sparse_kv)} do not divide into "
                             f"tiles {(block_m, block_n)}")
        # natural-log logsumexp, 0 on fully masked rows (their probabilities are all 0)
        lse = lse.float() * _LN2
        lse = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse).contiguous()
        delta = (grad_out.float() * out.float()).sum(-1)
        if grad_lse is not None:
            delta = delta - grad_lse.float() / _LN2
        delta = delta.contiguous()
        dq = torch.empty_like(query)
        dk = torch.empty((B, HKV, S, D), dtype=key.dtype, device=key.device)
        dv = torch.empty((B, HKV, S, DV), dtype=value.dtype, device=value.device)
        kb = 0 if key.size(0) == 1 else key.stride(0)
        vb = 0 if value.size(0) == 1 else value.stride(0)
        tables = [t.contiguous() for t in (*score_tables, *mask_tables)]
        tables += _constants_on(self, query.device)
        consts = dict(D=D, DV=DV, BLOCK_M=block_m, BLOCK_N=block_n,
                      BLOCK_D=max(16, _next_pow2(D)), BLOCK_DV=max(16, _next_pow2(DV)),
                      IEEE=query.dtype == torch.float32, **launch)
        has_full = full_kv_num is not None
        self.dq_kernel[(triton_cdiv(L, block_m), B * HQ)](
            query, key, value, grad_out, lse, delta, dq, kv_num, kv_idx,
            full_kv_num if has_full else kv_num, full_kv_idx if has_full else kv_idx, *tables,
            L, S, HQ, HQ // HKV, float(scale), sparse_q, sparse_kv,
            triton_cdiv(min(sparse_kv, S), block_n),
            *query.stride(), kb, *key.stride()[1:], vb, *value.stride()[1:], *grad_out.stride(),
            *dq.stride(), *_bm_strides(kv_num, 3), *_bm_strides(kv_idx, 4),
            *_bm_strides(full_kv_num, 3), *_bm_strides(full_kv_idx, 4), HAS_FULL=has_full, **consts)
        has_full = full_q_num is not None
        self.kernel[(triton_cdiv(S, block_n), B * HKV)](
            query, key, value, grad_out, lse, delta, dk, dv, q_num, q_idx,
            full_q_num if has_full else q_num, full_q_idx if has_full else q_idx, *tables,
            L, S, HQ, HKV, HQ // HKV, float(scale), sparse_q, sparse_kv,
            triton_cdiv(min(sparse_q, L), block_m),
            *query.stride(), kb, *key.stride()[1:], vb, *value.stride()[1:], *grad_out.stride(),
            *dk.stride(), *dv.stride(), *_bm_strides(q_num, 3), *_bm_strides(q_idx, 4),
            *_bm_strides(full_q_num, 3), *_bm_strides(full_q_idx, 4), HAS_FULL=has_full, **consts)
        if key.size(0) == 1 and B > 1:  # key/value broadcast over the batch
            dk, dv = dk.sum(0, keepdim=True), dv.sum(0, keepdim=True)
        return dq, dk, dv


def _build_backward(score_gm, joint_gm, mask_gm, score_tables, mask_tables, query, key, value,
                    ) -> FlexAttentionBackwardKernel:
    return FlexAttentionBackwardKernel(score_gm, joint_gm, mask_gm, score_tables, mask_tables,
                                       query.dtype, query.size(-1), value.size(-1))


register_flex_attention_template("triton", FlexAttentionTemplate(_unsupported, _build, _build_backward))
