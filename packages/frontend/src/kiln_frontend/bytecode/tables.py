"""Binary formats of ``co_exceptiontable`` and ``co_linetable`` (CPython 3.11 and 3.12 share
both; see CPython's Objects/exception_handling_notes.txt and Objects/locations.md)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

# --------------------------------------------------------------------------------------
# Exception table
#
# A sequence of entries (start, length, target, depth<<1 | lasti), each number a varint of
# 6-bit groups written most significant group first, bit 6 set on every group but the last;
# the first byte of an entry additionally has bit 7 set.  start/length/target count code
# units (2 bytes).
# --------------------------------------------------------------------------------------


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    b = data[i]
    value = b & 63
    i += 1
    while b & 64:
        b = data[i]
        i += 1
        value = (value << 6) | (b & 63)
    return value, i


def parse_exception_table(data: bytes) -> list[tuple[int, int, int, int, bool]]:
    """``[(start, end, target, depth, lasti)]`` with byte offsets; ``end`` is exclusive."""
    out = []
    i = 0
    while i < len(data):
        start, i = _read_varint(data, i)
        length, i = _read_varint(data, i)
        target, i = _read_varint(data, i)
        dl, i = _read_varint(data, i)
        out.append((2 * start, 2 * (start + length), 2 * target, dl >> 1, bool(dl & 1)))
    return out


def _write_varint(out: bytearray, value: int, first: bool = False) -> None:
    groups = [value & 63]
    value >>= 6
    while value:
        groups.append(value & 63)
        value >>= 6
    groups.reverse()
    for k, g in enumerate(groups):
        b = g
        if k < len(groups) - 1:
            b |= 64
        if first and k == 0:
            b |= 128
        out.append(b)


def encode_exception_table(entries: Iterable[tuple[int, int, int, int, bool]]) -> bytes:
    """Inverse of :func:`parse_exception_table` (byte offsets, exclusive end)."""
    out = bytearray()
    for start, end, target, depth, lasti in entries:
        assert start % 2 == 0 and end % 2 == 0 and target % 2 == 0 and end > start
        _write_varint(out, start // 2, first=True)
        _write_varint(out, (end - start) // 2)
        _write_varint(out, target // 2)
        _write_varint(out, (depth << 1) | int(bool(lasti)))
    return bytes(out)


# --------------------------------------------------------------------------------------
# Location table (3.11+)
#
# Each entry covers 1..8 code units: first byte 1CCCCLLL (C: code, L: length - 1).
#   15: no location;  14: long form (svarint line delta, varint end-line delta,
#   varint col+1, varint end_col+1);  13: no columns (svarint line delta);
#   10-12: one-line form, line delta = code - 10, then col and end_col bytes;
#   0-9: short form (same line), col = code*8 + (b>>4 & 7), end_col = col + (b & 15).
# varints here are 6-bit groups, least significant first, bit 6 = "more follows";
# svarint maps v to (-v << 1) | 1 for negatives and v << 1 otherwise.
# --------------------------------------------------------------------------------------


def _lt_varint(out: bytearray, value: int) -> None:
    assert value >= 0
    while value >= 64:
        out.append(64 | (value & 63))
        value >>= 6
    out.append(value)


def _lt_svarint(out: bytearray, value: int) -> None:
    _lt_varint(out, ((-value) << 1) | 1 if value < 0 else value << 1)


def encode_location_table(
    runs: Iterable[tuple[int, tuple[int | None, int | None, int | None, int | None] | None]],
    firstlineno: int,
    merge_runs: bool = True,
) -> bytes:
    """Encode ``[(size_in_code_units, positions_or_None)]`` (one item per instruction,
    EXTENDED_ARG prefixes and CACHE entries included in its size).  With ``merge_runs``
    consecutive items with equal positions share entries (the 3.12 compiler does this; the
    3.11 one writes each instruction separately)."""
    out = bytearray()
    line = firstlineno
    items = _merge_runs(runs) if merge_runs else _normalize_runs(runs)
    for size, pos in items:
        while size > 0:
            chunk = min(size, 8)
            size -= chunk
            line = _write_location(out, chunk, pos, line)
    return bytes(out)


def _normalize_runs(runs: Iterable[tuple[int, tuple | None]]) -> Iterator[tuple[int, tuple | None]]:
    for size, pos in runs:
        if pos is None or pos[0] is None:
            yield size, None
        else:
            yield size, tuple(pos)


def _merge_runs(runs: Iterable[tuple[int, tuple | None]]) -> Iterator[tuple[int, tuple | None]]:
    cur_pos: tuple | None = None
    cur_size = 0
    for size, pos in runs:
        if pos is not None and pos[0] is None:
            pos = None
        if pos is not None:
            pos = tuple(pos)
        if cur_size and pos == cur_pos:
            cur_size += size
            continue
        if cur_size:
            yield cur_size, cur_pos
        cur_pos, cur_size = pos, size
    if cur_size:
        yield cur_size, cur_pos


def _write_location(out: bytearray, length: int, pos: tuple | None, line: int) -> int:
    head = 0x80 | (length - 1)
    if pos is None:
        out.append(head | (15 << 3))
        return line
    lineno, end_lineno, col, end_col = pos
    delta = lineno - line
    if end_lineno is None:
        end_lineno = lineno
    if col is None or end_col is None:
        if end_lineno == lineno:
            out.append(head | (13 << 3))
            _lt_svarint(out, delta)
            return lineno
    elif end_lineno == lineno:
        if delta == 0 and col < 80 and 0 <= end_col - col < 16:
            out.append(head | ((col >> 3) << 3))
            out.append(((col & 7) << 4) | (end_col - col))
            return lineno
        if 0 <= delta < 3 and col < 128 and end_col < 128:
            out.append(head | ((10 + delta) << 3))
            out.append(col)
            out.append(end_col)
            return lineno
    out.append(head | (14 << 3))
    _lt_svarint(out, delta)
    _lt_varint(out, max(0, end_lineno - lineno))
    _lt_varint(out, 0 if col is None else col + 1)
    _lt_varint(out, 0 if end_col is None else end_col + 1)
    return lineno
