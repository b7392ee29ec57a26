"""The C++ codegen against loopir's interpreter, graph by graph, on the tests-integration
models (issue 9: Llama's logits were wrong through the C++ path and right through the
interpreter; a test per model only sees the end result, this one names the graph).

A recording back half sits where the ``kiln`` backend hands each ATen graph to its back half
(after ``kiln.backend.compile_inference``'s batchnorm folding and aotgrad's inference trace)
and runs the steps of ``kiln.backend.compile_aten`` that make code (lower and schedule,
generate the wrapper and C++ kernels, load them), keeping the schedule, the loaded code and
the real inputs of the graph's first call. Each recorded schedule is then run by its
generated C++ and by ``kiln_loopir.interpret`` on the same inputs: every output must match
(``assert_close``, float32 defaults). The interpreter also checks that each extern's result
has the layout the IR declares, so a layout bug fails here even where values happen to agree.

The kernel cache is shared with test_kiln_models.py (the same graphs give the same kernels),
so the models' kernels are compiled once per session.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import kiln_frontend
import kiln_loopir
import kiln_runtime
import pytest
import torch
from kiln.backend import (
    codegen_for_device,
    compile_inference,
    lower_and_schedule,
    with_output_structure,
)
from kiln.options import Options
from test_kiln_models import MODELS, _model_and_inputs, shared_kernel_cache


def _fresh(inputs) -> list:
    """Copies: a graph may write its inputs back (input mutations)."""
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in inputs]


@dataclass
class RecordedGraph:
    schedule: object  # the loopir Schedule both sides run
    compiled: object  # its generated code, loaded: ``compiled(*inputs) -> flat outputs``
    inputs: list | None = None


@dataclass
class Recorder:
    """The ``kiln`` backend's front half, then its codegen steps on one schedule that is
    kept (lower and schedule, generate the wrapper and kernels, load), the graph's first
    inputs kept too."""

    graphs: list[RecordedGraph] = field(default_factory=list)

    def __call__(self, gm, example_inputs):
        return compile_inference(gm, example_inputs, Options.from_user(None), back_half=self.back_half)

    def back_half(self, aten_gm, config, *, trace):
        schedule = lower_and_schedule(aten_gm, trace)
        module = kiln_loopir.generate_wrapper(schedule, codegen_for_device(schedule.graph.device, config))
        compiled = kiln_runtime.load(module, config)  # a C++ compile error fails the test
        rec = RecordedGraph(schedule, compiled)
        self.graphs.append(rec)

        def run(*args):
            if rec.inputs is None:
                rec.inputs = _fresh(args)
            return compiled(*args)

        return with_output_structure(aten_gm, run)


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
    try:
        with torch.no_grad():
            kiln_frontend.optimize(recorder)(model)(*inputs)
    finally:
        kiln_frontend.reset()
    graphs = [g for g in recorder.graphs if g.inputs is not None]
    assert graphs, f"no graph of {name} reached the backend"
    for k, rec in enumerate(graphs):
        with torch.no_grad():
            got = list(rec.compiled(*_fresh(rec.inputs)))
            expected = kiln_loopir.interpret(rec.schedule)(*_fresh(rec.inputs))
        assert len(got) == len(expected)
        for j, (g, e) in enumerate(zip(got, expected, strict=True)):
            torch.testing.assert_close(g, e, msg=lambda m, k=k, j=j: f"{name} graph {k} output {j}: {m}")
