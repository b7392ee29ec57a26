"""A graph on one device that computes some values on another (a CUDA model's
``torch.arange(n)`` made on the CPU, position buckets computed from it, a CPU scalar tensor
multiplied into a CUDA tensor): those ops stay aten calls, which run where their tensors are;
only ops on the graph's device become kernels (a Triton kernel cannot read CPU memory:
transformers MPNet, DeBERTa-v2 and timm EdgeNeXt failed so on an H200). Traced with fake
CUDA tensors, so it runs on a machine without a GPU."""

from __future__ import annotations

import re

import kiln_loopir
import torch
from kiln_loopir.ir import ComputedBuffer, ExternKernel
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx


def _relative_positions(x):
    pos = torch.arange(x.shape[1])  # on the CPU
    rel = (pos[:, None] - pos[None, :]).abs()
    scale = torch.tensor(2.0)  # a CPU scalar tensor
    return x * rel.to(x.device) * scale + x.sin()


def test_ops_on_another_device_stay_aten_calls_and_kernels_read_only_the_graphs_device():
    with FakeTensorMode():
        x = torch.empty(4, 4, device="cuda")
    graph = kiln_loopir.lower(make_fx(_relative_positions, tracing_mode="fake")(x), [x])
    assert graph.device.type == "cuda"
    devices = {b.name: b.get_device() for b in graph.buffers if b.layout is not None}
    devices.update({b.name: b.get_device() for b in graph.inputs})
    devices.update({b.name: b.layout.device for b in graph.constant_buffers})
    on_cpu = [b for b in graph.buffers if isinstance(b, ExternKernel) and devices[b.name].type == "cpu"]
    assert {str(b.op) for b in on_cpu} >= {"aten.arange.default", "aten.sub.Tensor", "aten.abs.default"}
    kernels = [b for b in graph.buffers if isinstance(b, ComputedBuffer)]
    assert kernels and all(devices[b.name].type == "cuda" for b in kernels)
    loaded = set(re.findall(r"ops\.load\((\w+),", str(graph)))  # what the kernels read
    assert loaded and all(devices[name].type == "cuda" for name in loaded), loaded
