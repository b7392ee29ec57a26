"""The C++ codegen against loopir's interpreter, graph by graph, on the tests-integration
models (issue 9: Llama's logits were wrong through the C++ path and right through the
interpreter; a test per model only sees the end result, this one names the graph).

A recording back half sits where the ``kiln`` backend hands each ATen graph to codegen
(``kiln.backend.compile_inference``: batchnorm folding, aotgrad's inference trace, then
``compile_aten``: loopir, C++ kernels, runtime). It keeps each ATen graph, its compiled
callable and the real inputs of its first call. Each recorded graph is then run again by its
generated C++ and by ``kiln_loopir.interpret`` on the same inputs: every output must match
(``assert_close``, float32 defaults). The interpreter also checks that each extern's result
has the layout the IR declares, so a layout bug fails here even where values happen to agree.

The kernel cache is shared with test_kiln_models.py (the same graphs give the same kernels),
so the models' kernels are compiled once per session.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import kiln
import kiln_frontend
import kiln_loopir
import pytest
import torch
from kiln.backend import compile_aten, compile_inference
from kiln.options import Options
from test_kiln_models import MODELS, _model_and_inputs, shared_kernel_cache


def _fresh(inputs) -> list:
    """Copies: a graph may write its inputs back (input mutations)."""
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in inputs]


@dataclass
class RecordedGraph:
    aten_gm: torch.fx.GraphModule
    compiled: object  # kiln's compiled graph (``.flat``: the flat outputs)
    inputs: list | None = None


@dataclass
class Recorder:
    """The ``kiln`` backend, keeping what its back half compiled."""

    graphs: list[RecordedGraph] = field(default_factory=list)

    def __call__(self, gm, example_inputs):
        return compile_inference(gm, example_inputs, Options.from_user(None), back_half=self.back_half)

    def back_half(self, aten_gm, config, *, trace):
        compiled = compile_aten(aten_gm, config, trace=trace)
        rec = RecordedGraph(aten_gm, compiled)
        self.graphs.append(rec)

        def run(*args):
            if rec.inputs is None:
                rec.inputs = _fresh(args)
            return compiled(*args)

        return run


@pytest.fixture(scope="module", autouse=True)
def kiln_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KILN_CACHE_DIR", shared_kernel_cache(tmp_path_factory))
        yield


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cpp_codegen_matches_interpreter(name):
    model, inputs = _model_and_inputs(name)
    recorder = Recorder()
    kiln_frontend.reset()
    kiln.reset_stats()
    try:
        with torch.no_grad():
            kiln_frontend.optimize(recorder)(model)(*inputs)
    finally:
        kiln_frontend.reset()
    assert kiln.stats().interpreter_fallbacks == 0, "a kernel did not compile: nothing to compare"
    graphs = [g for g in recorder.graphs if g.inputs is not None]
    assert graphs, f"no graph of {name} reached the backend"
    for k, rec in enumerate(graphs):
        flat = getattr(rec.compiled, "flat", rec.compiled)
        with torch.no_grad():
            got = list(flat(*_fresh(rec.inputs)))
            expected = kiln_loopir.interpret(kiln_loopir.schedule(kiln_loopir.lower(rec.aten_gm)))(
                *_fresh(rec.inputs))
        assert len(got) == len(expected)
        for j, (g, e) in enumerate(zip(got, expected, strict=True)):
            torch.testing.assert_close(g, e, msg=lambda m, k=k, j=j: f"{name} graph {k} output {j}: {m}")
