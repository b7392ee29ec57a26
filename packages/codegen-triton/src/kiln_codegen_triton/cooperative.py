"""Cooperative rows: K programs share one long row, so it is read from DRAM once.

A looped row reduction followed by per-element work over the same row (softmax: max and sum,
then ``exp(x - max) / sum``) reads the row twice. With one program per row the second read
comes from DRAM: a row of 1 MB has long left L2 when its program re-reads it. With
``cooperative`` tiling each row is split into K chunks; program ``pid`` takes row
``pid // K``, chunk ``pid % K``:

1. it reduces its chunk (max and online sum, ...) and publishes the partials to a small
   global workspace (``coop_ws``: rows x K x parts, float32);
2. it takes a ticket (``atomic_add`` on the row's counter, acq_rel) and spins (acquire
   atomics) until the row's K tickets of this launch are out;
3. it loads the K partials (``.cg``: from L2), combines them (the same combine as lanes:
   max, sum, and the online rescale ``exp(w(m_k) - w(M))``), and
4. does the per-element work over its chunk and stores it.

Two designs (``registers_enabled``):

* **registers** (``Tiling.coop_registers``, the default when a config fits): the chunk is
  one block of RBLOCK elements (32 or 64 KB, ``REGISTER_CONFIGS``), loaded once and kept in
  registers across the exchange, so step 4 reads nothing: one read and one write of the row,
  like a copy. The kernel is written like a persistent reduction over the chunk (no loops;
  later nodes reuse the loaded values); the chunk's sum of ``exp(a - w(m))`` is taken
  relative to the chunk's max with its ``-inf`` entries counted apart
  (``TritonKernel._coop_chunk_sum``), the same two parts the online sum leaves. Only rows
  of a static length that need at most ``MAX_SPLIT`` chunks of some config take it.
* **re-read** (``KILN_TRITON_COOPERATIVE=reread``, or rows no register config fits): chunks
  of ``CHUNK_BYTES`` looped over in RBLOCK blocks twice, the second pass from L2 (only about
  #SMs x chunk bytes are in flight). Measured 20% of copy bandwidth on an H200.

``experiments/softmax-long-rows/softmax_long_sweep.py`` measures both against hand-written variants (chunk
size, warps, spin, persistent grid) and the copy bandwidth.

**Lagged units** (``Tiling.coop_lagged``, ``KILN_TRITON_COOPERATIVE=lagged``,
``lagged_configs``): the same chunk
of one RBLOCK block, but the two halves of the work are different programs of one launch.
A *stats unit* loads its chunk (kept in L2), reduces it (max, then the sum of ``exp(a -
w(m))``: one exp per element), publishes its partials and counts itself on the row's
counter (release). A *normalize unit* takes a ticket on the row's second counter, waits
(acquire) until the row's K stats units of its launch are counted, combines the K partials,
re-reads its chunk (from L2) and does the per-element work. Program ``pid`` maps to units
in this order: the first ``LAG`` positions are stats units 0..LAG-1; then stats and
normalize units alternate (stats LAG+i, normalize i); then the last LAG normalize units. So
a normalize unit starts about 2 x LAG positions after its chunk's stats unit: late enough
that its row's stats are long done (no wait), early enough that its chunk is still in L2
(LAG x chunk bytes, ``LAG_BYTES``, a few MB: an autotuned config key). No program waits on
a program that starts after it (every normalize unit's stats units come earlier in the
order, and stats units never wait), so nothing depends on how many programs are resident,
and under the Triton interpreter (programs one after another, in order) it runs as is. On
an H200, hand-written (``experiments/softmax-long-rows/softmax_long_sweep.py``, ``lag_*``): 85.0% of copy
bandwidth on 1024x262144 float32 at 32 KB x 8 warps and a 10 MB lag, against 76-78% for the
designs above; the lag matters (8 MB: 72%, 16 MB: 77%, 32 MB: 65%, the L2 misses).
kiln's own kernel, the default since session 8, measures the same (85.1%; it had measured
44% before ``partials_block``, one-instruction NaN max and the -inf flag without a reduction).

Why the spin designs cannot deadlock: a row's K programs have consecutive pids, and the GPU starts blocks
in pid order; when the last program of a row starts, the row's earlier programs are running
or done, so every program waits only on programs that are resident or already finished, as
long as K is at most the number of programs that can be resident at once (``MAX_SPLIT`` is
far below 132 SMs x 1). The Triton interpreter runs programs one after another, so the first
program would wait forever: ``mode`` is never "spin" there, and the ordinary
looped kernel runs instead.

Replays: the counters are never reset. Tickets grow by K per launch; a program's target is
the end of its launch's block of K tickets (``ticket - ticket % K + K``), so a CUDA-graph
replay (same arguments, same workspace) is correct. The workspace is kept per (device, rows,
K, parts) by the launcher (int64 counters: 2^63 tickets).

Triton versions: the spin ``while`` carries only a scalar (``pending``, the row block's
smallest ``seen - target``, polled by an acquire ``atomic_add(ptr, 0)``). Carrying the
``[XBLOCK, 1]`` ticket tensor itself, dead after the loop, gives an ``scf.while`` with a tensor
argument and no results, and Triton 3.6's ``TritonGPURemoveLayoutConversions`` crashes on it
(an assertion, "Result number is out of range"); 3.9 accepts both.
Triton 3.6 also gives the kernel 128 registers and a stack (spills) when the partials are
loaded with ``volatile=True`` ([XBLOCK, SPLITB] tensors); ``cache_modifier=".cg"`` (L2, after
the acquire: the memory model orders it) gives 51. ``tests/test_cooperative_compile.py``
compiles both designs for sm_90 with the installed Triton.
"""

from __future__ import annotations

import functools
import os

#: ``KILN_TRITON_COOPERATIVE``: "lagged" (the default: lagged units), "0" (one program per
#: row), "1" (the spin designs: registers where a config fits, else re-read), "reread".
#: Lagged units measured 85.1/82.9/86.2% of copy bandwidth on an H200 (1024x262144,
#: 256x1048576, 4096x65536 float32 softmax), one program per row 57-64%
ENV = "KILN_TRITON_COOPERATIVE"
#: the value when ``ENV`` is unset
DEFAULT = "lagged"
#: rows shorter than this stay one program per row
MIN_RNUMEL = 65536
#: bytes of one program's chunk of a row (float32 elements: CHUNK_BYTES // 4); a launch
#: config may ask for another (``CHUNK_BYTES`` key, autotuned): what stays in L2 is about
#: resident programs x chunk, which must stay well below the L2 size
CHUNK_BYTES = 32 * 1024
#: most programs per row (far below the resident-program count of any GPU we target)
MAX_SPLIT = 64
#: reduction types whose partials combine exactly (plus online sums, see kernel.py)
COMBINABLE = ("sum", "max", "min")
#: the chunk in registers (``Tiling.coop_registers``) when a config fits the row: one read
REGISTERS = True
#: registers: (chunk KB, warps, register cap or None) per config, the first the default; a
#: chunk is one RBLOCK block. On an H200 (experiments/softmax-long-rows/softmax_long_sweep.py, hand-written
#: kernels): 64 KB x 16 warps at two programs per SM was best (77-81% of copy bandwidth);
#: kiln's kernel needs 77 registers there (one program per SM), capped at 64 (a 16-byte spill)
REGISTER_CONFIGS = ((64, 16, 64), (64, 16, None), (32, 8, None))
#: registers: softmax's ``exp(x - M)`` as the chunk's ``exp(x - m)`` times ``exp(m - M)``
#: (one exp per element; two cost 1-5 points of bandwidth on an H200)
ONE_EXP = True
#: ``CHUNK_BYTES`` of a registers config: the chunk is exactly RBLOCK (split_row never grows it)
ONE_BLOCK = 0
#: the re-read design's configs: (RBLOCK, warps, chunk KB)
REREAD_CONFIGS = ((2048, 8, 32), (4096, 16, 64), (2048, 8, 16), (1024, 4, 32))


#: lagged units: (chunk KB, warps, lag MB) per config, the first the default (H200 sweep:
#: 32 KB x 8 warps at 10 MB best; the lag's best depends on how many programs are resident)
LAGGED_CONFIGS = ((32, 8, 10), (32, 8, 8), (32, 8, 12), (32, 16, 10), (64, 16, 10))
#: lagged units: most chunks per row (the partials of a row are combined in one block)
LAGGED_MAX_SPLIT = 1024


def mode(interpret: bool) -> str:
    """The one switch: "lagged", "spin" (``KILN_TRITON_COOPERATIVE=1``/``reread``; never under
    the Triton interpreter, where a spin-wait hangs) or "off"."""
    value = os.environ.get(ENV, DEFAULT)
    if value in ("", "0"):
        return "off"
    if value == "lagged":
        return "lagged"
    return "off" if interpret else "spin"


def lagged_configs(rnumel: int, elem_bytes: int = 4) -> list[dict]:
    """The lagged design's launch configs for rows of ``rnumel`` (the chunk one block)."""
    out = []
    for kb, warps, lag_mb in LAGGED_CONFIGS:
        rblock = (kb << 10) // elem_bytes
        if _cdiv(rnumel, rblock) <= LAGGED_MAX_SPLIT:
            out.append({"XBLOCK": 1, "RBLOCK": rblock, "num_warps": warps, "CHUNK_BYTES": ONE_BLOCK,
                        "LAG_BYTES": lag_mb << 20})
    return out


def lagged_unit(pid: int, units: int, lag: int) -> tuple[bool, int]:
    """(is a stats unit, unit) of program ``pid`` in a launch of ``2 * units`` programs: what
    the kernel's header computes (``lagq``, ``lagtail``), here for tests and readers."""
    q = pid - lag
    tail = q - 2 * (units - lag)
    if q < 0:
        return True, pid
    if tail >= 0:
        return False, units - lag + tail
    return (True, lag + q // 2) if q % 2 == 0 else (False, q // 2)


def lag_units(lag_bytes: int, rchunk: int, k: int, units: int, elem_bytes: int = 4) -> int:
    """The lag in units: ``lag_bytes`` of chunks, at least K (a row's stats units then all
    come before its first normalize unit) and at most every unit."""
    return max(1, min(units, max(k, lag_bytes // (rchunk * elem_bytes))))


#: elements per thread of the row's tile in a cooperative kernel (Triton lays the row's
#: [1, RBLOCK] float32 loads out as 16-byte vectors: 4 per thread)
ROW_TILE_PER_THREAD = 4


def partials_block(k: int, num_warps: int) -> int:
    """SPLITB, the width of the [1, SPLITB] block the K partials of a row are loaded in: a
    power of two of at least K, and at least the row's tile (``ROW_TILE_PER_THREAD`` x 32 x
    num_warps). A smaller block shares the row's layout and is replicated across the tile:
    at K = 32 and 8 warps, every partial was loaded by 32 lanes, the K units of a row read
    the same few L2 lines thousands of times, and the lagged kernel measured 44-56% of copy
    bandwidth on an H200 with its normalize units waiting (experiments/softmax-long-rows/softmax_lag_bisect.py);
    with the block as wide as the tile, 84-86%, as the hand-written kernel."""
    return max(1 << max(0, (k - 1).bit_length()), ROW_TILE_PER_THREAD * 32 * num_warps)


def registers_enabled() -> bool:
    """The registers design unless ``REGISTERS`` is off or ``KILN_TRITON_COOPERATIVE=reread``
    asks for the re-read one (experiments/softmax-long-rows/softmax_long_sweep.py measures both)."""
    return REGISTERS and os.environ.get(ENV, "") != "reread"


def max_split() -> int:
    """Most programs per row: ``MAX_SPLIT``, and at most the current GPU's SM count. Every SM
    holds at least one program of a kernel that launches, and programs start in pid order, so
    a row's K <= #SMs programs are resident together: none waits on one that cannot start."""
    sms = _sm_count()
    return MAX_SPLIT if sms is None else min(MAX_SPLIT, sms)


@functools.cache
def _sm_count() -> int | None:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    except Exception:  # noqa: BLE001 - no usable CUDA: MAX_SPLIT alone
        pass
    return None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_row(rnumel: int, rblock: int, chunk_bytes: int | None = None, elem_bytes: int = 4,
              lagged: bool = False) -> tuple[int, int]:
    """(rchunk, K): chunk length (a multiple of RBLOCK) and programs per row. ``ONE_BLOCK``
    (registers): the chunk is RBLOCK itself, and a row needing more than ``MAX_SPLIT`` of
    them is an error (the plan only takes rows that fit, see ``register_configs``)."""
    if chunk_bytes == ONE_BLOCK:
        k = max(1, _cdiv(rnumel, rblock))
        if k > max_split() and not lagged:
            raise ValueError(f"cooperative registers: a row of {rnumel} needs {k} chunks of {rblock}, "
                             f"more than max_split()={max_split()} (MAX_SPLIT, SMs)")
        return rblock, k
    chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    chunk = max(rblock, (chunk_bytes // elem_bytes) // rblock * rblock)
    if _cdiv(rnumel, chunk) > MAX_SPLIT:
        chunk = _cdiv(_cdiv(rnumel, MAX_SPLIT), rblock) * rblock
    return chunk, max(1, _cdiv(rnumel, chunk))


def register_configs(rnumel: int, elem_bytes: int = 4) -> list[dict]:
    """The registers design's launch configs for rows of ``rnumel``: those whose chunk count
    stays within ``MAX_SPLIT`` (none: the re-read design)."""
    out = []
    for kb, warps, maxnreg in REGISTER_CONFIGS:
        rblock = (kb << 10) // elem_bytes
        if _cdiv(rnumel, rblock) <= max_split():
            config = {"XBLOCK": 1, "RBLOCK": rblock, "num_warps": warps, "CHUNK_BYTES": ONE_BLOCK}
            out.append(config if maxnreg is None else {**config, "maxnreg": maxnreg})
    return out


def launch_configs(tiling) -> list[dict]:
    """A cooperative kernel's autotuning configs (one row per program)."""
    if tiling.coop_lagged:
        return lagged_configs(int(tiling.numels["rnumel"]))
    if tiling.coop_registers:
        return register_configs(int(tiling.numels["rnumel"]))
    return [{"XBLOCK": 1, "RBLOCK": r, "num_warps": w, "CHUNK_BYTES": c << 10} for r, w, c in REREAD_CONFIGS]
