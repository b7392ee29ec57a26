"""Corpus: inlining user functions, closures, methods, super(), partial, argument binding."""

from __future__ import annotations

import torch
from _harness import check_case


def _helper(x, y):
    return x * 2 + y


def inline_simple(x, y):
    return _helper(x, y).sin()


def test_inline_simple():
    check_case(inline_simple, (torch.randn(4), torch.randn(4)), 1, fullgraph=True)
