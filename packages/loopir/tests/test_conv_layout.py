"""The one layout choice for convolutions (``conv_prefers_channels_last``): CPU float32 and
CUDA float32/fp16/bf16 2-d convolutions run channels-last; everything else keeps eager's
layout. CUDA is asked directly (no GPU here: the choice is a function of device type and
dtype). On CUDA the bias is added in the consumer's kernel (aten's cuDNN path adds it in a
kernel of its own); checked on the lowered IR of a CPU graph with the device policy swapped."""

from __future__ import annotations

import pytest
import torch
from kiln_loopir.lowerings.extern import (
    DEVICE_LIBRARIES,
    conv_prefers_channels_last,
    runs_channels_last,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cuda_convolutions_run_channels_last(dtype, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "enabled", True)
    assert conv_prefers_channels_last("cuda", dtype, 4, False)
    assert not conv_prefers_channels_last("cuda", dtype, 4, True)  # transposed
    assert not conv_prefers_channels_last("cuda", dtype, 5, False)  # 3-d
    assert not conv_prefers_channels_last("cuda", dtype, 3, False)  # 1-d
    monkeypatch.setattr(torch.backends.cudnn, "enabled", False)
    assert not conv_prefers_channels_last("cuda", dtype, 4, False)


def test_other_devices_keep_eager_layout():
    assert not conv_prefers_channels_last("cuda", torch.float64, 4, False)
    assert not conv_prefers_channels_last("mps", torch.float16, 4, False)
    assert "mps" not in DEVICE_LIBRARIES


def _lower_with_cpu_library(monkeypatch, fn, x, tol=None, **policy):
    """``fn`` traced and lowered with the CPU entry of ``DEVICE_LIBRARIES`` changed by
    ``policy`` (how another device's policy is tried here), checked against eager through
    loopir's interpreter; returns the lowered graph's extern kernels."""
    import dataclasses

    import kiln_loopir

    policy.setdefault("packed_gemms", ())  # mm/addmm here (packed: test_packed_linear.py)
    monkeypatch.setitem(DEVICE_LIBRARIES, "cpu", dataclasses.replace(DEVICE_LIBRARIES["cpu"], **policy))
    graph = kiln_loopir.lower(torch.fx.experimental.proxy_tensor.make_fx(fn)(x), [x])
    (got,) = kiln_loopir.interpret(kiln_loopir.schedule(graph))(x)
    torch.testing.assert_close(got, fn(x), **(tol or {}))
    return [b for b in graph.buffers if hasattr(b, "op")]


def _matmul_ops(externs) -> tuple[bool, bool]:
    ops = {b.op for b in externs}
    return torch.ops.aten.mm.default in ops, torch.ops.aten.addmm.default in ops


@pytest.mark.parametrize("fused_bias", [True, False])
def test_bias_goes_to_the_consumer_where_the_library_adds_it_apart(fused_bias, monkeypatch):
    conv = torch.nn.Conv2d(3, 4, 3)
    externs = _lower_with_cpu_library(monkeypatch, lambda x: torch.relu(conv(x)), torch.randn(2, 3, 8, 8),
                                      conv_fused_bias=fused_bias)
    (conv_call,) = [b for b in externs if b.op is torch.ops.aten.convolution.default]
    assert (conv_call.inputs[2] is None) == (not fused_bias)


def test_cpu_choice_is_unchanged():
    mkldnn = torch.backends.mkldnn.is_available()
    assert conv_prefers_channels_last("cpu", torch.float32, 4, False) == mkldnn
    assert not conv_prefers_channels_last("cpu", torch.float16, 4, False)
    assert not conv_prefers_channels_last("cpu", torch.bfloat16, 4, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fx_conv_node_asks_the_choice_with_its_result(dtype):
    conv = torch.nn.Conv2d(3, 4, 3).to(dtype)
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda x: conv(x))(torch.randn(1, 3, 8, 8, dtype=dtype))
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default]
    assert runs_channels_last(node) == conv_prefers_channels_last("cpu", dtype, 4, False)
    assert runs_channels_last(node) == (dtype == torch.float32 and torch.backends.mkldnn.is_available())
    assert not runs_channels_last(next(iter(gm.graph.nodes)))  # a placeholder


@pytest.mark.parametrize("in_consumer", [True, False])
def test_addmm_bias_goes_to_the_consumer_only_where_the_library_asks(in_consumer, monkeypatch):
    """CPU and CUDA: the bias of an addmm read by elementwise ops moves to their kernel (mm
    alone); a device whose library should keep it (``addmm_bias_in_consumer=False``) keeps
    addmm."""
    lin = torch.nn.Linear(8, 6)
    externs = _lower_with_cpu_library(monkeypatch, lambda x: torch.relu(lin(x)), torch.randn(4, 8),
                                      addmm_bias_in_consumer=in_consumer)
    assert _matmul_ops(externs) == (in_consumer, not in_consumer)


@pytest.mark.parametrize("always_apart", [True, False])
def test_addmm_bias_apart_before_attention_where_the_library_asks(always_apart, monkeypatch):
    """CUDA: the bias is added apart even when the product feeds a view into SDPA (cuBLASLt's
    bias epilogue picks slower GEMMs); CPU: addmm then."""
    lin = torch.nn.Linear(16, 16)

    def f(x):
        q = lin(x).view(1, 8, 2, 8).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    externs = _lower_with_cpu_library(monkeypatch, f, torch.randn(1, 8, 16), tol={"atol": 1e-5, "rtol": 1e-5},
                                      addmm_bias_always_apart=always_apart)
    assert _matmul_ops(externs) == (always_apart, not always_apart)
