"""Softmax over long float32 rows: hand-written single-read Triton designs against copy bandwidth.

    # the lent H200 (python3.12, torch 2.11, triton 3.6), from the repo root; JSON in --out
    python3 packages/frontend/hatch_build.py --inplace
    PYTHONPATH="$(python3 scripts/entry_points.py):$(ls -d packages/*/src | tr '\\n' ':')" \\
        python3 -u experiments/softmax-long-rows/softmax_long_sweep.py --out "$OUT"
    # no GPU: compile every variant for sm_90 only (what CI-less checking can do)
    python experiments/softmax-long-rows/softmax_long_sweep.py --compile-only

Why (issue 11, item 3): kiln's looped online softmax reads each row twice from DRAM and
writes it once, so it tops out near 2/3 of copy bandwidth; the cooperative-rows kernel
(kiln_codegen_triton/cooperative.py: K programs per row, partials in a workspace, a ticket
spin, the second read from L2) measured 20%. The designs swept here read the row once:

* ``reg``: K programs per row (``pid // K`` = row, ``pid % K`` = chunk), the chunk loaded
  once into registers (one ``tl.load`` of CHUNK elements), max and sum of exp published, a
  ticket, a spin until the row's K tickets of this launch are out, the K partials combined,
  and ``exp(x - M) / S`` stored from the registers: DRAM traffic = one read + one write.
* ``pers``: the same on a persistent grid (#SMs x occupancy programs, a multiple of K, all
  co-resident, so no deadlock whatever the block scheduler does); each program loops over
  (row, chunk) items, a row's K chunks in the same iteration, and loads its next chunk before
  waiting on the current one (prefetch: the wait overlaps a load).
* ``reread``: kiln's current design by hand (chunk looped twice, the second pass from L2),
  to tell the spin's cost from the re-read's.

Spins: ``atomic`` polls with ``atomic_add(ptr, 0, sem="acquire")`` (an L2 atomic per poll,
what kiln does); ``volatile`` polls with a volatile load and takes one acquire atomic when
done; ``backoff`` sleeps (``nanosleep``) between polls. Every spin is bounded (a hang would
stop the whole run): a program that gives up counts itself in an error counter, and a variant
with errors or a result off ``torch.softmax`` is reported as failed, never timed.

Also measured: the copy bandwidth (``dst.copy_(src)``, same bytes), kiln's default kernel
(``kiln_default``), kiln's cooperative kernel as the tree plans it (``kiln_cooperative``,
``KILN_TRITON_COOPERATIVE=1``: the chunk in registers when the row fits, its autotuned
configs) and kiln's re-read design (``kiln_cooperative_reread``). Times are
``triton.testing.do_bench`` medians; bandwidth = 2 x 4 x numel / time; % of copy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import triton
import triton.language as tl

# benchmarks/_common.py (the environment record every benchmark writes)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))
from _common import environ  # noqa: E402

T0 = time.perf_counter()
SHAPES = [(1024, 262144), (256, 1048576), (4096, 65536)]
MAXSPIN = 1 << 17  # polls (~0.1 s) before a program gives up (flags an error instead of hanging)


def say(*args) -> None:
    print(f"[sweep {time.perf_counter() - T0:6.1f}s]", *args, flush=True)


# ============================================================================================
# kernels
# ============================================================================================


@triton.jit
def _sleep(ns):
    return tl.inline_asm_elementwise("nanosleep.u32 $1;\n mov.u32 $0, $1;", "=r,r", [ns],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _wait_row(tick_ptr, err_ptr, K, maxspin, POLL: tl.constexpr, BACKOFF: tl.constexpr):
    """Take this program's ticket for the row and wait until the row's K tickets of this
    launch are out."""
    ticket = tl.atomic_add(tick_ptr, 1, sem="acq_rel")
    _wait_ticket(tick_ptr, ticket, err_ptr, K, maxspin, POLL, BACKOFF)


@triton.jit
def _wait_ticket(tick_ptr, ticket, err_ptr, K, maxspin, POLL: tl.constexpr, BACKOFF: tl.constexpr):
    """Wait until the row's K tickets of the launch ``ticket`` (taken on ``tick_ptr``) belongs
    to are out (``ticket - ticket % K + K``: counters are never reset, so replays work)."""
    _spin_until(tick_ptr, ticket + 1, ticket - ticket % K + K, err_ptr, maxspin, POLL, BACKOFF)


@triton.jit
def _spin_until(tick_ptr, seen, target, err_ptr, maxspin, POLL: tl.constexpr, BACKOFF: tl.constexpr):
    """Poll the counter at ``tick_ptr`` (last value ``seen``) until it reaches ``target``;
    bounded: a program that gives up counts itself in ``err_ptr``."""
    n = 0
    while (seen < target) & (n < maxspin):
        if BACKOFF > 0:
            _sleep(tl.full([], BACKOFF, tl.int32))
        if POLL == 0:
            seen = tl.atomic_add(tick_ptr, 0, sem="acquire")
        else:
            seen = tl.load(tick_ptr, volatile=True)
        n += 1
        if n % 256 == 0:  # another program gave up: this launch is lost, do not wait any longer
            if tl.load(err_ptr, volatile=True) != 0:
                n = maxspin
    if POLL != 0:
        seen = tl.atomic_add(tick_ptr, 0, sem="acquire")  # the acquire the volatile polls lack
    if seen < target:
        tl.atomic_add(err_ptr, 1)


@triton.jit
def _row_stats(ws_ptr, row, K, KB: tl.constexpr):
    """The row's max M and sum of exp(x - M) from the K published (max, sum) partials."""
    ks = tl.arange(0, KB)
    km = ks < K
    ms = tl.load(ws_ptr + (row * K + ks) * 2, km, other=float("-inf"), volatile=True)
    ss = tl.load(ws_ptr + (row * K + ks) * 2 + 1, km, other=0.0, volatile=True)
    big = tl.max(ms, 0)
    big_safe = tl.where(big == float("-inf"), 0.0, big)
    total = tl.sum(tl.where(ss == 0.0, 0.0, ss * tl.exp(ms - big_safe)), 0)
    return big_safe, total


@triton.jit
def _publish(ws_ptr, row, K, c, m, s):
    """Chunk ``c`` of ``row``'s partials: its max and its sum of exp(x - max)."""
    tl.store(ws_ptr + (row * K + c) * 2, m)
    tl.store(ws_ptr + (row * K + c) * 2 + 1, s)


@triton.jit
def _online_chunk_stats(x_ptr, base, start, N, CHUNK: tl.constexpr, RBLOCK: tl.constexpr,
                        EVICT: tl.constexpr):
    """(max, sum of exp(x - max)) of the chunk at ``start``, looped in RBLOCK blocks: online
    max and sum per lane, the lanes rescaled to the chunk max at the end."""
    lanes = tl.arange(0, RBLOCK)
    m_acc = tl.full([RBLOCK], float("-inf"), tl.float32)
    s_acc = tl.zeros([RBLOCK], tl.float32)
    for r in range(start, start + CHUNK, RBLOCK):
        offs = r + lanes
        x = tl.load(x_ptr + base + offs, offs < N, other=float("-inf"), eviction_policy=EVICT)
        m_new = tl.maximum(m_acc, x)
        m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s_acc = tl.where(s_acc == 0.0, 0.0, s_acc * tl.exp(m_acc - m_new_safe)) + tl.exp(x - m_new_safe)
        m_acc = m_new
    m = tl.max(m_acc, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    return m, tl.sum(tl.where(s_acc == 0.0, 0.0, s_acc * tl.exp(m_acc - m_safe)), 0)


@triton.jit
def _normalize_chunk(x_ptr, y_ptr, base, start, N, big, total, CHUNK: tl.constexpr, RBLOCK: tl.constexpr):
    """``exp(x - big) / total`` over the chunk at ``start``, read again (from L2)."""
    lanes = tl.arange(0, RBLOCK)
    inv = 1.0 / total
    for r in range(start, start + CHUNK, RBLOCK):
        offs = r + lanes
        x = tl.load(x_ptr + base + offs, offs < N, other=float("-inf"), eviction_policy="evict_first")
        tl.store(y_ptr + base + offs, tl.exp(x - big) * inv, offs < N, eviction_policy="evict_first")


@triton.jit
def _chunk_stats(x):
    """(max, exp(x - max), sum of it) of one chunk (an all -inf chunk: max -inf, sum 0)."""
    m = tl.max(x, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    e = tl.exp(x - m_safe)
    return m, e, tl.sum(e, 0)


@triton.jit
def _finish(x, e, m, big, total, EXP1: tl.constexpr):
    """The softmax of the chunk: with EXP1 one exp per element (the chunk's exp(x - m), kept
    in registers, rescaled by exp(m - M) / S), else exp(x - M) / S again."""
    if EXP1:
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        return e * (tl.exp(m_safe - big) / total)
    else:
        return tl.exp(x - big) * (1.0 / total)


@triton.jit
def _chunk_softmax(x, y_ptrs, mask, ws_ptr, tick_ptr, err_ptr, row, c, K, maxspin,
                   KB: tl.constexpr, POLL: tl.constexpr, BACKOFF: tl.constexpr, EXP1: tl.constexpr):
    """One chunk ``x`` (chunk ``c`` of ``row``, held in registers) of the single-read designs:
    publish its (max, sum), wait for the row's K tickets, combine the partials, store the
    softmax at ``y_ptrs``."""
    m, e, s = _chunk_stats(x)
    _publish(ws_ptr, row, K, c, m, s)
    _wait_row(tick_ptr + row, err_ptr, K, maxspin, POLL, BACKOFF)
    big, total = _row_stats(ws_ptr, row, K, KB)
    y = _finish(x, e, m, big, total, EXP1)
    tl.store(y_ptrs, y, mask, eviction_policy="evict_first")


#: K, the item count and the spin bound are not specialised (K = 4 and K = 64 would be two
#: compiles: Triton specialises integers on divisibility by 16)
NOSPEC = ["K", "n_items", "maxspin"]


@triton.jit(do_not_specialize=["K", "maxspin"])
def softmax_reg(x_ptr, y_ptr, ws_ptr, tick_ptr, err_ptr, N, K, maxspin,
                CHUNK: tl.constexpr, KB: tl.constexpr, POLL: tl.constexpr, BACKOFF: tl.constexpr,
                EXP1: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // K
    c = pid % K
    offs = c * CHUNK + tl.arange(0, CHUNK)
    mask = offs < N
    base = row.to(tl.int64) * N
    x = tl.load(x_ptr + base + offs, mask, other=float("-inf"), eviction_policy="evict_first")
    _chunk_softmax(x, y_ptr + base + offs, mask, ws_ptr, tick_ptr, err_ptr, row, c, K, maxspin,
                   KB, POLL, BACKOFF, EXP1)


@triton.jit(do_not_specialize=["K", "maxspin"])
def copy_reg(x_ptr, y_ptr, ws_ptr, tick_ptr, err_ptr, N, K, maxspin,
             CHUNK: tl.constexpr, KB: tl.constexpr, POLL: tl.constexpr, BACKOFF: tl.constexpr,
             EXP1: tl.constexpr):
    """The ``reg`` structure without the exchange (a chunk loaded whole, then stored): the
    ceiling of load-all-then-store programs, not a softmax (never checked against one)."""
    pid = tl.program_id(0)
    row = pid // K
    offs = (pid % K) * CHUNK + tl.arange(0, CHUNK)
    mask = offs < N
    base = row.to(tl.int64) * N
    x = tl.load(x_ptr + base + offs, mask, eviction_policy="evict_first")
    tl.store(y_ptr + base + offs, x, mask, eviction_policy="evict_first")


@triton.jit(do_not_specialize=["K", "maxspin"])
def softmax_reg2(x_ptr, y_ptr, ws_ptr, tick_ptr, err_ptr, N, K, maxspin,
                 CHUNK: tl.constexpr, KB: tl.constexpr, POLL: tl.constexpr, BACKOFF: tl.constexpr,
                 EXP1: tl.constexpr):
    """Two chunks per program, of rows ``r`` and ``r + rows/2`` (same chunk index): the second
    is loaded while the first row's exchange is in flight, so the wait overlaps a load."""
    pid = tl.program_id(0)
    half = tl.num_programs(0) // K
    row_a = pid // K
    row_b = row_a + half
    c = pid % K
    offs = c * CHUNK + tl.arange(0, CHUNK)
    mask = offs < N
    base_a = row_a.to(tl.int64) * N
    base_b = row_b.to(tl.int64) * N
    xa = tl.load(x_ptr + base_a + offs, mask, other=float("-inf"), eviction_policy="evict_first")
    ma, ea, sa = _chunk_stats(xa)
    _publish(ws_ptr, row_a, K, c, ma, sa)
    ticket_a = tl.atomic_add(tick_ptr + row_a, 1, sem="acq_rel")
    xb = tl.load(x_ptr + base_b + offs, mask, other=float("-inf"), eviction_policy="evict_first")
    mb, eb, sb = _chunk_stats(xb)
    _publish(ws_ptr, row_b, K, c, mb, sb)
    ticket_b = tl.atomic_add(tick_ptr + row_b, 1, sem="acq_rel")
    # row a: wait for its K tickets (taken above), combine, store
    _wait_ticket(tick_ptr + row_a, ticket_a, err_ptr, K, maxspin, POLL, BACKOFF)
    big, total = _row_stats(ws_ptr, row_a, K, KB)
    tl.store(y_ptr + base_a + offs, _finish(xa, ea, ma, big, total, EXP1), mask, eviction_policy="evict_first")
    _wait_ticket(tick_ptr + row_b, ticket_b, err_ptr, K, maxspin, POLL, BACKOFF)
    big, total = _row_stats(ws_ptr, row_b, K, KB)
    tl.store(y_ptr + base_b + offs, _finish(xb, eb, mb, big, total, EXP1), mask, eviction_policy="evict_first")


@triton.jit(do_not_specialize=["K", "maxspin", "U", "LAG"])
def softmax_lag(x_ptr, y_ptr, ws_ptr, tick_ptr, err_ptr, N, K, maxspin, U, LAG,
                CHUNK: tl.constexpr, RBLOCK: tl.constexpr, KB: tl.constexpr):
    """Stats and normalize as separate programs of one launch, the normalize units LAG
    positions behind: position p < LAG is stats unit p; after that, even offsets are stats
    units and odd ones normalize units, so normalize unit n runs about 2*LAG positions after
    stats unit n. A stats unit reads its chunk once from DRAM (kept in L2), publishes
    (max, sum) and counts itself on the row's ticket; a normalize unit waits for the row's K
    tickets of this launch (long done: blocks start in position order, and the LAG is many
    lifetimes), combines the partials, re-reads its chunk from L2 and stores the softmax. No
    program waits on one that starts after it, so it cannot deadlock (and runs in order under
    the interpreter). tick_ptr: [2 * rows] counters (stats, normalize), never reset."""
    p = tl.program_id(0)
    q = p - LAG
    is_stats = (q < 0) | (q % 2 == 0)
    unit = tl.where(q < 0, p, tl.where(q % 2 == 0, LAG + q // 2, (q - 1) // 2))
    if unit < U:
        row = unit // K
        c = unit % K
        base = row.to(tl.int64) * N
        start = c * CHUNK
        if is_stats:
            if RBLOCK == CHUNK:  # the chunk in one block: max, then one exp each
                offs = start + tl.arange(0, CHUNK)
                x = tl.load(x_ptr + base + offs, offs < N, other=float("-inf"), eviction_policy="evict_last")
                m, _, s_sum = _chunk_stats(x)
            else:
                m, s_sum = _online_chunk_stats(x_ptr, base, start, N, CHUNK, RBLOCK, "evict_last")
            _publish(ws_ptr, row, K, c, m, s_sum)
            tl.atomic_add(tick_ptr + row, 1, sem="release")
        else:  # a ticket on the row's second counter says the launch; wait for its K stats
            ticket = tl.atomic_add(tick_ptr + U // K + row, 1, sem="relaxed")
            seen = tl.atomic_add(tick_ptr + row, 0, sem="acquire")
            _spin_until(tick_ptr + row, seen, (ticket // K + 1) * K, err_ptr, maxspin, 0, 0)
            big, total = _row_stats(ws_ptr, row, K, KB)
            _normalize_chunk(x_ptr, y_ptr, base, start, N, big, total, CHUNK, RBLOCK)


@triton.jit(do_not_specialize=NOSPEC)
def softmax_pers(x_ptr, y_ptr, ws_ptr, tick_ptr, err_ptr, N, K, n_items, maxspin,
                 CHUNK: tl.constexpr, KB: tl.constexpr, POLL: tl.constexpr, BACKOFF: tl.constexpr,
                 PREFETCH: tl.constexpr, EXP1: tl.constexpr):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    lanes = tl.arange(0, CHUNK)
    # the first item's chunk
    offs = (pid % K) * CHUNK + lanes
    x_next = tl.load(x_ptr + (pid // K).to(tl.int64) * N + offs, offs < tl.where(pid < n_items, N, 0),
                     other=float("-inf"), eviction_policy="evict_first")
    for item in range(pid, n_items, G):
        row = item // K
        c = item % K
        offs = c * CHUNK + lanes
        mask = offs < N
        base = row.to(tl.int64) * N
        if PREFETCH:
            x = x_next
            nxt = item + G
            noffs = (nxt % K) * CHUNK + lanes
            x_next = tl.load(x_ptr + (nxt // K).to(tl.int64) * N + noffs, noffs < tl.where(nxt < n_items, N, 0),
                             other=float("-inf"), eviction_policy="evict_first")
        else:
            x = tl.load(x_ptr + base + offs, mask, other=float("-inf"), eviction_policy="evict_first")
        _chunk_softmax(x, y_ptr + base + offs, mask, ws_ptr, tick_ptr, err_ptr, row, c, K, maxspin,
                       KB, POLL, BACKOFF, EXP1)


@triton.jit(do_not_specialize=["K", "maxspin"])
def softmax_reread(x_ptr, y_ptr, ws_ptr, tick_ptr, err_ptr, N, K, maxspin,
                   CHUNK: tl.constexpr, RBLOCK: tl.constexpr, KB: tl.constexpr, POLL: tl.constexpr,
                   BACKOFF: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // K
    c = pid % K
    base = row.to(tl.int64) * N
    start = c * CHUNK
    m, s = _online_chunk_stats(x_ptr, base, start, N, CHUNK, RBLOCK, "")
    _publish(ws_ptr, row, K, c, m, s)
    _wait_row(tick_ptr + row, err_ptr, K, maxspin, POLL, BACKOFF)
    big, total = _row_stats(ws_ptr, row, K, KB)
    _normalize_chunk(x_ptr, y_ptr, base, start, N, big, total, CHUNK, RBLOCK)  # second pass: from L2


# ============================================================================================
# variants
# ============================================================================================

POLLS = {"atomic": 0, "volatile": 1}
#: partials loaded per row: one width for every shape (K is at most 256 here), one compile
KB = 256


def variants() -> list[dict]:
    """(kind, chunk KB, warps, poll, backoff ns[, prefetch]) for each variant swept."""
    out = []
    # the chunk in registers: 8-64 floats per thread
    for kb, warps in [(16, 4), (16, 8), (16, 16), (32, 8), (32, 16), (32, 32), (64, 8), (64, 16), (64, 32),
                      (128, 16), (128, 32)]:
        out.append({"kind": "reg", "kb": kb, "warps": warps, "poll": "volatile", "backoff": 0})
    # two exps per element (x kept in registers, exp(x - M) after the wait) instead of one
    for kb, warps in [(32, 16), (64, 16)]:
        out.append({"kind": "reg", "kb": kb, "warps": warps, "poll": "volatile", "backoff": 0, "exp1": 0})
    # the spin itself, on two likely configs
    for kb, warps in [(32, 16), (64, 16)]:
        for poll, backoff in [("atomic", 0), ("atomic", 200), ("volatile", 100), ("volatile", 500)]:
            out.append({"kind": "reg", "kb": kb, "warps": warps, "poll": poll, "backoff": backoff})
    # persistent grid, prefetching the next chunk (and one without prefetch)
    for kb, warps, pre in [(16, 4, 1), (16, 8, 1), (32, 8, 1), (32, 16, 1), (64, 16, 1), (64, 32, 1), (32, 16, 0)]:
        out.append({"kind": "pers", "kb": kb, "warps": warps, "poll": "volatile", "backoff": 0, "prefetch": pre})
    # kiln's current design by hand: the second pass from L2
    for poll in ("atomic", "volatile"):
        out.append({"kind": "reread", "kb": 32, "warps": 8, "poll": poll, "backoff": 0, "rblock": 2048})
    # round 2 (after the first H200 run: the acquire poll is the one that matters; volatile
    # polls lose 5-25 points): chunk sizes and warps again with it, two exps, the persistent
    # grid, longer re-read chunks
    for kb, warps in [(16, 4), (32, 8), (64, 8), (128, 16), (128, 32)]:
        out.append({"kind": "reg", "kb": kb, "warps": warps, "poll": "atomic", "backoff": 0})
    for kb, warps in [(32, 8), (64, 16)]:
        out.append({"kind": "reg", "kb": kb, "warps": warps, "poll": "atomic", "backoff": 0, "exp1": 0})
    for kb, warps in [(16, 4), (32, 8), (64, 16)]:
        out.append({"kind": "pers", "kb": kb, "warps": warps, "poll": "atomic", "backoff": 0, "prefetch": 1})
    for kb, warps, rblock in [(64, 8, 2048), (64, 16, 4096), (16, 8, 2048), (32, 4, 1024)]:
        out.append({"kind": "reread", "kb": kb, "warps": warps, "poll": "atomic", "backoff": 0, "rblock": rblock})
    # round 3 (session 7): the structure's ceiling without an exchange, and two rows per
    # program (the second chunk's load overlaps the first row's exchange)
    for kb, warps in [(64, 16), (128, 16), (32, 8)]:
        out.append({"kind": "copyreg", "kb": kb, "warps": warps, "poll": "atomic", "backoff": 0})
    for kb, warps in [(32, 8), (32, 16), (64, 16), (16, 4), (16, 8)]:
        out.append({"kind": "reg2", "kb": kb, "warps": warps, "poll": "atomic", "backoff": 0})
    # lagged stats/normalize units (no program waits on a later one; the re-read from L2)
    for kb, warps, rblock, lag_mb in [(32, 8, 2048, 16), (32, 8, 2048, 8), (32, 8, 2048, 32), (64, 8, 4096, 16),
                                      (16, 4, 1024, 16), (32, 4, 8192, 16), (64, 16, 16384, 16),
                                      # one block per chunk: the stats' exp once per element
                                      (32, 8, 8192, 16), (32, 16, 8192, 16), (16, 8, 4096, 16), (16, 4, 4096, 16),
                                      (32, 8, 8192, 12), (32, 8, 8192, 24), (32, 8, 2048, 12), (32, 8, 2048, 20),
                                      # round 2: the lag near its best (a whole multiple of a MB is coarse)
                                      (32, 8, 8192, 10), (32, 8, 8192, 11), (32, 8, 8192, 13), (32, 8, 8192, 14),
                                      (32, 16, 8192, 10), (32, 16, 8192, 12), (32, 16, 8192, 14),
                                      (64, 16, 16384, 8), (64, 16, 16384, 10), (64, 16, 16384, 12),
                                      (64, 16, 16384, 14), (16, 4, 4096, 8), (16, 4, 4096, 12), (16, 8, 4096, 10),
                                      (16, 8, 4096, 12), (64, 8, 16384, 12)]:
        out.append({"kind": "lag", "kb": kb, "warps": warps, "poll": "atomic", "backoff": 0, "rblock": rblock,
                    "lag_mb": lag_mb})
    return out


def vname(v: dict) -> str:
    s = f"{v['kind']}_c{v['kb']}k_w{v['warps']}_{v['poll']}"
    if v["backoff"]:
        s += f"_bo{v['backoff']}"
    if v["kind"] == "pers" and not v["prefetch"]:
        s += "_noprefetch"
    if not v.get("exp1", 1):
        s += "_exp2x"
    if v["kind"] == "reread" and v["rblock"] != 2048:
        s += f"_r{v['rblock']}"
    if v["kind"] == "lag":
        s += f"_r{v['rblock']}_lag{v['lag_mb']}mb"
    return s


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def constexprs(v: dict, K: int) -> dict:
    c = {"CHUNK": v["kb"] * 1024 // 4, "KB": max(KB, _next_pow2(K)), "POLL": POLLS[v["poll"]],
         "BACKOFF": v["backoff"]}
    if v["kind"] == "lag":
        return {"CHUNK": c["CHUNK"], "RBLOCK": v["rblock"], "KB": c["KB"]}
    if v["kind"] != "reread":
        c["EXP1"] = v.get("exp1", 1)
    if v["kind"] == "pers":
        c["PREFETCH"] = v["prefetch"]
    if v["kind"] == "reread":
        c["RBLOCK"] = v["rblock"]
    return c


KERNELS = {"reg": softmax_reg, "pers": softmax_pers, "reread": softmax_reread, "copyreg": copy_reg,
           "reg2": softmax_reg2, "lag": softmax_lag}
#: kiln's registers kernel, one config at a time (cooperative.REGISTER_CONFIGS entries)
KILN_REGISTER_CONFIGS = [(64, 16, 64), (64, 16, None), (32, 8, None), (32, 16, None), (128, 16, 128)]
#: kiln's lagged-units kernel, one config at a time (cooperative.LAGGED_CONFIGS entries)
KILN_LAGGED_CONFIGS = [(32, 8, 10), (32, 8, 8), (32, 8, 9), (32, 8, 12), (32, 16, 10), (64, 16, 10)]


# ============================================================================================
# compile only (no GPU): every variant to an sm_90 cubin
# ============================================================================================


def _resources(cubin: bytes) -> dict:
    """Registers, local memory (spills) and shared memory of a cubin (cuobjdump from the
    triton wheel), so occupancy can be reasoned about without a GPU."""
    import re
    import subprocess
    import tempfile

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            text = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        except OSError:
            return {}
    got = dict(re.findall(r"(REG|LOCAL|SHARED):(\d+)", text))
    return {k.lower(): int(v) for k, v in got.items()}


def compile_only() -> dict:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    out = {}
    for v in variants():
        fn = KERNELS[v["kind"]]
        for _rows, cols in SHAPES[:1]:
            K = -(-cols // (v["kb"] * 1024 // 4))
            consts = constexprs(v, K)
            sig = {}
            for name in fn.arg_names:
                if name in consts:
                    sig[name] = "constexpr"
                elif name.endswith("_ptr"):
                    sig[name] = {"tick_ptr": "*i64", "err_ptr": "*i32"}.get(name, "*fp32")
                else:
                    sig[name] = "i32"
            # as a launch specialises them: pointers 16-aligned, N and the item count multiples of 16
            attrs = {(i,): [["tt.divisibility", 16]] for i, (n, t) in enumerate(sig.items())
                     if t.startswith("*") or n in ("N", "n_items")}
            t0 = time.perf_counter()
            try:
                k = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", 90, 32),
                                   options={"num_warps": v["warps"]})
                out[vname(v)] = {"ok": True, "s": round(time.perf_counter() - t0, 2), **_resources(k.asm["cubin"]),
                                 "ld_v4": k.asm["ptx"].count(".v4.b32"), "nanosleep": "nanosleep" in k.asm["ptx"]}
            except Exception as e:  # noqa: BLE001 - reported per variant
                out[vname(v)] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[-600:]}"}
            say(vname(v), out[vname(v)])
    return out


def interpret_smoke() -> dict:
    """No GPU, ``TRITON_INTERPRET=1``: the math of each kernel kind on a few small rows. The
    interpreter runs programs one after another, so a spin would never end: ``maxspin`` is 0
    (every program gives up at once) and each kernel runs twice; the second launch reads the
    partials the first one published (the same values), so its output must be the softmax."""
    import torch

    out = {}
    seen = set()
    for v in variants():
        key = (v["kind"], v["kb"], v.get("exp1", 1), v.get("prefetch"), v.get("rblock"))
        if v["backoff"] or key in seen:
            continue  # (nanosleep is inline PTX: no interpreter)
        seen.add(key)
        chunk = v["kb"] * 1024 // 4
        rows, cols = 4, chunk * 2 + chunk // 2  # K = 3, the last chunk masked (reg2: rows even)
        K = -(-cols // chunk)
        x = torch.randn(rows, cols) * 3
        x[1, :chunk] = float("-inf")  # a chunk with nothing in it
        y = torch.full_like(x, float("nan"))
        ws = torch.zeros(rows * K * 2)
        tick = torch.zeros(2 * rows, dtype=torch.int64)  # (lag: a second counter per row)
        err = torch.zeros(1, dtype=torch.int32)
        consts = constexprs(v, K)
        fn = KERNELS[v["kind"]]
        for _ in range(2):
            if v["kind"] == "pers":
                fn[(2 * K,)](x, y, ws, tick, err, cols, K, rows * K, 0, num_warps=v["warps"], **consts)
            elif v["kind"] == "lag":  # the lag at its least, K units
                fn[(K + 2 * rows * K,)](x, y, ws, tick, err, cols, K, 0, rows * K, K, num_warps=v["warps"], **consts)
            else:
                grid = rows * K // (2 if v["kind"] == "reg2" else 1)
                fn[(grid,)](x, y, ws, tick, err, cols, K, 0, num_warps=v["warps"], **consts)
        want = x if v["kind"] == "copyreg" else torch.softmax(x, -1)  # (copyreg: no softmax)
        try:
            torch.testing.assert_close(y, want, atol=1e-6, rtol=1e-4)
            out[vname(v)] = {"ok": True}
        except AssertionError as e:
            out[vname(v)] = {"ok": False, "error": str(e)[:300]}
        say(vname(v), out[vname(v)])
    return out


# ============================================================================================
# measuring on the GPU
# ============================================================================================


def occupancy(compiled, warps: int, props) -> int:
    """Programs of ``compiled`` resident per SM (registers, threads, shared memory)."""
    try:
        compiled._init_handles()
    except Exception:  # noqa: BLE001 - older/newer triton: already initialised
        pass
    n_regs = getattr(compiled, "n_regs", None)
    shared = getattr(compiled.metadata, "shared", 0) or 0
    regs_sm = getattr(props, "regs_per_multiprocessor", 65536) or 65536
    threads_sm = getattr(props, "max_threads_per_multi_processor", 2048) or 2048
    smem_sm = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024) or 228 * 1024
    if not n_regs:
        return 1
    per_warp = -(-n_regs * 32 // 256) * 256
    by_regs = regs_sm // (per_warp * warps)
    by_threads = threads_sm // (32 * warps)
    by_smem = smem_sm // (shared + 1024) if shared else 32
    return max(1, min(by_regs, by_threads, by_smem, 32))


class Case:
    """One shape: input, reference, copy bandwidth."""

    def __init__(self, torch, rows: int, cols: int):
        from triton.testing import do_bench

        self.torch, self.rows, self.cols = torch, rows, cols
        gen = torch.Generator(device="cuda").manual_seed(rows)
        self.x = torch.randn(rows, cols, device="cuda", generator=gen) * 3
        self.ref = torch.softmax(self.x, -1)
        self.y = torch.empty_like(self.x)
        self.nbytes = 2 * 4 * self.x.numel()
        dst = torch.empty_like(self.x)
        self.copy_ms = do_bench(lambda: dst.copy_(self.x), warmup=5, rep=60, return_mode="median")
        self.copy_GBps = self.nbytes / self.copy_ms / 1e6
        self.err = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.tickets: dict = {}

    def row(self, ms: float) -> dict:
        gbps = self.nbytes / ms / 1e6
        return {"ok": True, "ms": round(ms, 4), "GBps": round(gbps, 1), "pct_copy": round(100 * gbps / self.copy_GBps, 1)}

    def check(self, out) -> None:
        self.torch.testing.assert_close(out, self.ref, atol=1e-6, rtol=1e-4)


def run_variant(torch, case: Case, v: dict, props, cache: dict) -> dict:
    from triton.testing import do_bench

    chunk = v["kb"] * 1024 // 4
    K = -(-case.cols // chunk)
    if K > 1024:
        return {"ok": False, "error": f"K={K}: too many programs per row"}
    consts = constexprs(v, K)
    ws = torch.empty(case.rows * K * 2, dtype=torch.float32, device="cuda")
    tick = case.tickets.setdefault(K, torch.zeros(case.rows, dtype=torch.int64, device="cuda"))
    fn = KERNELS[v["kind"]]
    x, y = case.x, case.y
    info: dict = {"K": K}
    if v["kind"] == "pers":
        n_items = case.rows * K
        # compile once (grid 1 is enough to get the binary), then size the grid
        ck = cache.get((vname(v), consts["KB"]))
        if ck is None:
            ck = fn.warmup(x, y, ws, tick, case.err, case.cols, K, n_items, MAXSPIN, grid=(1,),
                           num_warps=v["warps"], **consts)
            cache[(vname(v), consts["KB"])] = ck
        occ = occupancy(ck, v["warps"], props)
        G = (props.multi_processor_count * occ // K) * K
        info.update({"occupancy": occ, "grid": G, "regs": getattr(ck, "n_regs", None),
                     "spills": getattr(ck, "n_spills", None)})
        if G == 0:
            return {"ok": False, "error": f"K={K} programs per row exceed {occ} x SMs resident", **info}
        G = min(G, n_items)

        def launch():
            return fn[(G,)](x, y, ws, tick, case.err, case.cols, K, n_items, MAXSPIN, num_warps=v["warps"], **consts)
    elif v["kind"] == "lag":
        U = case.rows * K
        lag = min(U, max(K, v["lag_mb"] * 2**20 // (v["kb"] * 1024)))  # >= K: a row's stats come first
        grid = (lag + 2 * U,)
        tick = case.tickets.setdefault(("lag", K), torch.zeros(2 * case.rows, dtype=torch.int64, device="cuda"))
        info["lag_units"] = lag

        def launch():
            return fn[grid](x, y, ws, tick, case.err, case.cols, K, MAXSPIN, U, lag, num_warps=v["warps"], **consts)
    else:
        if v["kind"] == "reg2" and case.rows % 2:
            return {"ok": False, "error": "reg2 needs an even row count"}
        grid = (case.rows * K // (2 if v["kind"] == "reg2" else 1),)

        def launch():
            return fn[grid](x, y, ws, tick, case.err, case.cols, K, MAXSPIN, num_warps=v["warps"], **consts)
    case.err.zero_()
    y.fill_(float("nan"))
    ck = launch()
    torch.cuda.synchronize()
    if "regs" not in info:
        info.update({"regs": getattr(ck, "n_regs", None), "spills": getattr(ck, "n_spills", None)})
    errs = int(case.err.item())
    if errs:
        return {"ok": False, "error": f"{errs} programs gave up waiting (spin bound): not co-resident?", **info}
    check = (lambda out: case.torch.testing.assert_close(out, x)) if v["kind"] == "copyreg" else case.check
    try:
        check(y)
    except AssertionError as e:
        return {"ok": False, "error": f"mismatch: {str(e)[:300]}", **info}
    ms = do_bench(launch, warmup=5, rep=60, return_mode="median")
    errs = int(case.err.item())
    if errs:
        return {"ok": False, "error": f"{errs} programs gave up waiting while timed", **info}
    check(y)  # and still right after the repeats (tickets across launches)
    return {**case.row(ms), **info}


def run_kiln(torch, case: Case, cooperative: str, register_configs: tuple | None = None) -> dict:
    """kiln's kernel with ``KILN_TRITON_COOPERATIVE=cooperative`` ("0": the looped online
    softmax; "1": cooperative rows as planned; "reread": the re-read design), the registers
    design's configs replaced by ``register_configs`` when given (one config: no autotuning)."""
    from triton.testing import do_bench

    if register_configs is not None:
        from kiln_codegen_triton import cooperative as coop_module

        which = "LAGGED_CONFIGS" if cooperative == "lagged" else "REGISTER_CONFIGS"
        saved_configs = getattr(coop_module, which)
        setattr(coop_module, which, register_configs)
        try:
            return run_kiln(torch, case, cooperative)
        finally:
            setattr(coop_module, which, saved_configs)

    with environ(KILN_TRITON_COOPERATIVE=cooperative, KILN_GRAPH_CACHE="0"):
        try:
            import torch.fx
            from kiln.backend import kiln_backend

            def softmax(x):
                return torch.softmax(x, -1)

            t0 = time.perf_counter()
            fn = kiln_backend(torch.fx.symbolic_trace(softmax), [case.x], options={"codegen": "triton"})
            out = fn(case.x)
            torch.cuda.synchronize()
            cold = time.perf_counter() - t0
            out = out[0] if isinstance(out, (list, tuple)) else out
            case.check(out)
            ms = do_bench(lambda: fn(case.x), warmup=5, rep=60, return_mode="median")
            return {**case.row(ms), "cold_s": round(cold, 2)}
        except Exception as e:  # noqa: BLE001 - reported, the sweep goes on
            return {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}


def _save(result: dict, out: str) -> None:
    with open(os.path.join(out, "softmax_long_sweep.json"), "w") as f:  # partial results too
        json.dump(result, f, indent=1)


def measure(args) -> dict:
    import torch

    props = torch.cuda.get_device_properties(0)
    result: dict = {"env": {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                            "triton": triton.__version__, "sms": props.multi_processor_count,
                            "l2_MB": round(getattr(props, "L2_cache_size", 0) / 2**20, 1)},
                    "shapes": {}}
    say(result["env"])
    cache: dict = {}
    vs = [v for v in variants() if not args.only or any(s in vname(v) for s in args.only.split(","))]
    shapes = SHAPES if not args.shapes else [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    cases = {}
    for rows, cols in shapes:
        case = cases[f"{rows}x{cols}"] = Case(torch, rows, cols)
        res: dict = {"copy_ms": round(case.copy_ms, 4), "copy_GBps": round(case.copy_GBps, 1), "variants": {}}
        result["shapes"][f"{rows}x{cols}"] = res
        say(f"{rows}x{cols}: copy {case.copy_ms:.4f} ms = {case.copy_GBps:.0f} GB/s")
    # the hand-written kernels first (their spins are bounded), kiln's last (its cooperative
    # spin is not: if it ever hangs, everything else is already saved)
    for name, case in cases.items():
        res = result["shapes"][name]
        for v in vs:
            if time.perf_counter() - T0 > args.budget_s:
                res["variants"][vname(v)] = {"ok": False, "error": "skipped: time budget"}
                continue
            try:
                r = run_variant(torch, case, v, props, cache)
            except Exception as e:  # noqa: BLE001 - reported, the sweep goes on
                r = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
                traceback.print_exc()
            res["variants"][vname(v)] = r
            say(f"  {name} {vname(v):36s} {r}")
        _save(result, args.out)
    if not args.no_kiln:
        for name, case in cases.items():
            # kiln's default (one program per row), lagged units (autotuned over
            # cooperative.LAGGED_CONFIGS), the spin design; then each lagged config alone
            kinds = [("kiln_default", "0", None), ("kiln_lagged", "lagged", None),
                     ("kiln_cooperative_spin", "1", None)]
            kinds += [(f"kiln_lagged_c{kb}k_w{w}_lag{mb}mb", "lagged", ((kb, w, mb),))
                      for kb, w, mb in KILN_LAGGED_CONFIGS]
            if args.kiln_spin_configs:
                kinds += [(f"kiln_coop_c{kb}k_w{w}" + (f"_maxnreg{cap}" if cap else ""), "1", ((kb, w, cap),))
                          for kb, w, cap in KILN_REGISTER_CONFIGS]
            for label, coop, configs in kinds:
                if time.perf_counter() - T0 > args.budget_s + 60:
                    result["shapes"][name]["variants"][label] = {"ok": False, "error": "skipped: time budget"}
                    continue
                try:
                    r = run_kiln(torch, case, coop, configs)
                except Exception as e:  # noqa: BLE001 - reported, the sweep goes on
                    r = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
                result["shapes"][name]["variants"][label] = r
                say(f"  {name} {label:36s} {r}")
                _save(result, args.out)
    return result


def table(result: dict) -> str:
    names = []
    for res in result["shapes"].values():
        for k in res["variants"]:
            if k not in names:
                names.append(k)
    shapes = list(result["shapes"])
    lines = ["variant".ljust(38) + "".join(f"{s:>24s}" for s in shapes)]
    lines.append("copy".ljust(38) + "".join(f"{result['shapes'][s]['copy_ms']:>12.4f} ms  100.0%  " for s in shapes))
    for n in names:
        cells = []
        for s in shapes:
            r = result["shapes"][s]["variants"].get(n)
            if r is None:
                cells.append(f"{'-':>24s}")
            elif r.get("ok"):
                cells.append(f"{r['ms']:>12.4f} ms {r['pct_copy']:6.1f}%  ")
            else:
                cells.append(f"{'FAIL':>24s}")
        lines.append(n.ljust(38) + "".join(cells))
    best = {}
    for s in shapes:
        ok = {k: r for k, r in result["shapes"][s]["variants"].items() if r.get("ok")}
        if ok:
            k = max(ok, key=lambda k: ok[k]["pct_copy"])
            best[s] = (k, ok[k]["pct_copy"])
    lines.append(f"best: {best}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or ".", help="folder for softmax_long_sweep.json")
    ap.add_argument("--compile-only", action="store_true", help="no GPU: compile every variant for sm_90")
    ap.add_argument("--interpret-smoke", action="store_true",
                    help="no GPU, TRITON_INTERPRET=1: each kernel kind's math on small rows")
    ap.add_argument("--only", default="", help="comma-separated substrings of variant names")
    ap.add_argument("--shapes", default="", help="e.g. 1024x262144,4096x65536")
    ap.add_argument("--no-kiln", action="store_true", help="skip kiln's own kernels")
    ap.add_argument("--kiln-spin-configs", action="store_true", help="also kiln's spin design per config")
    ap.add_argument("--budget-s", type=float, default=150.0, help="skip remaining variants after this")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.interpret_smoke or args.compile_only:
        out = interpret_smoke() if args.interpret_smoke else compile_only()
        bad = [k for k, r in out.items() if not r["ok"]]
        print(f"{len(out) - len(bad)}/{len(out)} ok ({'interpreter' if args.interpret_smoke else 'sm_90 cubin'}, "
              f"triton {triton.__version__}); failed: {bad}")
        return 1 if bad else 0
    result = measure(args)
    result["elapsed_s"] = round(time.perf_counter() - T0, 1)
    with open(os.path.join(args.out, "softmax_long_sweep.json"), "w") as f:
        json.dump(result, f, indent=1)
    text = table(result)
    print(text)
    with open(os.path.join(args.out, "softmax_long_sweep.txt"), "w") as f:
        f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
