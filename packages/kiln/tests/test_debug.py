"""KILN_COMPILE_DEBUG=1: a folder per compiled graph, its path printed once per process."""

from __future__ import annotations

import os
import subprocess
import sys

import kiln.debug
import pytest
import torch
import torch.fx
import torch.nn.functional as F
from kiln.backend import kiln_backend, loopir_interpret_backend
from kiln_loopir.lowerings.extern import DEVICE_LIBRARIES, packed_gemm


@pytest.fixture
def debug_env(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_COMPILE_DEBUG", "1")
    monkeypatch.setenv("KILN_DEBUG_DIR", str(tmp_path))
    monkeypatch.setattr(kiln.debug, "_run_dir", None)  # a fresh "process" for the print-once
    return tmp_path


#: what every compiled graph's debug folder holds, whichever backend lowered it
_LOWERING_DUMPS = {"fx_graph.txt", "aten_graph.txt", "ir_pre_fusion.txt", "ir_post_fusion.txt"}


def _graph_dirs(root):
    (run,) = [p for p in root.iterdir() if p.name.startswith("run_")]
    return run, sorted(p for p in run.iterdir() if p.name.startswith("graph_"))


def f(x, y):
    return F.softmax(x, -1) * torch.sigmoid(y)


def test_fallback_graph_still_dumps_the_fx_graph(debug_env, capsys):
    gm = torch.fx.symbolic_trace(f)
    kiln_backend(gm, [torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)])
    run, graphs = _graph_dirs(debug_env)
    assert len(graphs) == 1
    assert (graphs[0] / "fx_graph.txt").read_text().count("softmax") >= 1
    assert str(run) in capsys.readouterr().err


def test_debug_folder_loopir_interpret(debug_env, needs_interpreter):
    gm = torch.fx.symbolic_trace(f)
    loopir_interpret_backend(gm, [torch.randn(3, 4), torch.randn(3, 4)])
    _, (graph,) = _graph_dirs(debug_env)
    names = {p.name for p in graph.iterdir()}
    assert _LOWERING_DUMPS <= names
    assert "aten.amax" in (graph / "aten_graph.txt").read_text()


def test_debug_folder_kiln(debug_env, needs_cpp, capsys):
    gm = torch.fx.symbolic_trace(f)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    compiled = kiln_backend(gm, [x, y])
    torch.testing.assert_close(compiled(x, y), f(x, y))
    kiln_backend(torch.fx.symbolic_trace(lambda x: x.cos() + 1), [x])
    run, graphs = _graph_dirs(debug_env)
    assert len(graphs) == 2
    err = capsys.readouterr().err
    assert err.count(str(run)) == 1  # printed once per process
    for graph in graphs:
        names = {p.name for p in graph.iterdir()}
        assert _LOWERING_DUMPS | {"output_code.py"} <= names
        for name in names:
            assert (graph / name).stat().st_size > 0
    # output_code.py runs alone
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("KILN_COMPILE_DEBUG")
    result = subprocess.run(
        [sys.executable, str(graphs[0] / "output_code.py")],
        capture_output=True,
        text=True,
        env=env,
        cwd=graphs[0],
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(3, 4)" in result.stdout


@pytest.mark.skipif(packed_gemm(DEVICE_LIBRARIES["cpu"]) is None, reason="a packed weight needs oneDNN or MKL")
def test_output_code_derives_a_packed_weight_again(debug_env, needs_cpp):
    """A weight packed for the CPU's GEMM (oneDNN's or MKL's) is an opaque tensor:
    constants.pt holds the weight, and output_code.py packs it again (``derive``) before
    running."""
    lin = torch.nn.Linear(8, 64).eval()
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(lin, torch.nn.ReLU()))
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(kiln_backend(gm, [x])(x), torch.relu(lin(x)))
    _, (graph,) = _graph_dirs(debug_env)
    code = (graph / "output_code.py").read_text()
    assert f"derive('{packed_gemm(DEVICE_LIBRARIES['cpu'], (4, 8, 64)).derivation}'" in code, code
    saved = torch.load(graph / "constants.pt", weights_only=False)
    assert saved and all(t.layout == torch.strided for t in saved.values())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    env.pop("KILN_COMPILE_DEBUG")
    result = subprocess.run([sys.executable, str(graph / "output_code.py")], capture_output=True,
                            text=True, env=env, cwd=graph, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "(4, 64)" in result.stdout
