"""A long row over few outputs keeps one node walking it (scheduler step 2's last rule): the
amax of a whole tensor and the ``x * scale`` that reads it (dynamic float8 scaling) are two
groups, so a codegen can split the amax's row over programs; short rows still fuse."""

from __future__ import annotations

import kiln_loopir as K
import kiln_loopir.scheduler as S
import pytest
import torch
from helpers import aten_graph, check
from kiln_loopir.ir import FusedGroup


def scale_by_amax(x):
    return x * (448.0 / x.abs().amax())


def clone_then_amax(x):
    y = x.t().contiguous()
    return y, y.abs().amax()


def groups(fn, x):
    return [s for s in K.schedule(K.lower(aten_graph(fn, x))).steps if isinstance(s, FusedGroup)]


@pytest.mark.parametrize("fn", [scale_by_amax, clone_then_amax])
def test_a_long_row_over_one_output_is_walked_by_one_node(fn, monkeypatch):
    monkeypatch.setattr(S, "ROW_STARVED_MIN_ROW", 1024)
    x = torch.randn(64, 32)
    gs = groups(fn, x)
    assert len(gs) == 2, [str(g) for g in gs]
    for g in gs:
        assert sum(1 for n in g.nodes if n.inner) <= 1
    check(fn, x)


@pytest.mark.parametrize("fn", [scale_by_amax, clone_then_amax])
def test_a_short_row_still_fuses(fn):
    x = torch.randn(64, 32)  # 2048 points: below ROW_STARVED_MIN_ROW
    assert len(groups(fn, x)) == 1
    check(fn, x)


def test_many_outputs_still_fuse(monkeypatch):
    monkeypatch.setattr(S, "ROW_STARVED_MIN_ROW", 16)
    x = torch.randn(128, 32)  # softmax rows: 128 outputs, above ROW_STARVED_MAX_OUTPUTS
    assert len(groups(lambda x: torch.softmax(x, -1), x)) == 1
