"""Counter-based random numbers (Philox4x32-10) in plain torch: the reference of ``ops.rand``,
``ops.randn`` and ``ops.randint64``.

A number is a pure function of a 64-bit ``seed`` and a 32-bit counter ``offset``: no state, so
any kernel, tiling, fusion or recompile that asks for (seed, offset) gets the same number. The
algorithm and the float conversions are Triton's ``tl.rand`` / ``tl.randn`` / ``tl.randint4x``
(Philox4x32 with 10 rounds, key = (seed low word, seed high word), counter = (offset, 0, 0, 0)),
so the loopir interpreter and Triton kernels give the same numbers: ``rand`` and ``randint64``
bit for bit; ``randn`` up to the last bits of ``log``/``cos`` (each platform's libm).

Words are held in int64 tensors with values in [0, 2**32): every product is split so that no
intermediate leaves int64.
"""

from __future__ import annotations

import torch

__all__ = ["philox4x32", "uniform", "normal", "randint64", "ROUNDS"]

ROUNDS = 10
_MASK = 0xFFFFFFFF
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85  # key increments per round
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57  # round multipliers
#: Triton's uint32 -> [0, 1) scale: the largest float with (2**31 - 1) * scale < 1
_UNIFORM_SCALE = 4.6566127342e-10


def _mul_hi_lo(const: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high word, low word) of ``const * x`` for a 32-bit constant and 32-bit words ``x``."""
    x_hi, x_lo = x >> 16, x & 0xFFFF
    p_hi, p_lo = const * x_hi, const * x_lo  # each < 2**48
    hi = (p_hi + (p_lo >> 16)) >> 16
    lo = (((p_hi & 0xFFFF) << 16) + p_lo) & _MASK
    return hi, lo


def philox4x32(seed: torch.Tensor, offset: torch.Tensor, rounds: int = ROUNDS):
    """The four 32-bit words (int64 tensors in [0, 2**32)) Philox4x32 gives for key ``seed``
    (int64: low word, high word) and counter ``(offset mod 2**32, 0, 0, 0)``."""
    seed = torch.as_tensor(seed, dtype=torch.int64)
    offset = torch.as_tensor(offset).to(torch.int64)
    shape = torch.broadcast_shapes(seed.shape, offset.shape)
    k0 = (seed & _MASK).expand(shape)
    k1 = ((seed >> 32) & _MASK).expand(shape)
    c0 = (offset & _MASK).expand(shape)
    zero = torch.zeros(shape, dtype=torch.int64, device=c0.device)
    c1, c2, c3 = zero, zero, zero
    for _ in range(rounds):
        hi_b, lo_b = _mul_hi_lo(_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK
        k1 = (k1 + _KEY_B) & _MASK
    return c0, c1, c2, c3


def _f32(value: float, like: torch.Tensor) -> torch.Tensor:
    """A float32 constant on ``like``'s device (Triton rounds its constants to float32 too)."""
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def _to_uniform(word: torch.Tensor) -> torch.Tensor:
    """A 32-bit word -> float32 in [0, 1), as Triton's ``uint_to_uniform_float``: read as int32,
    negative values complemented, times the scale (all in float32)."""
    folded = torch.where(word >= 2**31, _MASK - word, word)  # ~x of the int32 reading
    return folded.to(torch.float32) * _f32(_UNIFORM_SCALE, word)


def uniform(seed, offset) -> torch.Tensor:
    """float32 uniform on [0, 1): ``tl.rand(seed, offset)`` (first Philox word)."""
    c0, _, _, _ = philox4x32(seed, offset)
    return _to_uniform(c0)


def normal(seed, offset) -> torch.Tensor:
    """float32 standard normal: ``tl.randn(seed, offset)`` (Box-Muller of the first two words)."""
    c0, c1, _, _ = philox4x32(seed, offset)
    u1 = torch.maximum(_to_uniform(c0), _f32(1.0e-7, c0))
    th = _f32(6.283185307179586, c1) * _to_uniform(c1)
    r = torch.sqrt(_f32(-2.0, c0) * torch.log(u1))
    return r * torch.cos(th)


def randint64(seed, offset, low, high) -> torch.Tensor:
    """int64 uniform on [low, high): ``low + (w0 | w1 << 32) mod (high - low)`` (an unsigned
    64-bit draw from the first two words); ``high - low`` must be in [1, 2**31]."""
    c0, c1, _, _ = philox4x32(seed, offset)
    low = torch.as_tensor(low, dtype=torch.int64)
    span = torch.as_tensor(high, dtype=torch.int64) - low
    # (c1 * 2**32 + c0) mod span without leaving int64: every factor is below span <= 2**31
    r = ((c1 % span) * ((2**32) % span) + c0 % span) % span
    return low + r
