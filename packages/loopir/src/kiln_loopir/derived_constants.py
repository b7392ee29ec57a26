"""Constants a graph computes at compile time from one of its constants: a weight stored
channels-last, a weight packed for the CPU's GEMM library, a weight padded to the GPU GEMM's
alignment.

Each is made by a named *derivation* from a source constant, and the ``ConstantBuffer``
keeps the recipe (``recipe``: derivation name, source buffer name, arguments). So whoever
keeps a compiled graph can make the constant again from the live weight instead of storing
its value (kiln's graph cache: a packed weight is an opaque tensor that cannot be saved), and
knows which weight to guard (``derived_from``: an in-place write to it is not seen by the
copy; kiln recompiles).

Derivations live in one registry; a duplicate name is refused, and an unknown one fails
with the known names.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .ir.values import ConstantBuffer, Layout

__all__ = ["DERIVATIONS", "THREAD_TUNED", "constant_reads", "derivation", "derive",
           "derived_constant", "derived_sources"]

#: name -> fn(source tensor, *args) -> tensor
DERIVATIONS: dict[str, Callable[..., torch.Tensor]] = {}
#: derivations whose result is tuned to the intra-op thread count they run under (MKL packs
#: a GEMM weight for the threads that will use it): whoever runs them again must run them
#: with the graph's own thread count, never narrowed
THREAD_TUNED: set[str] = set()


def derivation(name: str, *, thread_tuned: bool = False):
    """Register ``fn(source, *args)`` as the derivation ``name``."""

    def register(fn):
        if name in DERIVATIONS:
            raise ValueError(f"derivation {name!r} is already registered")
        DERIVATIONS[name] = fn
        if thread_tuned:
            THREAD_TUNED.add(name)
        return fn

    return register


def derive(name: str, source: torch.Tensor, *args) -> torch.Tensor:
    """Run the derivation ``name`` on ``source`` (the same code at compile time and when a
    cached graph is loaded again)."""
    fn = DERIVATIONS.get(name)
    if fn is None:
        raise KeyError(f"no derivation {name!r}; known: {', '.join(sorted(DERIVATIONS))}")
    with torch.no_grad():
        return fn(source.detach(), *args)


@derivation("channels_last")
def channels_last(w: torch.Tensor) -> torch.Tensor:
    """An NCHW-sized weight stored NHWC (what oneDNN and cuDNN convolutions run fastest)."""
    return w.contiguous(memory_format=torch.channels_last)


@derivation("mkl_packed_linear", thread_tuned=True)
def mkl_packed_linear(w: torch.Tensor, rows: int, in_out: bool = False) -> torch.Tensor:
    """``w`` packed by MKL for ``torch.ops.mkl._mkl_linear``: an opaque tensor, about the
    weight's size. ``w`` is ``[out, in]`` row-major in its storage (a linear weight, a 1x1
    conv weight stored channels-last), or with ``in_out`` ``[in, out]`` (GPT-2's ``Conv1D``,
    ``addmm(b, x, W)``). ``rows``: the product's row count at compile time (MKL's hint)."""
    lead = w.shape[0]
    flat = torch.as_strided(w, (lead, w.numel() // lead), (w.numel() // lead, 1))
    if in_out:
        flat = flat.t().contiguous()
    return torch.ops.mkl._mkl_reorder_linear_weight(flat, rows)


@derivation("onednn_packed_linear")
def onednn_packed_linear(w: torch.Tensor, rows: int, in_out: bool = False) -> torch.Tensor:
    """``w`` reordered by oneDNN into its blocked GEMM layout for
    ``torch.ops.mkldnn._linear_pointwise``: an opaque MKLDNN tensor of ``[out, in]``'s size
    (no storage: it cannot be saved, only made again). ``w`` and ``in_out`` as for
    ``mkl_packed_linear``; ``rows``: the product's row count at compile time (oneDNN's hint)."""
    lead = w.shape[0]
    flat = torch.as_strided(w, (lead, w.numel() // lead), (w.numel() // lead, 1))
    if in_out:
        flat = flat.t()
    return torch.ops.mkldnn._reorder_linear_weight(flat.contiguous(), rows)


@derivation("pad_rows")
def pad_rows(w: torch.Tensor, rows: int) -> torch.Tensor:
    """``w [n, ...]`` zero-padded to ``[rows, ...]``: a GEMM weight ``W[out, in]`` whose output
    width is padded to what the device's GEMM aligns (``DeviceLibrary.gemm_out_align``)."""
    out = w.new_zeros((rows, *w.shape[1:]))
    out[: w.shape[0]] = w
    return out


def derived_constant(lowering, source: ConstantBuffer, name: str, *args) -> ConstantBuffer:
    """The constant ``derive(name, source.value, *args)``, added to the graph ``lowering``
    builds, once per (source, derivation, args)."""
    made = lowering.__dict__.setdefault("_derived_constants", {})
    key = (source.name, name, args)
    if key not in made:
        value = derive(name, source.value, *args)
        layout = Layout(value.device, value.dtype, list(value.shape), list(value.stride()), 0)
        root = source.derived_from if source.derived_from is not None else source.value
        made[key] = lowering.graph.add_constant(ConstantBuffer(
            lowering.new_constant_name(), layout, value, source.target,
            derived_from=root, recipe=(name, source.name, args)))
    return made[key]


def derived_sources(graph) -> list[torch.Tensor]:
    """The tensors a graph's constants were computed from at compile time (``derived_from``):
    whoever runs the graph guards them (an in-place write to one: compile again)."""
    return [c.derived_from for c in graph.constant_buffers if c.derived_from is not None]


def constant_reads(graph, gm) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The live tensors (``gm``'s own parameters and buffers, the objects a user holds) behind
    a graph's constants: ``(computed_from, read)``.

    A constant's value is an alias of the tensor's memory taken at compile time (``get_attr``)
    or a tensor derived from it: neither follows the tensor to new memory (``p.data = other``,
    ``p.set_(other)``), so whoever runs the graph guards the live tensors' memory and view,
    and for ``computed_from`` (roots of derived constants) their version counters too (an
    in-place write is not seen by a copy; ``read`` constants alias the memory and see it).
    A constant whose target does not name a tensor of ``gm`` aliasing its value is guarded
    as before (its ``derived_from``), or not at all."""
    by_name = {c.name: c for c in graph.constant_buffers}
    computed: dict[int, torch.Tensor] = {}
    read: dict[int, torch.Tensor] = {}

    def live(c) -> torch.Tensor | None:
        obj = gm
        try:
            for atom in c.target.split("."):
                obj = getattr(obj, atom)
        except AttributeError:
            return None
        try:
            if isinstance(obj, torch.Tensor) and c.value is not None and obj.is_set_to(c.value):
                return obj
        except Exception:  # a tensor subclass without is_set_to: guarded by its constant
            pass
        return None

    for c in graph.constant_buffers:
        root, hops = c, 0
        while root.recipe is not None and root.recipe[1] in by_name and hops < len(by_name):
            root, hops = by_name[root.recipe[1]], hops + 1
        t = live(root) if root.target else None
        derived = c.derived_from is not None
        if t is None:
            t = c.derived_from
        if t is not None:
            (computed if derived else read)[id(t)] = t
    return list(computed.values()), [t for k, t in read.items() if k not in computed]
