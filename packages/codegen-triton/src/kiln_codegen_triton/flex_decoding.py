"""FlexAttention for short queries (decoding) as split-KV ("flash-decoding") Triton kernels.

The forward kernel (``flex_attention.FlexAttentionKernel``) gives each program ``BLOCK_M``
(128 on a GPU) query rows of one (batch, head): with one query row, 127 of them are padding
and only ``B * H`` programs run, each walking the whole key sequence. Here a program owns a
16-row query tile of one (batch, head) and one of ``SPLITS`` shares of that BlockMask row's
tiles (partial and full blocks counted as one sequence, so a sparse row splits evenly);
each writes its online-softmax state (row max, row sum, unnormalised output, float32) and a
small combine kernel rescales and sums the shares into ``out``, the logsumexp and the max.
With one share the decoding kernel finishes the rows itself (no combine).

The kernel is the forward's, reassembled: the same tile step (``_tile``: score_mod and
mask_mod inline through ``_scores``, online softmax), the same row prologue and finish, and
the same block walk, split (``flex_attention.block_walk(split=True)``). Which calls take this
path is chosen in one place, ``kiln.higher_order`` (a query of at most 16 rows).

Shares: two programs per SM over the (batch, head, query tile) programs, as torch's flex
decoding does, and never more than the row has tiles; under the interpreter a 4-SM device is
assumed so the split and its combine run.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from kiln_loopir.lowerings.higher_order import (
    FlexAttentionTemplate,
    register_flex_attention_template,
)

from .flex_attention import (
    FlexAttentionKernel,
    _build,
    _build_backward,
    _next_pow2,
    _unsupported,
    out_like,
    triton_cdiv,
)
from .launcher import TemplateLauncher

__all__ = ["FlexDecodingKernel", "decode_tiles", "split_count"]

#: query rows of one decoding program (the smallest tile ``tl.dot`` takes)
DECODE_BLOCK_M = 16
#: SMs assumed under the interpreter (so several shares and the combine run)
INTERPRETER_SMS = 4

_DECODE_KERNELS = '''

@triton.jit
def kiln_kernel_decode(Q, K, V, OUT, LSE, MAXS, M_PART, L_PART, ACC_PART, KV_NUM, KV_IDX,
                       FULL_NUM, FULL_IDX, {tables}
                {forward_args}
                SPLITS, {tile_params}, DIRECT: tl.constexpr):
    split = tl.program_id(0)
    off_bh = tl.program_id(1)
    start_m = tl.program_id(2)
{prologue}
{softmax_state}
{split_walk}
    if DIRECT:
        _finish(OUT, LSE, MAXS, acc, l_i, m_i, off_b, off_h, off_bh, offs_m, offs_dv, L,
                sob, soh, som, sod, DV)
    else:
        part = (off_bh * tl.num_programs(2) + start_m) * SPLITS + split
        rows = tl.arange(0, BLOCK_M)
        tl.store(M_PART + part * BLOCK_M + rows, m_i)
        tl.store(L_PART + part * BLOCK_M + rows, l_i)
        tl.store(ACC_PART + (part * BLOCK_M + rows[:, None]) * BLOCK_DV + offs_dv[None, :], acc)


@triton.jit
def kiln_kernel_combine(OUT, LSE, MAXS, M_PART, L_PART, ACC_PART, L, HQ, SPLITS,
                        sob, soh, som, sod, DV: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_DV: tl.constexpr):
    # the shares of one query tile, rescaled to their common max and summed
    start_m = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // HQ
    off_h = off_bh % HQ
    rows = tl.arange(0, BLOCK_M)
    offs_m = start_m * BLOCK_M + rows
    offs_dv = tl.arange(0, BLOCK_DV)
    first = (off_bh * tl.num_programs(0) + start_m) * SPLITS
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in range(0, SPLITS):
        m_i = tl.maximum(m_i, tl.load(M_PART + (first + s) * BLOCK_M + rows))
    m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    for s in range(0, SPLITS):
        w = tl.exp(tl.load(M_PART + (first + s) * BLOCK_M + rows) - m_safe)
        l_i += tl.load(L_PART + (first + s) * BLOCK_M + rows) * w
        acc += tl.load(ACC_PART + ((first + s) * BLOCK_M + rows[:, None]) * BLOCK_DV
                       + offs_dv[None, :]) * w[:, None]
    _finish(OUT, LSE, MAXS, acc, l_i, m_i, off_b, off_h, off_bh, offs_m, offs_dv, L,
            sob, soh, som, sod, DV)
'''


def decode_tiles(dtype: torch.dtype, head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_N keys, warps, pipeline stages) of the decoding kernel on a GPU: a 16-row tile
    is memory-bound, so small key tiles with loads pipelined (torch's sm_90 decode default
    is 64 keys, 2 warps)."""
    if dtype == torch.float32 or head_dim > 128:
        return 32, 4, 2
    return 64, 4, 3


def split_count(programs: int, tiles: int, sms: int) -> int:
    """Shares per row: two programs per SM over ``programs`` (batch x heads x query tiles),
    at least one, at most the row's ``tiles``."""
    return max(1, min(2 * sms // max(programs, 1), tiles))


class FlexDecodingKernel(FlexAttentionKernel):
    """The split-KV forward of one flex_attention node (module docstring); called as
    ``FlexAttentionKernel`` is. ``splits`` (None: ``split_count``) fixes the shares."""

    KERNELS = _DECODE_KERNELS
    ENTRY = "kiln_kernel_decode"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.combine = TemplateLauncher(self.module.kiln_kernel_combine, "kiln_kernel_combine", self.path)
        self.splits: int | None = None

    def tiles(self, sparse_q: int, sparse_kv: int) -> tuple[int, int, dict]:
        block_m = _next_pow2(min(sparse_q, DECODE_BLOCK_M))
        if self.interpret:
            return block_m, _next_pow2(min(sparse_kv, 16)), {}
        block_n, warps, stages = decode_tiles(self.dtype, max(self.head_dim, self.value_dim))
        return block_m, min(block_n, sparse_kv), {"num_warps": warps, "num_stages": stages}

    def _splits(self, programs: int, tiles: int, device: torch.device) -> int:
        if self.splits is not None:
            return self.splits
        sms = INTERPRETER_SMS if device.type != "cuda" else \
            torch.cuda.get_device_properties(device).multi_processor_count
        return split_count(programs, tiles, sms)

    def __call__(self, query, key, value, kv_num, kv_idx, full_num, full_idx, sparse_q: int,
                 sparse_kv: int, scale: float, score_tables: Sequence, mask_tables: Sequence):
        B, HQ, L, _ = query.shape
        S, DV = key.size(2), value.size(3)
        out = out_like(query, DV)
        lse = torch.empty((B, HQ, L), dtype=torch.float32, device=query.device)
        maxs = torch.empty((B, HQ, L), dtype=torch.float32, device=query.device)
        block_m, block_n, launch = self.tiles(sparse_q, sparse_kv)
        if sparse_kv % block_n or (sparse_q % block_m and L > min(block_m, sparse_q)):
            raise ValueError(f"block sizes {(sparse_q, sparse_kv)} do not divide into "
                             f"tiles {(block_m, block_n)}")
        args, consts = self.launch_args(query, key, value, out, kv_num, kv_idx, full_num,
                                        full_idx, sparse_q, sparse_kv, block_n, scale,
                                        score_tables, mask_tables)
        m_tiles = triton_cdiv(L, block_m)
        splits = self._splits(B * HQ * m_tiles, triton_cdiv(S, block_n), query.device)
        if splits == 1:  # the decoding kernel finishes its rows (parts unused)
            parts = (lse, lse, lse)
        else:
            n = B * HQ * m_tiles * splits * block_m
            parts = (torch.empty(n, dtype=torch.float32, device=query.device),
                     torch.empty(n, dtype=torch.float32, device=query.device),
                     torch.empty(n * consts["BLOCK_DV"], dtype=torch.float32, device=query.device))
        self.kernel[(splits, B * HQ, m_tiles)](
            query, key, value, out, lse, maxs, *parts, *args, splits, BLOCK_M=block_m,
            BLOCK_N=block_n, DIRECT=splits == 1, **consts, **launch)
        if splits > 1:
            self.combine[(m_tiles, B * HQ)](
                out, lse, maxs, *parts, L, HQ, splits, *out.stride(), DV=DV, BLOCK_M=block_m,
                BLOCK_DV=consts["BLOCK_DV"])
        return out, lse, maxs


def _build_decode(score_gm, mask_gm, score_tables, mask_tables, query, key, value,
                  ) -> FlexDecodingKernel:
    return FlexDecodingKernel(score_gm, mask_gm, score_tables, mask_tables, query.dtype,
                              query.size(-1), value.size(-1))


register_flex_attention_template(
    "triton", FlexAttentionTemplate(_unsupported, _build, _build_backward, _build_decode))
