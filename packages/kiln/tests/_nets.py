"""Small trainable nets several kiln tests compile, and a first training step on one (not a
test module; conftest.py puts this folder on sys.path)."""

from __future__ import annotations

import copy

import kiln
import torch
import torch.nn as nn
import torch.nn.functional as F


class NormMLP(nn.Module):
    """fc1 -> norm -> gelu -> fc2."""

    def __init__(self, d_in: int, hidden: int, d_out: int, norm=nn.LayerNorm):
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.norm = norm(hidden)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


class GeluMLP(nn.Module):
    """fc1 -> gelu -> fc2 -> tanh: a block to checkpoint."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x))).tanh()


class ConvNormFc(nn.Module):
    """A conv (its weight a channels-last constant on CPU; the eval BatchNorm after it folds
    into it: constants computed from weights) and a linear with ``fc_out`` outputs over the
    flattened [4, 6, 6] activation (64 outputs: its weight is packed for MKL's GEMM on CPU)."""

    def __init__(self, fc_out: int, mean_too: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 6 * 6, fc_out)
        self.mean_too = mean_too

    def forward(self, x):
        y = torch.relu(self.norm(self.conv(x)))
        return (self.fc(y.flatten(1)), y.mean()) if self.mean_too else self.fc(y.flatten(1))


def compile_and_step(model: nn.Module):
    """``model`` compiled by kiln and an eager copy, after one backward of each on the same
    x [6, 8]: (compiled, the copy, x)."""
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model)
    x = torch.randn(6, 8)
    compiled(x).sum().backward()
    ref(x).sum().backward()
    return compiled, ref, x
