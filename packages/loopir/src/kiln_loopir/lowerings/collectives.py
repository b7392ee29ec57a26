"""Functional collectives (``torch.ops._c10d_functional``: what DTensor's redistribute, FSDP2
and ``torch.distributed._functional_collectives`` trace to) as extern calls of their kernels.

A collective returns a new tensor while the communication may still be in flight;
``wait_tensor`` of it returns that tensor once it has arrived. Both are ``ExternKernel``s
(``fallback=False``: by design, as matmuls are), which the scheduler keeps in graph order
relative to each other (collectives must be issued in the same order on every rank), and
every reader of a ``wait_tensor`` is a consumer of that extern's buffer, so it runs after the
wait. docs/tensor-subclasses.md."""

from __future__ import annotations

import torch

from ..lowering import lowering, make_extern, meta_val

#: the out-of-place functional collectives (in-place and ``_out`` variants never reach a
#: functionalized graph)
COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast", "wait_tensor",
)


def _ops() -> list:
    ns = torch.ops._c10d_functional
    out = []
    for name in COLLECTIVES:
        try:
            out.append(getattr(ns, name).default)
        except (AttributeError, RuntimeError):  # a torch built without distributed
            continue
    return out


def _make(op):
    def lower_fn(*args, **kwargs):
        return make_extern(op, args, kwargs, meta_val(), fallback=False)

    return lower_fn


for _op in _ops():
    lowering(_op)(_make(_op))
