"""Ops kiln does not lower but declares as aten calls (kiln_loopir/lowerings/fallbacks.py)
compile inside the graph: linear algebra, stable sort, embedding bags, triangle indices. Each graph must
compile with no "ran eagerly" warning and match eager; linalg's error check still raises on
a singular matrix, and training through inv/det/solve gets eager's gradients."""

from __future__ import annotations

import warnings

import kiln
import pytest
import torch
import torch.nn.functional as F
from kiln_frontend.logging_utils import KilnWarning

A = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
SPD = A @ A.T + 4 * torch.eye(4)
B = torch.randn(4, 2, generator=torch.Generator().manual_seed(1))

CASES = {
    "det_slogdet": lambda m: (torch.det(m), torch.slogdet(m)),
    "inv": lambda m: torch.linalg.inv(m) @ B,
    "eigh": lambda m: torch.linalg.eigh(m).eigenvalues,
    "solve": lambda m: torch.linalg.solve(m, B),
    "cholesky": lambda m: torch.linalg.cholesky(m) * 2,
    "eigvals": lambda m: torch.linalg.eigvals(m).abs().sort().values,
    "lstsq": lambda m: torch.linalg.lstsq(m, B).solution,
    "sort_stable": lambda m: torch.sort(m, dim=1, stable=True),
    "embedding_bag": lambda m: F.embedding_bag(torch.tensor([1, 2, 3, 0]), m, torch.tensor([0, 2])),
    "triangle_indices": lambda m: (m[tuple(torch.tril_indices(4, 4, -1))], torch.triu_indices(3, 5, 1)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_declared_fallback_compiles_in_the_graph(name, needs_cpp):
    fn = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", KilnWarning)
        got = kiln.compile(fn)(SPD)
    torch.testing.assert_close(got, fn(SPD), rtol=1e-4, atol=1e-5)


def test_linalg_errors_still_raise(needs_cpp):
    inv = kiln.compile(lambda m: torch.linalg.inv(m) * 2)
    inv(SPD)
    with pytest.raises(torch.linalg.LinAlgError):
        inv(torch.zeros(4, 4))


def test_linalg_errors_still_raise_in_training(needs_cpp):
    """The check that raises returns nothing: the partitioner keeps it in the forward."""
    inv = kiln.compile(lambda m: torch.linalg.inv(m).sum())
    inv(SPD.clone().requires_grad_()).backward()
    with pytest.raises(torch.linalg.LinAlgError):
        inv(torch.zeros(4, 4, requires_grad=True))


def test_training_through_linalg_matches_eager(needs_cpp):
    def loss(m):
        return torch.linalg.inv(m).sum() + torch.det(m) + torch.linalg.solve(m, B).sum()

    x, y = SPD.clone().requires_grad_(), SPD.clone().requires_grad_()
    loss(x).backward()
    kiln.compile(loss)(y).backward()
    torch.testing.assert_close(y.grad, x.grad, rtol=1e-4, atol=1e-4)
