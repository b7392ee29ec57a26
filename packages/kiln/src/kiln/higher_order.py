"""How kiln compiles the bodies of higher-order operators (``torch.cond``'s branches,
``while_loop``'s cond and body) that loopir meets as ATen GraphModules: each body goes through
the same pipeline as a whole graph (aotgrad's inference trace, then the stages from ``lower``:
loopir, codegen, runtime) and loopir's extern call runs it
(``kiln_loopir.lowerings.higher_order``). Also where a ``flex_attention`` call is compiled to
its codegen's fused kernel or to dense ATen math (``flex_attention_fused``, below).

A body is compiled with the Options of the compile whose graph holds it: ``kiln.stages``'
``lower`` stage, where loopir meets the node and compiles its bodies, sets them for its
duration (``kiln.options.body_options``); so ``codegen="triton"`` on a CPU makes Triton
bodies too. Outside a compile (loopir lowering a graph by itself) bodies get the defaults.

The graph cache never stores a graph holding such bodies: a body is a GraphModule attribute of
the graph, which has no stable text (``kiln.cache`` raises NotCacheable), and the wrapper names
bodies compiled in this process."""

from __future__ import annotations

from collections.abc import Callable

import kiln_aotgrad.flex_attention
import torch
from kiln_loopir.lowerings.higher_order import (
    FLEX_ATTENTION_TEMPLATES,
    FlexAttentionTemplate,
    set_flex_attention_compiler,
    set_subgraph_compiler,
)

from .codegens import codegen_entry_for_device
from .options import current_body_options


def compile_subgraph(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """An ATen body -> a callable returning its outputs as a list."""
    import kiln_aotgrad

    from .graph_to_callable import compile_aten

    aten = kiln_aotgrad.trace_inference(gm, example_inputs)
    compiled = compile_aten(aten, current_body_options())

    def body(*args):
        out = compiled(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    return body


set_subgraph_compiler(compile_subgraph)


# ------------------------------------------------------------------------------- flex_attention
# The one place that chooses how a flex_attention call compiles: a fused kernel where the
# compile's codegen has a FlexAttention template that takes the inputs (asked by aotgrad's rule
# while it traces, which then keeps the operator for loopir to lower to that kernel), else the
# dense ATen rule (C++ on CPU; training graphs; inputs a template refuses). Among the fused
# forwards, a query of at most DECODE_MAX_QUERY rows takes the template's decoding kernel.

#: longest query that takes the decoding (split-KV) forward: one 16-row tile, so each share
#: of the keys is read once, where the forward's 128-row tile would be mostly padding
DECODE_MAX_QUERY = 16


def _template(device) -> FlexAttentionTemplate | None:
    """The FlexAttention template of the codegen this compile uses on ``device`` (loading
    the codegen's entry point imports it, which registers its template), or None."""
    entry = codegen_entry_for_device(device, current_body_options())
    return FLEX_ATTENTION_TEMPLATES.get(entry.name)


def flex_attention_fused(query, key, value, block_mask, needs_grad: bool) -> bool:
    """Whether this compile runs the call as fused kernels (else the dense rule); under
    grad, only where the template has a backward too. Which fused forward runs is
    ``fused_forward_kind``'s choice."""
    template = _template(query.device)
    if template is None or (needs_grad and template.build_backward is None):
        return False
    return template.unsupported(query, key, value, (int(block_mask[-3]), int(block_mask[-2]))) is None


def fused_forward_kind(template: FlexAttentionTemplate, query) -> str:
    """``"decode"`` (the template's split-KV decoding kernel) for a query of at most
    ``DECODE_MAX_QUERY`` rows where the template has one, else ``"forward"``."""
    if template.build_decode is not None and query.size(-2) <= DECODE_MAX_QUERY:
        return "decode"
    return "forward"


def compile_flex_attention(*graphs_and_examples, backward: bool = False):
    """The fused kernel (forward, decoding forward or ``backward``) of a call
    ``flex_attention_fused`` chose."""
    query = graphs_and_examples[-3]
    template = _template(query.device)
    if template is None:
        build = None
    elif backward:
        build = template.build_backward
    else:
        build = {"decode": template.build_decode,
                 "forward": template.build}[fused_forward_kind(template, query)]
    if build is None:
        raise RuntimeError(f"no FlexAttention {'backward ' if backward else ''}template for "
                           f"{query.device}'s codegen")
    return build(*graphs_and_examples)


kiln_aotgrad.flex_attention.set_fused_choice(flex_attention_fused)
set_flex_attention_compiler(compile_flex_attention)
