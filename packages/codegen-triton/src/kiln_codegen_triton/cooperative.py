"""Cooperative rows: K programs share one long row, so its second read comes from L2.

A looped row reduction followed by per-element work over the same row (softmax: max and sum,
then ``exp(x - max) / sum``) reads the row twice. With one program per row the second read
comes from DRAM: a row of 1 MB has long left L2 when its program re-reads it. With
``cooperative`` tiling each row is split into K chunks of ``CHUNK_BYTES``; program
``pid`` takes row ``pid // K``, chunk ``pid % K``:

1. it reduces its chunk (max and online sum, ...) and publishes the partials to a small
   global workspace (``coop_ws``: rows x K x parts, float32);
2. it takes a ticket (``atomic_add`` on the row's counter, acq_rel) and spins (acquire
   atomics) until the row's K tickets of this launch are out;
3. it loads the K partials, combines them (the same combine as lanes: max, sum, and the
   online rescale ``exp(w(m_k) - w(M))``), and
4. re-reads its own chunk, still in L2 (only about #SMs x chunk bytes are in flight), for the
   per-element work and its stores.

Why it cannot deadlock: a row's K programs have consecutive pids, and the GPU starts blocks
in pid order; when the last program of a row starts, the row's earlier programs are running
or done, so every program waits only on programs that are resident or already finished, as
long as K is at most the number of programs that can be resident at once (``MAX_SPLIT`` is
far below 132 SMs x 1). The Triton interpreter runs programs one after another, so the first
program would wait forever: ``cooperative_rows_enabled`` is False there, and the ordinary
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
``tests/test_cooperative_compile.py`` compiles the kernel for sm_90 with the installed Triton.
"""

from __future__ import annotations

import os

#: off unless asked for: ``KILN_TRITON_COOPERATIVE=1`` (needs measuring on each GPU)
ENV = "KILN_TRITON_COOPERATIVE"
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


def cooperative_rows_enabled(interpret: bool) -> bool:
    """The one switch: never under the Triton interpreter (a spin-wait there hangs)."""
    if interpret:
        return False
    return os.environ.get(ENV, "0") not in ("", "0")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_row(rnumel: int, rblock: int, chunk_bytes: int | None = None, elem_bytes: int = 4) -> tuple[int, int]:
    """(rchunk, K): chunk length (a multiple of RBLOCK) and programs per row."""
    chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    chunk = max(rblock, (chunk_bytes // elem_bytes) // rblock * rblock)
    if _cdiv(rnumel, chunk) > MAX_SPLIT:
        chunk = _cdiv(_cdiv(rnumel, MAX_SPLIT), rblock) * rblock
    return chunk, max(1, _cdiv(rnumel, chunk))
