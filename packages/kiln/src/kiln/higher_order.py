"""How kiln compiles the bodies of higher-order operators (``torch.cond``'s branches,
``while_loop``'s cond and body) that loopir meets as ATen GraphModules: each body goes through
the same pipeline as a whole graph (aotgrad's inference trace, then the stages from ``lower``:
loopir, the device's default codegen, runtime) and loopir's extern call runs it
(``kiln_loopir.lowerings.higher_order``).

The graph cache never stores a graph holding such bodies: a body is a GraphModule attribute of
the graph, which has no stable text (``kiln.cache`` raises NotCacheable), and the wrapper names
bodies compiled in this process."""

from __future__ import annotations

from collections.abc import Callable

import torch
from kiln_loopir.lowerings.higher_order import set_subgraph_compiler


def compile_subgraph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """An ATen body -> a callable returning its outputs as a list."""
    import kiln_aotgrad

    from .backend import compile_aten
    from .options import Options

    aten = kiln_aotgrad.trace_inference(gm, example_inputs)
    compiled = compile_aten(aten, Options())

    def body(*args):
        out = compiled(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    return body


set_subgraph_compiler(compile_subgraph)
