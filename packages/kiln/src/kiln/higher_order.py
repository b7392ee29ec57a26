"""How kiln compiles the bodies of higher-order operators (``torch.cond``'s branches,
``while_loop``'s cond and body) that loopir meets as ATen GraphModules: each body goes through
the same pipeline as a whole graph (aotgrad's inference trace, then the stages from ``lower``:
loopir, codegen, runtime) and loopir's extern call runs it
(``kiln_loopir.lowerings.higher_order``).

A body is compiled with the Options of the compile whose graph holds it: ``kiln.stages``'
``lower`` stage, where loopir meets the node and compiles its bodies, sets them for its
duration (``kiln.options.body_options``); so ``codegen="triton"`` on a CPU makes Triton
bodies too. Outside a compile (loopir lowering a graph by itself) bodies get the defaults.

The graph cache never stores a graph holding such bodies: a body is a GraphModule attribute of
the graph, which has no stable text (``kiln.cache`` raises NotCacheable), and the wrapper names
bodies compiled in this process."""

from __future__ import annotations

from collections.abc import Callable

import torch
from kiln_loopir.lowerings.higher_order import set_subgraph_compiler

from .options import current_body_options


def compile_subgraph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """An ATen body -> a callable returning its outputs as a list."""
    import kiln_aotgrad

    from .backend import compile_aten

    aten = kiln_aotgrad.trace_inference(gm, example_inputs)
    compiled = compile_aten(aten, current_body_options())

    def body(*args):
        out = compiled(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    return body


set_subgraph_compiler(compile_subgraph)
