"""Training through ``torch.utils.checkpoint`` and saved-tensor hooks, compared with eager.

Non-reentrant checkpoint counts the tensors its region saves in the forward and again when
the backward recomputes it, and refuses a mismatch: kiln leaves the region to Python (as
torch tells TorchDynamo to: ``torch._disable_dynamo``), since the recomputation runs outside
the compiled call. The user's saved-tensor hooks see what the program saves, never the fake
tensors kiln's capture and trace make."""

from __future__ import annotations

import copy

import kiln
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 8)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class Checkpointed(nn.Module):
    """Two blocks, the first under checkpoint (``use_reentrant`` as given), then plain code."""

    def __init__(self, use_reentrant: bool):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 3)
        self.use_reentrant = use_reentrant

    def forward(self, x):
        x = checkpoint(self.blocks[0], x, use_reentrant=self.use_reentrant)
        x = checkpoint(lambda y: torch.tanh(self.blocks[1](y)), x, use_reentrant=self.use_reentrant)
        return self.head(x).relu()


def _train_both(model, steps=2, hooks=None):
    """Gradients of model and of kiln.compile(copy) after each step, compared."""
    ref = copy.deepcopy(model)
    compiled = kiln.compile(model)
    for step in range(steps):
        x = torch.randn(5, 8, generator=torch.Generator().manual_seed(step), requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        for m, inp in ((ref, x), (compiled, x2)):
            m.zero_grad()
            if hooks is None:
                loss = m(inp).square().mean()
            else:
                with hooks():
                    loss = m(inp).square().mean()
            loss.backward()
        torch.testing.assert_close(x2.grad, x.grad)
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, msg=name)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_checkpointed_regions_train_as_eager(use_reentrant):
    torch.manual_seed(0)
    _train_both(Checkpointed(use_reentrant))


def test_saved_tensors_hooks_see_only_real_tensors():
    """A counting pack hook around the compiled call: everything it is handed is a real
    tensor (kiln's compiled forward saves what its backward needs), and the grads are
    eager's; ``save_on_cpu`` likewise."""
    torch.manual_seed(0)
    packed = []

    def pack(t):
        packed.append(type(t))
        return t

    model = nn.Sequential(Block(), nn.Tanh(), nn.Linear(8, 3))
    _train_both(model, hooks=lambda: torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t))
    assert packed, "the pack hook never ran"
    assert all(cls in (torch.Tensor, nn.Parameter) for cls in packed), set(packed)
    _train_both(nn.Sequential(Block(), nn.Linear(8, 3)), hooks=torch.autograd.graph.save_on_cpu)
