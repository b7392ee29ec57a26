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
codegen-triton's value ops and spellings (``ops.TritonOps``): the score becomes the
``[BLOCK_M, BLOCK_N]`` tile, ``q_idx`` a column ``[BLOCK_M, 1]``, ``kv_idx`` a row
``[1, BLOCK_N]``, so every op broadcasts to the tile and a captured table indexed by them
(``bias[q_idx - kv_idx]``, ``slopes[h]``, ``doc[q_idx]``) is a gather from its pointer.

Grouped-query attention reads kv head ``h // (Hq // Hkv)``. Results are the operator's:
``out`` (in the query's dim order), the logsumexp and the row max, both in log2 units
(divided by ln 2), -inf on a row with every score masked (whose output is zeros).

Where this kernel does not apply (``unsupported_reason``) the caller keeps the dense path.
``flex_decoding`` registers this module's kernels, with its decoding kernel, as the ``triton``
codegen's FlexAttention template (loopir's ``FLEX_ATTENTION_TEMPLATES``), which kiln looks up
by the compile's codegen.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence

import sympy
import torch
from kiln_loopir.ir import ComputedBuffer, InputBuffer, Pointwise, ReinterpretView
from kiln_loopir.virtualized import MissingOpError, set_ops_handler

from .kernel import _next_pow2, interpreting
from .launcher import TemplateLauncher, TritonCompileError, _source_path
from .ops import TritonOps, TVal
from .printer import texpr

__all__ = ["FlexAttentionKernel", "FlexModError", "unsupported_reason"]

_LN2 = math.log(2.0)
#: input dtypes the kernel takes (float64 stays on the dense path)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: largest head dim kept in registers
MAX_HEAD_DIM = 256


def gpu_tiles(dtype: torch.dtype, head_dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_M query rows, BLOCK_N keys, warps, pipeline stages) on a GPU, by what fits an
    H100/H200's registers and shared memory: 64 x 128 tiles for 16-bit inputs up to head dim
    64, 128 x 64 up to 128, smaller for float32 and dim 256."""
    if dtype == torch.float32:
        return 64, 32, 4, 2
    if head_dim <= 64:  # (experiments/flex-attention/flex_train_sweep.py; a mod that needs
        return 64, 128, 4, 3  # more shared memory runs with fewer stages: TemplateLauncher)
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


class ModEmitter(TritonOps):
    """Ops handler emitting one lowered mod's loop body as Triton lines over the tile (its
    value ops are the kernel handler's, ``ops.TritonOps``).

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
        self.ind_cls: dict[str, str] = {}
        self.op_names: dict[str, None] = {}
        self._tmp = 0
        self._ind = 0

    def value(self, expr: str, dtype: torch.dtype, cls: str = "xr") -> TVal:
        name = f"{self.prefix}{self._tmp}"
        self._tmp += 1
        self.lines.append(f"{name} = {expr}")
        return TVal(name, dtype, cls)

    @staticmethod
    def join_cls(*vals) -> str:
        return "xr"  # every value of a mod is (broadcast to) the tile

    def _index_cls(self, index: sympy.Expr) -> str:
        return "xr" if index.free_symbols else "s"

    def _index(self, index) -> str:
        return texpr(sympy.sympify(index), self.names)

    def load(self, name: str, index) -> TVal:
        if name in self.registers:
            return self.registers[name]
        if name not in self.tables:
            raise FlexModError(f"load of {name}, which the mod does not have")
        ptr, dtype = self.tables[name]
        index = sympy.sympify(index)
        dims = {self.ind_cls.get(s.name) for s in index.free_symbols} - {"s"}
        if not dims:
            # by the batch and head alone (ALiBi's ``slopes[h]``): one value per program,
            # always in range; a gather of the whole tile from one address cost 5x the kernel
            return self.value(f"tl.load({ptr} + ({self._index(index)}))", dtype, "s")
        if dims in ({"q"}, {"kv"}):
            # by the query or the key position alone (a document id per position): one
            # vector along that side of the tile, masked where it runs past the sequence
            side = dims.pop()
            bound = "q_idx < L" if side == "q" else "kv_idx < S"
            return self.value(f"tl.load({ptr} + ({self._index(index)}), {bound}, other=0)",
                              dtype, side)
        # (``tile0``: zeros as wide as the tile, so a gather of a padded row is masked)
        return self.value(f"tl.load({ptr} + ({self._index(index)}) + tile0, {self.valid}, "
                          "other=0)", dtype)

    def store(self, name: str, index, value: TVal, mode=None) -> None:
        if mode is not None:
            raise FlexModError(f"store mode {mode!r} in a mod")
        self.registers[name] = value

    def reduction(self, dtype, src_dtype, reduction_type, value):
        raise MissingOpError("reduction", self)  # a mod is one 0-d pointwise value per buffer

    def store_reduction(self, name: str, index, value):
        raise MissingOpError("store_reduction", self)


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


# ------------------------------------------------------------------------------- shared source
# What every kernel of this module shares is written once: ``_SCORES`` (a tile's scores
# through score_mod, then mask_mod: the forward, the decoding kernel and both backward
# kernels call it, the dk/dv kernel with the tile transposed), ``_SCORE_GRAD`` (the score
# gradient through score_mod's joint graph: both backward kernels), ``_ROW_PROLOGUE`` and
# ``_FINISH`` (a query tile's setup and its normalised results: the forward, the decoding
# kernel and its combine) and ``block_walk`` (the loops over a BlockMask row's listed blocks:
# every kernel's, split over programs in the decoding kernel).

_HEADER = '''
import triton
import triton.language as tl
{kmath}


@triton.jit
def _scores(score, q_idx, kv_idx, off_b, off_h, L, S, {tables} APPLY_MASK: tl.constexpr):
    # score_mod, then (APPLY_MASK: a partial block) mask_mod, over one tile; q_idx and kv_idx
    # broadcast to it. -> (scores in float32, the tile's kept positions)
    valid = (q_idx < L) & (kv_idx < S)
    tile0 = q_idx * 0 + kv_idx * 0
{score_mod}
    s = {score_out}.to(tl.float32)
    if APPLY_MASK:
{mask_mod}
        valid = valid & ({mask_out} != 0)
    return s, valid
'''

_SCORE_GRAD = '''

@triton.jit
def _score_grad(score, grad, q_idx, kv_idx, off_b, off_h, L, S, valid, {tables}):
    # the gradient of the score through score_mod (its joint graph), 0 where masked
    tile0 = q_idx * 0 + kv_idx * 0
{joint_mod}
    return tl.where(valid, {joint_out}.to(tl.float32), 0.0)
'''

_FORWARD_TILE = '''

@triton.jit
def _tile(q, K, V, k_base, v_base, off_b, off_h, offs_m, offs_d, offs_dv, start_n, m_i, l_i, acc,
          L, S, skn, skd, svn, svd, SCALE, {tables}
          D: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr,
          APPLY_MASK: tl.constexpr, IEEE: tl.constexpr):
    # one BLOCK_N-key step of the online softmax
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = tl.load(K + k_base + offs_n[None, :] * skn + offs_d[:, None] * skd,
                (offs_n[None, :] < S) & (offs_d[:, None] < D), other=0.0)
    if IEEE:
        qk = tl.dot(q, k, input_precision="ieee")
    else:
        qk = tl.dot(q, k)
    s, valid = _scores(qk * SCALE, offs_m[:, None], offs_n[None, :], off_b, off_h, L, S,
                       {table_args} APPLY_MASK)
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
def _finish(OUT, LSE, MAXS, acc, l_i, m_i, off_b, off_h, off_bh, offs_m, offs_dv, L,
            sob, soh, som, sod, DV: tl.constexpr):
    # the normalised output, the logsumexp and the row max (both / ln 2) of finished rows
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    row = offs_m < L
    tl.store(OUT + off_b * sob + off_h * soh + offs_m[:, None] * som + offs_dv[None, :] * sod,
             out.to(OUT.dtype.element_ty), (offs_m[:, None] < L) & (offs_dv[None, :] < DV))
    lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log(l_safe))
    tl.store(LSE + off_bh * L + offs_m, lse / {ln2!r}, row)
    tl.store(MAXS + off_bh * L + offs_m, m_i / {ln2!r}, row)
'''

#: a query-tile kernel's common start (the forward's, the decoding kernel's, dq's): this
#: program's query rows, loaded, and its BlockMask row (``start_m``, ``off_bh`` set by the
#: kernel)
_ROW_PROLOGUE = '''
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
    q_blk = (start_m * BLOCK_M) // SPARSE_Q'''

#: empty online-softmax state of a forward kernel's query rows
_SOFTMAX_STATE = '''
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)'''

#: the forward kernels' arguments after the block-mask pointers and tables
_FORWARD_ARGS = '''L, S, HQ, GROUPS, SCALE, SPARSE_Q, SPARSE_KV, SUBS,
                sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                sob, soh, som, sod,
                {mask_strides}'''

#: every kernel's parameters after its strides
_KERNEL_PARAMS = dict(
    mask_strides="snb, snh, snm, sib, sih, sim, sin, sfnb, sfnh, sfnm, sfib, sfih, sfim, sfin,",
    tile_params="D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, "
                "BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_FULL: tl.constexpr, "
                "IEEE: tl.constexpr")

_FORWARD_TILE_CALL = (
    "m_i, l_i, acc = _tile(q, K, V, k_base, v_base, off_b, off_h, offs_m, offs_d, offs_dv, "
    "start_n, m_i, l_i, acc, L, S, skn, skd, svn, svd, SCALE, {table_args} D, DV, BLOCK_N, "
    "{{mask}}, IEEE)")


def block_walk(call: str, *, num: str, idx: str, row: str, sparse: str, block: str, start: str,
               indent: int = 4, split: bool = False) -> str:
    """The loops of a kernel over one BlockMask row ``row`` of the lists ``num``/``idx``
    (partial blocks: ``call`` with mask_mod applied), then, under ``HAS_FULL``, of
    ``FULL_NUM``/``FULL_IDX`` (full blocks: mask_mod skipped). Each is one flat loop over
    (listed block, tile of ``block`` in it), so Triton pipelines loads across blocks; ``SUBS``
    tiles per block (a block past the sequence is cut to it: torch's empty mask is one block
    of 2**30). ``start`` is the tile's first position; ``call`` has a ``{mask}`` slot.

    ``split``: the program runs only its share of the row's tiles, partial and full counted
    as one sequence (``SPLITS`` programs, this one ``split``): the decoding kernel's."""
    def lists(f: str, n: str, i: str) -> list[str]:
        return [f"{n} = tl.load({num if not f else 'FULL_NUM'} + off_b * s{f}nb + off_h * s{f}nh "
                f"+ {row} * s{f}nm) * SUBS",
                f"{i} = off_b * s{f}ib + off_h * s{f}ih + {row} * s{f}im"]

    def loop(f: str, i: str, lo: str, hi: str, mask: str) -> list[str]:
        return [f"for it in range({lo}, {hi}):",
                "    j = it // SUBS",
                f"    {start} = tl.load({idx if not f else 'FULL_IDX'} + {i} + j * s{f}in) * {sparse}"
                f" + (it - j * SUBS) * {block}",
                "    " + call.format(mask=mask)]

    if not split:
        lines = [*lists("", "nb", "i_off"), *loop("", "i_off", "0", "nb", "True"), "if HAS_FULL:"]
        lines += ["    " + ln for ln in [*lists("f", "nb", "i_off"),
                                          *loop("f", "i_off", "0", "nb", "False")]]
    else:
        lines = [*lists("", "nb", "i_off"), "nbf = nb * 0", "if_off = i_off", "if HAS_FULL:",
                 *["    " + ln for ln in lists("f", "nbf", "if_off")],
                 "per = tl.cdiv(nb + nbf, SPLITS)",
                 "lo = split * per",
                 "hi = tl.minimum(lo + per, nb + nbf)",
                 *loop("", "i_off", "lo", "tl.minimum(hi, nb)", "True"),
                 "if HAS_FULL:",
                 *["    " + ln for ln in loop("f", "if_off", "tl.maximum(lo, nb) - nb", "hi - nb",
                                             "False")]]
    return "\n".join(" " * indent + ln for ln in lines)


_FORWARD_KERNEL = '''

@triton.jit
def kiln_kernel(Q, K, V, OUT, LSE, MAXS, KV_NUM, KV_IDX, FULL_NUM, FULL_IDX, {tables}
                {forward_args}
                {tile_params}):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
{prologue}
{softmax_state}
{walk}
    _finish(OUT, LSE, MAXS, acc, l_i, m_i, off_b, off_h, off_bh, offs_m, offs_dv, L,
            sob, soh, som, sod, DV)
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


def _kmath(interpret: bool) -> str:
    return ("from kiln_codegen_triton import interp_math as kmath" if interpret
            else "from triton.language.extra import libdevice as kmath")


def emit_mods(score_gm, mask_gm, score_tables: Sequence, mask_tables: Sequence,
              joint_gm=None) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """score_mod, mask_mod (and the joint graph) emitted inline: (the format fields of the
    templates, the mods' constants by pointer name). Pointers: ``ST<i>`` score tables,
    ``MT<i>`` mask tables, then the constants (the joint graph reads score_mod's tables)."""
    s_ptrs = [f"ST{i}" for i in range(len(score_tables))]
    m_ptrs = [f"MT{i}" for i in range(len(mask_tables))]
    grid = [TVal("off_b", torch.int32, "s"), TVal("off_h", torch.int32, "s"),
            TVal("q_idx", torch.int32, "q"), TVal("kv_idx", torch.int32, "kv")]
    i32 = torch.zeros((), dtype=torch.int32)
    score = TVal("score", torch.float32)
    s_examples = list(map(_example, score_tables))
    score_lines, score_out, constants = emit_mod(
        score_gm, [torch.zeros(()), i32, i32, i32, i32, *s_examples], "sm", [score, *grid],
        s_ptrs, "valid")
    mask_lines, mask_out, m_consts = emit_mod(
        mask_gm, [i32, i32, i32, i32, *map(_example, mask_tables)], "mm", grid, m_ptrs, "valid")
    constants.update(m_consts)
    fields = dict(score_mod=_indent(score_lines, 4), score_out=score_out.name,
                  mask_mod=_indent(mask_lines, 8), mask_out=mask_out.name)
    if joint_gm is not None:
        joint_lines, joint_out, j_consts = emit_mod(
            joint_gm, [torch.zeros(()), i32, i32, i32, i32, torch.zeros(()), *s_examples],
            "jm", [score, *grid, TVal("grad", torch.float32)], s_ptrs, "valid")
        constants.update(j_consts)  # (named by their mod's prefix)
        fields.update(joint_mod=_indent(joint_lines, 4), joint_out=joint_out.name)
    tables = "".join(f"{p}, " for p in [*s_ptrs, *m_ptrs, *constants])
    fields.update(tables=tables, table_args=tables, ln2=_LN2, **_KERNEL_PARAMS)
    return fields, constants


def _tiles(kernel, gpu_choice, sparse_q: int, sparse_kv: int) -> tuple[int, int, dict]:
    """(BLOCK_M, BLOCK_N, launch options) of ``kernel`` for these BlockMask block sizes: by
    ``gpu_choice(dtype, head dim)`` on a GPU, at most the blocks; small under the interpreter
    (its cost grows with the tile)."""
    if kernel.interpret:
        return _next_pow2(min(sparse_q, 16)), _next_pow2(min(sparse_kv, 16)), {}
    block_m, block_n, warps, stages = gpu_choice(kernel.dtype, max(kernel.head_dim,
                                                                   kernel.value_dim))
    return (min(block_m, sparse_q), min(block_n, sparse_kv),
            {"num_warps": warps, "num_stages": stages})


def _table_tensors(kernel, score_tables: Sequence, mask_tables: Sequence, device) -> list:
    return [*(t.contiguous() for t in (*score_tables, *mask_tables)),
            *_constants_on(kernel, device)]


class FlexAttentionKernel:
    """A generated, loaded forward kernel for one flex_attention node; called with the
    node's tensors it returns ``(out, logsumexp / ln 2, max / ln 2)``."""

    #: the module's kernels after the shared source, and the one ``__call__`` launches
    #: (``flex_decoding`` builds its own from the same pieces)
    KERNELS = _FORWARD_KERNEL
    ENTRY = "kiln_kernel"

    def __init__(self, score_gm: torch.fx.GraphModule, mask_gm: torch.fx.GraphModule,
                 score_tables: Sequence, mask_tables: Sequence, dtype: torch.dtype,
                 head_dim: int, value_dim: int, interpret: bool | None = None):
        self.interpret = interpreting() if interpret is None else interpret
        self.n_score, self.n_mask = len(score_tables), len(mask_tables)
        self.head_dim, self.value_dim = head_dim, value_dim
        self.dtype = dtype
        fields, self.constants = emit_mods(score_gm, mask_gm, score_tables, mask_tables)
        fields.update(kmath=_kmath(self.interpret), prologue=_ROW_PROLOGUE,
                      softmax_state=_SOFTMAX_STATE, forward_args=_FORWARD_ARGS.format(**_KERNEL_PARAMS))
        call = _FORWARD_TILE_CALL.format(**fields)
        walk = dict(num="KV_NUM", idx="KV_IDX", row="q_blk", sparse="SPARSE_KV", block="BLOCK_N",
                    start="start_n")
        fields.update(walk=block_walk(call, **walk), split_walk=block_walk(call, split=True, **walk))
        self.source = (_HEADER + _FORWARD_TILE + self.KERNELS).format(**fields)
        self.module, self.path = _load("flex_attention", self.source)
        self.kernel = TemplateLauncher(getattr(self.module, self.ENTRY), self.ENTRY, self.path)

    def tiles(self, sparse_q: int, sparse_kv: int) -> tuple[int, int, dict]:
        """(BLOCK_M, BLOCK_N, launch options) for these BlockMask block sizes."""
        return _tiles(self, gpu_tiles, sparse_q, sparse_kv)

    def launch_args(self, query, key, value, out, kv_num, kv_idx, full_num, full_idx,
                    sparse_q: int, sparse_kv: int, block_n: int, scale: float, score_tables,
                    mask_tables) -> tuple[list, dict]:
        """The forward kernels' common arguments: (from ``KV_NUM`` to the last stride, the
        constexprs other than the tiles)."""
        has_full = full_num is not None
        kb = 0 if key.size(0) == 1 else key.stride(0)
        vb = 0 if value.size(0) == 1 else value.stride(0)
        L, D = query.size(2), query.size(3)
        S, DV = key.size(2), value.size(3)
        args = [kv_num, kv_idx, full_num if has_full else kv_num,
                full_idx if has_full else kv_idx,
                *_table_tensors(self, score_tables, mask_tables, query.device),
                L, S, query.size(1), query.size(1) // key.size(1), float(scale), sparse_q,
                sparse_kv, triton_cdiv(min(sparse_kv, S), block_n),
                *query.stride(), kb, *key.stride()[1:], vb, *value.stride()[1:], *out.stride(),
                *_bm_strides(kv_num, 3), *_bm_strides(kv_idx, 4),
                *_bm_strides(full_num, 3), *_bm_strides(full_idx, 4)]
        consts = dict(D=D, DV=DV, BLOCK_D=max(16, _next_pow2(D)), BLOCK_DV=max(16, _next_pow2(DV)),
                      HAS_FULL=has_full, IEEE=query.dtype == torch.float32)
        return args, consts

    def __call__(self, query, key, value, kv_num, kv_idx, full_num, full_idx, sparse_q: int,
                 sparse_kv: int, scale: float, score_tables: Sequence, mask_tables: Sequence):
        B, HQ, L, _ = query.shape
        out = out_like(query, value.size(3))
        lse = torch.empty((B, HQ, L), dtype=torch.float32, device=query.device)
        maxs = torch.empty((B, HQ, L), dtype=torch.float32, device=query.device)
        block_m, block_n, launch = self.tiles(sparse_q, sparse_kv)
        if sparse_q % block_m or sparse_kv % block_n:
            raise ValueError(f"block sizes {(sparse_q, sparse_kv)} do not divide into "
                             f"tiles {(block_m, block_n)}")
        args, consts = self.launch_args(query, key, value, out, kv_num, kv_idx, full_num,
                                        full_idx, sparse_q, sparse_kv, block_n, scale,
                                        score_tables, mask_tables)
        self.kernel[(triton_cdiv(L, block_m), B * HQ)](
            query, key, value, out, lse, maxs, *args, BLOCK_M=block_m, BLOCK_N=block_n,
            **consts, **launch)
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
# query head of its group. Both recompute the scores (``_scores``: score_mod, mask_mod inline),
# the probabilities from the forward's logsumexp, and the score gradient through score_mod by
# the operator's joint graph (``_score_grad``: its inputs are the score, the indices and the
# gradient of score_mod's output). ``delta = rowsum(dO * O)`` (minus the logsumexp's own
# gradient) is one small kernel before them (``kiln_kernel_delta``).

_BWD_TILES = '''

@triton.jit
def _natural_lse(lse2):
    # the forward's base-2 logsumexp in natural log; 0 on fully masked rows (their
    # probabilities are all 0)
    lse = lse2 * {ln2!r}
    return tl.where(lse == float("-inf"), 0.0, lse)


@triton.jit
def kiln_kernel_delta(O, DO, GLSE, DELTA, L, HQ, sob, soh, som, sod, sdb, sdh, sdm, sdd,
                      DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr,
                      HAS_GLSE: tl.constexpr):
    # delta = rowsum(dO * O) - d(logsumexp), in float32: one pass before both kernels
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // HQ
    off_h = off_bh % HQ
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    tile = (offs_m[:, None] < L) & (offs_dv[None, :] < DV)
    o = tl.load(O + off_b * sob + off_h * soh + offs_m[:, None] * som + offs_dv[None, :] * sod,
                tile, other=0.0).to(tl.float32)
    do = tl.load(DO + off_b * sdb + off_h * sdh + offs_m[:, None] * sdm + offs_dv[None, :] * sdd,
                 tile, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1)
    if HAS_GLSE:
        delta -= tl.load(GLSE + off_bh * L + offs_m, offs_m < L, other=0.0).to(tl.float32) / {ln2!r}
    tl.store(DELTA + off_bh * L + offs_m, delta, offs_m < L)


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
    s, valid = _scores(score, q_idx, kv_idx, off_b, off_h, L, S, {table_args} APPLY_MASK)
    p = tl.where(valid, tl.exp(s - lse[:, None]), 0.0)
    g = _score_grad(score, p * (dp - delta[:, None]), q_idx, kv_idx, off_b, off_h, L, S, valid,
                    {table_args})
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
    lse = _natural_lse(tl.load(LSE + r_base + offs_m, offs_m < L, other=0.0))
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
    s, valid = _scores(score, q_idx, kv_idx, off_b, off_h, L, S, {table_args} APPLY_MASK)
    pT = tl.where(valid, tl.exp(s - lse[None, :]), 0.0)
    g = _score_grad(score, pT * (dpT - delta[None, :]), q_idx, kv_idx, off_b, off_h, L, S, valid,
                    {table_args})
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
                   {mask_strides}
                {tile_params}):
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
{prologue}
    rows = offs_m[:, None] < L
    do = tl.load(DO + off_b * sdb + off_h * sdh + offs_m[:, None] * sdm + offs_dv[None, :] * sdd,
                 rows & (offs_dv[None, :] < DV), other=0.0)
    lse = _natural_lse(tl.load(LSE + off_bh * L + offs_m, offs_m < L, other=0.0))
    delta = tl.load(DELTA + off_bh * L + offs_m, offs_m < L, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
{dq_walk}
    tl.store(DQ + off_b * sgb + off_h * sgh + offs_m[:, None] * sgm + offs_d[None, :] * sgd,
             (dq * SCALE).to(DQ.dtype.element_ty), rows & (offs_d[None, :] < D))


@triton.jit
def kiln_kernel(Q, K, V, DO, LSE, DELTA, DK, DV_, Q_NUM, Q_IDX, FULL_NUM, FULL_IDX, {tables}
                L, S, HQ, HKV, GROUPS, SCALE, SPARSE_Q, SPARSE_KV, SUBS,
                sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                sdb, sdh, sdm, sdd, skgb, skgh, skgn, skgd, svgb, svgh, svgn, svgd,
                {mask_strides}
                {tile_params}):
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
{kv_walk}
    tl.store(DK + off_b * skgb + off_hkv * skgh + offs_n[:, None] * skgn + offs_d[None, :] * skgd,
             (dk * SCALE).to(DK.dtype.element_ty), cols & (offs_d[None, :] < D))
    tl.store(DV_ + off_b * svgb + off_hkv * svgh + offs_n[:, None] * svgn + offs_dv[None, :] * svgd,
             dv.to(DV_.dtype.element_ty), cols & (offs_dv[None, :] < DV))
'''

_DQ_TILE_CALL = (
    "dq = _dq_tile(q, do, lse, delta, K, V, k_base, v_base, off_b, off_h, offs_m, offs_d, "
    "offs_dv, start_n, dq, L, S, skn, skd, svn, svd, SCALE, {table_args} D, DV, BLOCK_N, "
    "{{mask}}, IEEE)")
_KV_TILE_CALL = (
    "dk, dv = _kv_tile(k, v, Q, DO, LSE, DELTA, q_base, do_base, r_base, off_b, off_h, offs_n, "
    "offs_d, offs_dv, start_m, dk, dv, L, S, sqm, sqd, sdm, sdd, SCALE, {table_args} D, DV, "
    "BLOCK_M, {{mask}}, IEEE)")
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
        fields, self.constants = emit_mods(score_gm, mask_gm, score_tables, mask_tables, joint_gm)
        fields.update(kmath=_kmath(self.interpret), prologue=_ROW_PROLOGUE)
        fields.update(
            dq_walk=block_walk(_DQ_TILE_CALL.format(**fields), num="KV_NUM", idx="KV_IDX",
                               row="q_blk", sparse="SPARSE_KV", block="BLOCK_N", start="start_n"),
            kv_walk=block_walk(_KV_TILE_CALL.format(**fields), num="Q_NUM", idx="Q_IDX",
                               row="kv_blk", sparse="SPARSE_Q", block="BLOCK_M", start="start_m",
                               indent=8))
        self.source = (_HEADER + _SCORE_GRAD + _BWD_TILES).format(**fields)
        module, self.path = _load("flex_attention_backward", self.source)
        self.kernel = TemplateLauncher(module.kiln_kernel, "kiln_kernel", self.path)
        self.dq_kernel = TemplateLauncher(module.kiln_kernel_dq, "kiln_kernel_dq", self.path)
        self.delta_kernel = TemplateLauncher(module.kiln_kernel_delta, "kiln_kernel_delta",
                                             self.path)

    def tiles(self, sparse_q: int, sparse_kv: int) -> tuple[int, int, dict]:
        return _tiles(self, gpu_bwd_tiles, sparse_q, sparse_kv)

    def __call__(self, query, key, value, out, lse, grad_out, grad_lse, kv_num, kv_idx, full_kv_num,
                 full_kv_idx, q_num, q_idx, full_q_num, full_q_idx, sparse_q: int, sparse_kv: int,
                 scale: float, score_tables: Sequence, mask_tables: Sequence):
        B, HQ, L, D = query.shape
        HKV, S, DV = key.size(1), key.size(2), value.size(3)
        block_m, block_n, launch = self.tiles(sparse_q, sparse_kv)
        if sparse_q % block_m or sparse_kv % block_n:
            raise ValueError(f"block sizes {(sparse_q, sparse_kv)} do not divide into "
                             f"tiles {(block_m, block_n)}")
        lse = lse.contiguous()  # (the kernels take it to natural log: _natural_lse)
        delta = torch.empty((B, HQ, L), dtype=torch.float32, device=query.device)
        glse = grad_lse.contiguous() if grad_lse is not None else delta
        rows = 16 if self.interpret else 64
        self.delta_kernel[(triton_cdiv(L, rows), B * HQ)](
            out, grad_out, glse, delta, L, HQ, *out.stride(), *grad_out.stride(), DV=DV,
            BLOCK_M=rows, BLOCK_DV=max(16, _next_pow2(DV)), HAS_GLSE=grad_lse is not None)
        dq = torch.empty_like(query)
        dk = torch.empty((B, HKV, S, D), dtype=key.dtype, device=key.device)
        dv = torch.empty((B, HKV, S, DV), dtype=value.dtype, device=value.device)
        kb = 0 if key.size(0) == 1 else key.stride(0)
        vb = 0 if value.size(0) == 1 else value.stride(0)
        tables = _table_tensors(self, score_tables, mask_tables, query.device)
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

