"""``config.debug`` / ``KILN_DEBUG=1`` printouts, in TorchDynamo's format:

* per graph: ``TRACED GRAPH`` with the graph as a table (opcode, name, target, args,
  kwargs),
* per frame: ``ORIGINAL BYTECODE``, ``MODIFIED BYTECODE`` and ``GUARDS``.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterable
from typing import TextIO

import torch.fx

from .bytecode import disassemble
from .guards import Guard, format_guards


def debug_enabled() -> bool:
    if os.environ.get("KILN_DEBUG", "") not in ("", "0"):
        return True
    try:
        from . import config  # H1's module
    except ImportError:  # pragma: no cover - before config.py exists
        return False
    return bool(getattr(config, "debug", False))


def _target_str(node: torch.fx.Node) -> str:
    t = node.target
    if isinstance(t, str):
        return t
    return str(t)


def format_table(rows: list[list[str]], headers: list[str]) -> str:
    """A plain text table like ``tabulate``'s "simple" format."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
             "  ".join("-" * w for w in widths)]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def format_graph_table(gm: torch.fx.GraphModule | torch.fx.Graph) -> str:
    graph = gm.graph if isinstance(gm, torch.fx.GraphModule) else gm
    rows = [[n.op, n.name, _target_str(n), str(n.args), str(n.kwargs)] for n in graph.nodes]
    return format_table(rows, ["opcode", "name", "target", "args", "kwargs"])


def print_graph(name: str, code_name: str, gm: torch.fx.GraphModule,
                file: TextIO | None = None) -> None:
    out = file or sys.stdout
    print(f"TRACED GRAPH\n {name} {code_name}", file=out)
    print(format_graph_table(gm), file=out)
    print(file=out)


def print_frame(code: types.CodeType, new_code: types.CodeType, guards: Iterable[Guard],
                file: TextIO | None = None) -> None:
    out = file or sys.stdout
    where = f"{code.co_name} {code.co_filename} line {code.co_firstlineno}"
    print(f"ORIGINAL BYTECODE {where}", file=out)
    print(disassemble(code), file=out)
    print(file=out)
    print(f"MODIFIED BYTECODE {where}", file=out)
    print(disassemble(new_code), file=out)
    print(file=out)
    print("GUARDS:", file=out)
    print(format_guards(guards), file=out)
    print(file=out)


__all__ = ["debug_enabled", "format_graph_table", "format_table", "print_frame", "print_graph"]
