"""Test helpers: trace functions to ATen graphs (make_fx + torch's core decompositions), lower,
schedule and interpret them. ``via="aotgrad"`` (kiln_aotgrad.trace_inference) is for the loopir
tests in tests-integration: loopir does not depend on aotgrad, so its own tests never ask for it."""

from __future__ import annotations

import kiln_loopir as K
import torch
import torch.utils._pytree
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx


def aten_graph(fn, *args, mode="real"):
    """A functional ATen graph of ``fn`` (torch's core decompositions)."""
    fn = torch.func.functionalize(fn, remove="mutations_and_views")
    return make_fx(fn, decomposition_table=core_aten_decompositions(), tracing_mode=mode)(*args)


def compile_loopir(fn, *args, mode="real", via="make_fx"):
    if via == "aotgrad":
        import kiln_aotgrad

        gm = kiln_aotgrad.trace_inference(fn if isinstance(fn, torch.nn.Module) else _Wrap(fn), list(args))
    else:
        gm = aten_graph(fn, *args, mode=mode)
    graph = K.lower(gm, list(args))
    sched = K.schedule(graph)
    return K.interpret(sched), sched, graph


class _Wrap(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _codegen_runner(sched):
    """KILN_LOOPIR_TEST_CODEGEN=cpp runs these tests through kiln_codegen_cpp instead of the
    interpreter (a cross-check of the codegen against the same expectations)."""
    import os

    which = os.environ.get("KILN_LOOPIR_TEST_CODEGEN")
    if not which:
        return None
    if which == "cpp":
        import warnings

        from kiln_codegen_cpp.pipeline import KilnFallbackWarning, compile_schedule

        with warnings.catch_warnings():
            warnings.simplefilter("error", KilnFallbackWarning)
            return compile_schedule(sched)
    raise ValueError(f"unknown KILN_LOOPIR_TEST_CODEGEN={which}")


def check(fn, *args, mode="real", via="make_fx", atol=None, rtol=None, equal_nan=True):
    run, sched, graph = compile_loopir(fn, *args, mode=mode, via=via)
    compiled = _codegen_runner(sched)
    if compiled is not None:
        run = compiled
    out = run(*args)
    ref = fn(*args)
    ref = torch.utils._pytree.tree_leaves(ref)
    assert len(out) == len(ref)
    for a, b in zip(out, ref, strict=False):
        kw = {}
        if atol is not None:
            kw = dict(atol=atol, rtol=rtol if rtol is not None else atol)
        torch.testing.assert_close(a, b, equal_nan=equal_nan, **kw)
    return sched, graph
