"""torch.utils.checkpoint captured as a tagged region of the frame's graph (registry entry
``torch.utils.checkpoint``): the body inlined under fullgraph=True, its nodes tagged with
``recompute`` and a region id per call, a selective policy carried as the tag, and the
reentrant form with no argument requiring grad detached as eager's is."""

from __future__ import annotations

import functools

import kiln_frontend
import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)


def _capture(fn, *args):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    kiln_frontend.reset()
    out = kiln_frontend.compile(fn, backend=backend, fullgraph=True)(*args)
    assert len(graphs) == 1
    return graphs[0], out


def _tags(gm):
    return [(n.target, n.meta.get("recompute"), n.meta.get("ac_graph_id"))
            for n in gm.graph.nodes if n.op == "call_function"]


def test_regions_are_tagged_with_one_id_each():
    w = torch.randn(4, 4)

    def f(x):
        y = checkpoint(lambda a: (a @ w).sin(), x, use_reentrant=False)
        z = checkpoint(lambda a: a.cos() * 2, y, use_reentrant=False)
        return z + 1

    x = torch.randn(3, 4, requires_grad=True)
    gm, out = _capture(f, x)
    torch.testing.assert_close(out, f(x))
    tags = _tags(gm)
    region = [t for t in tags if t[1] is not None]
    assert {t[1] for t in region} == {CheckpointPolicy.PREFER_RECOMPUTE}
    assert len({t[2] for t in region}) == 2
    assert len(region) == len(tags) - 1  # only the final add is outside
    assert tags[-1][1] is None


def _save_mm(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.mm.default \
        else CheckpointPolicy.PREFER_RECOMPUTE


def test_selective_policy_is_the_tag():
    def f(x):
        ctx = functools.partial(create_selective_checkpoint_contexts, _save_mm)
        return checkpoint(lambda a: (a @ a.T).relu(), x, use_reentrant=False, context_fn=ctx)

    gm, _ = _capture(f, torch.randn(3, 4, requires_grad=True))
    assert {t[1] for t in _tags(gm)} == {_save_mm}

    def g(x):  # a list of operators to save
        ctx = functools.partial(create_selective_checkpoint_contexts,
                                [torch.ops.aten.mm.default])
        return checkpoint(lambda a: (a @ a.T).relu(), x, use_reentrant=False, context_fn=ctx)

    gm, _ = _capture(g, torch.randn(3, 4, requires_grad=True))
    assert all(callable(t[1]) for t in _tags(gm))


def test_reentrant_without_grad_inputs_gives_no_grad():
    w = torch.randn(4, requires_grad=True)

    def f(x):
        return checkpoint(lambda a: a * w, x, use_reentrant=True)

    x = torch.randn(4)
    gm, out = _capture(f, x)
    assert not out.requires_grad and not f(x).requires_grad
    _, out = _capture(f, x.requires_grad_())
    assert out.requires_grad
