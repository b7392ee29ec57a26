"""Products with a constant float32 weight on CPU run on the weight packed once for the CPU
library's GEMM (loopir's ``packed_linear``, ``DeviceLibrary.packed_gemms``): oneDNN's packed
linear where the product is large enough for it, else MKL's packed sgemm, else ``mm``;
linear layers and 1x1 convolutions. The packed weight is a derived constant: guarded (an
in-place write to the weight compiles again) and made again from the live weight on a
graph-cache hit."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.nn as nn
from kiln_loopir.lowerings import extern
from test_pipeline import run

ONEDNN, MKL = extern.PACKED_GEMMS["onednn"], extern.PACKED_GEMMS["mkl"]
pytestmark = pytest.mark.skipif(extern.packed_gemm(extern.DEVICE_LIBRARIES["cpu"]) is None,
                                reason="no packed GEMM (oneDNN or MKL) in this torch")
needs_onednn = pytest.mark.skipif(not ONEDNN.available(), reason="no oneDNN linear in this torch")
needs_mkl = pytest.mark.skipif(not MKL.available(), reason="no MKL packed GEMM in this torch")

ONEDNN_LINEAR = "mkldnn._linear_pointwise.default"
MKL_LINEAR = "mkl._mkl_linear.default"
OP = {"onednn": ONEDNN_LINEAR, "mkl": MKL_LINEAR}


def _extern_ops(compiled) -> list[str]:
    return [str(s.kernel.op) for s in compiled.module.meta["schedule"].externs]


class _Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 96)
        self.down = nn.Linear(96, 64, bias=False)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x))), self.up(x).sum(-1)


@pytest.fixture(params=["onednn", "mkl"])
def gemm(request, monkeypatch):
    """Each packed GEMM as the CPU's only one, taking every product (``worth`` always)."""
    chosen = extern.PACKED_GEMMS[request.param]
    if not chosen.available():
        pytest.skip(f"no {request.param} packed GEMM in this torch")
    monkeypatch.setitem(extern.PACKED_GEMMS, request.param, dataclasses.replace(chosen, worth=lambda *s: True))
    monkeypatch.setitem(extern.DEVICE_LIBRARIES, "cpu", dataclasses.replace(
        extern.DEVICE_LIBRARIES["cpu"], packed_gemms=(request.param,)))
    return request.param


def test_linear_layers_run_on_packed_weights_and_match_eager(gemm):
    torch.manual_seed(0)
    model = _Mlp().eval()
    with torch.no_grad():
        compiled = run(model, torch.randn(2, 5, 16), rtol=1e-5, atol=1e-5)
    ops = _extern_ops(compiled)
    assert ops.count(OP[gemm]) == 3 and "aten.mm.default" not in ops, ops
    text = str(compiled.module.meta["schedule"])
    assert f"{gemm}_packed_linear(" in text, text  # the derived constant prints its recipe


def test_a_weight_written_in_place_compiles_again(gemm):
    torch.manual_seed(0)
    model = _Mlp().eval()
    x = torch.randn(3, 16)
    with torch.no_grad():
        compiled = run(model, x, rtol=1e-5, atol=1e-5)
        model.up.weight.mul_(-1.0)  # the packed copy is stale now
        model.down.weight.add_(0.25)
        for got, want in zip(compiled(x), model(x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_pointwise_convolution_runs_on_a_packed_weight(gemm):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 64, 1)).eval()
    with torch.no_grad():
        compiled = run(model, torch.randn(2, 3, 8, 8), rtol=1e-5, atol=1e-5)
    assert OP[gemm] in _extern_ops(compiled)


class _Conv1D(nn.Module):
    """GPT-2's ``Conv1D``: ``addmm(bias, x, W)`` with ``W[in, out]`` (not transposed)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(16, 72))
        self.bias = nn.Parameter(torch.randn(72))

    def forward(self, x):
        y = torch.addmm(self.bias, x.view(-1, 16), self.weight)
        return y.view(x.shape[0], x.shape[1], 72).transpose(1, 2)  # not elementwise: addmm's bias


def test_an_in_out_weight_is_packed_transposed(gemm):
    torch.manual_seed(0)
    with torch.no_grad():
        compiled = run(_Conv1D().eval(), torch.randn(2, 5, 16), rtol=1e-5, atol=1e-5)
    assert _extern_ops(compiled) == [OP[gemm]]
    text = str(compiled.module.meta["schedule"])
    assert re.search(gemm + r"_packed_linear\(const\d+, 10, True\)", text), text


def _ops_of_linear(k: int, n: int, rows: int) -> list[str]:
    torch.manual_seed(0)
    with torch.no_grad():
        return _extern_ops(run(nn.Linear(k, n, bias=False).eval(), torch.randn(rows, k), rtol=1e-4, atol=1e-4))


@needs_onednn
def test_the_cpu_runs_large_products_on_onednn():
    """oneDNN's packed linear first (0.75-0.95 of MKL's packed sgemm's time on the benchmark
    models' shapes: experiments/cpu-linear): a product of 16 Mflop and up, or one whose
    weight is 1 MiB and up (a two-row classifier head)."""
    assert extern.DEVICE_LIBRARIES["cpu"].packed_gemms[0] == "onednn"
    assert _ops_of_linear(256, 512, 64) == [ONEDNN_LINEAR]  # 16.8 Mflop
    assert _ops_of_linear(1024, 512, 2) == [ONEDNN_LINEAR]  # 2 rows, a 2 MiB weight


@needs_onednn
@needs_mkl
def test_the_cpu_runs_small_products_on_mkl_and_narrow_ones_on_mm():
    """oneDNN's call costs ~12 us more: below its threshold MKL's packed sgemm runs, which
    lost below 64 output features (``mm`` there)."""
    assert _ops_of_linear(16, 96, 10) == [MKL_LINEAR]
    assert _ops_of_linear(16, 24, 4) == ["aten.mm.default"]


def test_onednns_threshold():
    assert ONEDNN.worth(256, 256, 256) and ONEDNN.worth(394, 384, 1152)  # BERT, ViT-small
    assert ONEDNN.worth(2, 960, 1280)  # MobileNetV3's head: the weight
    assert not ONEDNN.worth(392, 40, 120) and not ONEDNN.worth(2, 576, 144)  # MobileNet 1x1 / SE
    assert MKL.worth(10, 16, 64) and not MKL.worth(10, 16, 63)


def test_an_unavailable_gemm_gives_way_to_the_next_and_none_to_mm(monkeypatch):
    monkeypatch.setitem(extern.PACKED_GEMMS, "never", dataclasses.replace(ONEDNN, available=lambda: False))
    monkeypatch.setitem(extern.PACKED_GEMMS, "always", dataclasses.replace(ONEDNN, worth=lambda *s: True))
    lib = dataclasses.replace(extern.DEVICE_LIBRARIES["cpu"], packed_gemms=("never", "always"))
    assert extern.packed_gemm(lib, (2, 2, 2)) is extern.PACKED_GEMMS["always"]
    monkeypatch.setitem(extern.DEVICE_LIBRARIES, "cpu", dataclasses.replace(lib, packed_gemms=("never",)))
    torch.manual_seed(0)
    with torch.no_grad():
        compiled = run(_Mlp().eval(), torch.randn(2, 5, 16), rtol=1e-5, atol=1e-5)
    assert set(_extern_ops(compiled)) <= {"aten.mm.default", "aten.addmm.default"}


def test_packed_gemms_registry_refuses_a_duplicate_and_names_the_known_on_a_miss():
    with pytest.raises(ValueError, match="already registered"):
        extern.register_packed_gemm("onednn", ONEDNN)
    lib = dataclasses.replace(extern.DEVICE_LIBRARIES["cpu"], packed_gemms=("no_such_gemm",))
    with pytest.raises(KeyError, match="mkl.*onednn"):
        extern.packed_gemm(lib)


def test_a_traced_weight_stays_on_mm():
    """A product whose weight is not a constant (an input) is ``mm``."""

    def f(x, w):
        return x @ w.t()

    compiled = run(f, torch.randn(4, 8), torch.randn(96, 8))
    assert _extern_ops(compiled) == ["aten.mm.default"]
