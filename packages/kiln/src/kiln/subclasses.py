"""Graphs over traceable tensor subclasses (DTensor, quantized weights, TwoTensor): the
subclass boundary of ``kiln_aotgrad.desugar_subclasses`` around the plain graph, which then
takes kiln's usual path (cache, stages or training, assemble). docs/tensor-subclasses.md."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import kiln_aotgrad
import torch
from kiln_aotgrad.subclasses import desugar_subclasses, has_subclasses

from .stats import counters
from .wrappers import needs_autograd, run_eagerly

__all__ = ["has_subclasses", "compile_subclass_graph"]


def compile_subclass_graph(gm: torch.fx.GraphModule, example_inputs: Sequence,
                           compile_plain: Callable[[torch.fx.GraphModule, list], Callable]
                           ) -> Callable:
    """Desugar ``gm`` to a graph of plain tensors, compile that with ``compile_plain`` and
    put the subclass boundary around it; eager (with the reason logged) where autograd
    through the plain graph would differ from eager's."""
    try:
        desugared = desugar_subclasses(gm, example_inputs)
    except (kiln_aotgrad.AliasedInputMutationError, kiln_aotgrad.MutatedGradInputError) as e:
        return run_eagerly(gm, str(e))
    plain = desugared.gm
    if needs_autograd(desugared.gm, desugared.example_inputs):
        mismatch = desugared.training_mismatch()
        if mismatch is not None:
            return run_eagerly(gm, mismatch)
        # differentiated at the subclass level (DTensor's backward rules), traced to ATen
        plain = desugared.training_gm()
    plain.meta.update({k: v for k, v in getattr(gm, "meta", {}).items()
                       if k.startswith("kiln_")})
    counters["subclass_graphs"] += 1
    return desugared.wrap(compile_plain(plain, desugared.example_inputs))
