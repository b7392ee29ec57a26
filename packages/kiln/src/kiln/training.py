"""The training path of kiln's backends: graphs whose inputs or parameters require grad.

``compile_training(gm, example_inputs, config, back_half=compile_aten, compile_piece=...)``
hands the graph to
``kiln_aotgrad.compile_joint``: one joint forward+backward trace, a partition (``min_cut`` or
``save_all``, ``activation_memory_budget``), then the forward and the backward graphs each go
through ``back_half`` (loopir + the device's codegen for the ``kiln`` backend). The debug
folder gets ``joint_graph.txt``, ``forward_graph.txt``, ``backward_graph.txt``,
``partition.txt`` and one subfolder per compiled graph (``forward/``, ``backward/``).

``kiln.backend.aot_eager_backend`` runs this path with both graphs on torch ops.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import kiln_aotgrad
import torch

from .ddp import active_ddp_bucket_bytes, split_at_ddp_buckets
from .debug import NO_TRACE, DebugTrace
from .options import Options, body_options
from .stats import counters

__all__ = ["compile_training"]


def compile_training(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence,
    config: Options,
    *,
    back_half: Callable,
    compile_piece: Callable[[torch.fx.GraphModule, list], Callable],
    trace: DebugTrace = NO_TRACE,
) -> Callable:
    """A callable with ``gm``'s signature running compiled forward and backward graphs.
    Under DDP, the graph is first split at bucket boundaries (``kiln.ddp``), each piece
    compiled with ``compile_piece(piece, example_inputs)`` at its first call (the caller's
    front half: ``kiln.backend.compile_inference``)."""
    bucket_bytes = active_ddp_bucket_bytes()
    if bucket_bytes is not None:
        split = split_at_ddp_buckets(gm, bucket_bytes, compile_piece)
        if split is not None:
            counters["ddp_split_graphs"] += 1
            trace.write("ddp_split_graph.txt", split)
            return split

    def compiler(kind: str, graph: torch.fx.GraphModule) -> Callable:
        sub = _subtrace(trace, kind)
        compiled = back_half(graph, config, trace=sub)
        counters[f"{kind}_graphs_compiled"] += 1
        return compiled

    def on_compiled(compiled: kiln_aotgrad.CompiledJoint) -> None:
        part = compiled.partition
        counters["saved_bytes"] += part.saved_bytes
        counters["training_graphs"] += 1
        if trace:
            trace.write("joint_graph.txt", compiled.joint.gm)
            trace.write("forward_graph.txt", part.fw_gm)
            trace.write("backward_graph.txt", part.bw_gm)
            save_all = kiln_aotgrad.partition(compiled.joint, "save_all")
            trace.write(
                "partition.txt",
                f"{compiled.joint}\nsave_all would save {save_all.saved_bytes} bytes\n"
                + part.report(),
            )

    # (the joint trace's rules that depend on the codegen, a fused FlexAttention, read the
    # compile's Options: kiln.higher_order)
    with body_options(config):
        return kiln_aotgrad.compile_joint(
            gm,
            example_inputs,
            fw_compiler=functools.partial(compiler, "forward"),
            bw_compiler=functools.partial(compiler, "backward"),
            partitioner=config.partitioner,
            activation_memory_budget=config.activation_memory_budget,
            on_compiled=on_compiled,
        )


def _subtrace(trace: DebugTrace, name: str) -> DebugTrace:
    if not trace:
        return NO_TRACE
    folder = trace.folder / name
    folder.mkdir(parents=True, exist_ok=True)
    return DebugTrace(folder)
