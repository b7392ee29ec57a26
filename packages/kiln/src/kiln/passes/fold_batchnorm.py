"""Fold an eval-mode BatchNorm into the convolution before it.

``bn(conv(x))`` in eval mode is one convolution with weight ``W * s`` and bias
``(b - mean) * s + beta``, ``s = gamma / sqrt(var + eps)`` per output channel: the kernel after
the convolution then keeps only what follows the norm (an activation, a residual add), and
the per-element normalization arithmetic disappears.

The folded weights are computed once, at compile time, from the parameters and running
statistics as they are then: they are constants of the compiled graph. ``FoldedParams`` is the
guard that keeps that honest: it remembers each source tensor's version counter (bumped by
every in-place write: ``load_state_dict``, an optimizer step, ``copy_``) and each BatchNorm
module's ``training`` flag, and the backend recompiles when one changed. A BatchNorm run in
training mode writes its running statistics in place *without* bumping their version counters
(torch's kernels do not), so the guard also watches the owning module's
``num_batches_tracked``, which every training-mode forward bumps (``add_(1)``); a functional
BatchNorm whose statistics no such module owns is not folded.

Matched: a ``call_module`` ``nn.Conv2d`` (zero padding mode) whose only user is an
``nn.BatchNorm2d`` module in eval mode with running statistics, or
``torch.nn.functional.batch_norm(conv, running_mean, running_var, weight, bias, False, ...)``
with ``get_attr`` tensors (timm's ``BatchNormAct2d``). The input graph is left untouched (the
backend's eager fallbacks still run it); the pass returns a new GraphModule.
"""

from __future__ import annotations

import dataclasses
import gc
import logging

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from kiln_aotgrad.effects import runs_for_effect
from kiln_frontend.collector import compile_froze_the_heap

log = logging.getLogger("kiln")

__all__ = ["FoldedParams", "batch_counters", "fold_conv_batchnorm", "folded_value"]

_BN_ARG_NAMES = ("input", "running_mean", "running_var", "weight", "bias", "training",
                 "momentum", "eps")


@dataclasses.dataclass
class FoldedParams:
    """What a folded graph depends on: source tensors with their versions at fold time, and
    the BatchNorm modules that must stay in eval mode (``kiln.cache.WeightsGuard`` checks them
    at each call and compiles again when one changed)."""

    sources: list[tuple[torch.Tensor, int]] = dataclasses.field(default_factory=list)
    eval_modules: list[nn.Module] = dataclasses.field(default_factory=list)
    folded: int = 0  # conv+batchnorm pairs folded

    def guard_copies(self, tensors) -> None:
        """Also guard tensors the compiled graph holds a copy of (a weight stored
        channels-last): an in-place write to one recompiles, as for a folded source."""
        self.sources.extend((t, t._version) for t in tensors)

    def __str__(self) -> str:
        return (f"FoldedParams({self.folded} conv+batchnorm folded, guarding "
                f"{len(self.sources)} tensors, {len(self.eval_modules)} modules)")



def writes_in_place(node: torch.fx.Node) -> bool:
    """Whether dead-code elimination must keep ``node`` although nothing uses its value: one
    run for its effect (``kiln_aotgrad.effects.runs_for_effect``, as aotgrad decides), or one that returned one of its own tensor arguments (``relu(x,
    inplace=True)``, ``x.add_(1)``, ``out=x``). A frame's later code reads ``x`` itself, so
    in a torch-level graph (TorchDynamo's and kiln's frontend alike) such a node has no
    users, and dropping it drops the write: resnet18's in-place ReLUs vanished after
    folding and every output was wrong."""
    if runs_for_effect(node):
        return True
    result = node.meta.get("example_value")
    return isinstance(result, torch.Tensor) and any(
        arg.meta.get("example_value") is result for arg in node.all_input_nodes)

def _attr(gm: torch.fx.GraphModule, node) -> torch.Tensor | None:
    """The tensor a ``get_attr`` node reads (None for None; raises LookupError otherwise)."""
    if node is None:
        return None
    if isinstance(node, torch.fx.Node) and node.op == "get_attr":
        obj = gm
        for part in node.target.split("."):
            obj = getattr(obj, part)
        if isinstance(obj, torch.Tensor):
            return obj
    raise LookupError(node)


def folded_value(which: str, conv_weight: torch.Tensor, conv_bias: torch.Tensor | None,
                 mean: torch.Tensor, var: torch.Tensor, gamma: torch.Tensor | None,
                 beta: torch.Tensor | None, eps: float, *, stride: tuple | None = None
                 ) -> torch.Tensor:
    """The folded conv ``"weight"`` or ``"bias"`` of one conv+BatchNorm pair, from the source
    tensors (contiguous, or with ``stride``): the fold itself and a graph-cache hit
    (``kiln.cache``, which stores this recipe rather than the folded values) compute it with
    this one function, so both give the same bits."""
    with torch.no_grad():
        scale = torch.rsqrt(var.double() + eps)
        if gamma is not None:
            scale = scale * gamma.double()
        if which == "weight":  # the scale in double, the big product in the weight's dtype
            out = torch.empty_strided(conv_weight.shape, stride or conv_weight.contiguous().stride(),
                                      dtype=conv_weight.dtype, device=conv_weight.device)
            return torch.mul(conv_weight, scale.to(conv_weight.dtype).reshape(-1, 1, 1, 1), out=out)
        else:
            value = -mean.double() * scale
            if conv_bias is not None:
                value = value + conv_bias.double() * scale
            if beta is not None:
                value = value + beta.double()
        value = value.to(conv_weight.dtype).contiguous()
        if stride is not None and tuple(value.stride()) != tuple(stride):
            value = torch.empty_strided(value.shape, stride, dtype=value.dtype,
                                        device=value.device).copy_(value)
        return value


def batch_counters(stats, modules=()) -> dict[int, torch.Tensor | None]:
    """For each running-statistics tensor in ``stats`` (by ``id``), the ``num_batches_tracked``
    of the BatchNorm module owning it, or None when no module with one owns it. Training-mode
    BatchNorm updates the statistics in place without a version bump but always bumps this
    counter, so guarding its version catches what guarding theirs misses. ``modules`` are
    looked at first; the owners of the rest are found among the objects referring to them
    (one ``gc`` pass at compile time: a functional BatchNorm names no module in the graph)."""
    stats = [t for t in stats if t is not None]
    found: dict[int, torch.Tensor | None] = {id(t): None for t in stats}

    def look(buffers) -> None:
        counter = buffers.get("num_batches_tracked")
        if not isinstance(counter, torch.Tensor):
            return
        for key in ("running_mean", "running_var"):
            t = buffers.get(key)
            if t is not None and id(t) in found:
                found[id(t)] = counter

    for m in modules:
        look(getattr(m, "_buffers", {}))
    missing = [t for t in stats if found[id(t)] is None]
    if missing:
        for ref in _referrers(missing):
            if isinstance(ref, dict) and "num_batches_tracked" in ref:
                look(ref)
    return found


def _referrers(objs: list) -> list:
    """``gc.get_referrers(*objs)``, frozen objects included. The frontend freezes the heap
    while a frame compiles (kiln_frontend.collector), and get_referrers does not scan the
    permanent generation: the modules owning the statistics were never found, so no
    functional BatchNorm (timm's BatchNormAct2d: EfficientNet, MobileNetV3, RegNet) folded."""
    if not compile_froze_the_heap():  # (on 3.12 the count is never 0: its immortal objects)
        return gc.get_referrers(*objs)
    gc.unfreeze()
    try:
        return gc.get_referrers(*objs)
    finally:
        gc.freeze()


def _batchnorm_params(gm, node) -> tuple | None:
    """(input node, mean, var, gamma, beta, eps, module or None, qualified names of mean, var,
    gamma, beta) of an eval BatchNorm node."""
    if node.op == "call_module":
        m = gm.get_submodule(node.target)
        if (type(m) is not nn.BatchNorm2d or m.training or m.running_mean is None
                or len(node.args) != 1 or node.kwargs):
            return None
        names = tuple(None if t is None else f"{node.target}.{a}" for t, a in (
            (m.running_mean, "running_mean"), (m.running_var, "running_var"),
            (m.weight, "weight"), (m.bias, "bias")))
        return node.args[0], m.running_mean, m.running_var, m.weight, m.bias, m.eps, m, names
    if node.op == "call_function" and node.target is F.batch_norm:
        bound = dict(zip(_BN_ARG_NAMES, node.args, strict=False))
        bound.update(node.kwargs)
        if bound.get("training", False) is not False:
            return None
        try:
            mean, var = _attr(gm, bound.get("running_mean")), _attr(gm, bound.get("running_var"))
            gamma, beta = _attr(gm, bound.get("weight")), _attr(gm, bound.get("bias"))
        except LookupError:
            return None
        if mean is None or var is None or mean.dim() != 1:
            return None
        names = tuple(None if bound.get(a) is None else bound[a].target
                      for a in ("running_mean", "running_var", "weight", "bias"))
        return bound["input"], mean, var, gamma, beta, float(bound.get("eps", 1e-5)), None, names
    return None


def _symbolic(x) -> bool:
    if isinstance(x, torch.SymInt):
        return True
    return isinstance(x, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in x.shape)


def _foldable_conv(gm, node) -> nn.Conv2d | None:
    if not (isinstance(node, torch.fx.Node) and node.op == "call_module" and len(node.users) == 1
            and len(node.args) == 1 and not node.kwargs):
        return None
    m = gm.get_submodule(node.target)
    if type(m) is not nn.Conv2d or m.padding_mode != "zeros" or m.weight.dtype not in (
            torch.float32, torch.float64):
        return None
    return m


def fold_conv_batchnorm(gm: torch.fx.GraphModule, example_inputs=()
                        ) -> tuple[torch.fx.GraphModule, FoldedParams]:
    """A copy of ``gm`` with every eval-mode ``bn(conv(x))`` pair folded into one
    ``torch.conv2d`` on new constant buffers, and the guard of those constants. Returns ``gm``
    itself (and an empty guard) when nothing folds, and for graphs with symbolic sizes (kept
    as they were: a folded conv feeding a conv under symbolic sizes reaches layouts loopir
    cannot prove dense)."""
    guard = FoldedParams()
    if not isinstance(gm, torch.fx.GraphModule):  # a backend may be handed a plain module
        return gm, guard
    placeholders = [n.meta.get("example_value", n.meta.get("val"))
                    for n in gm.graph.nodes if n.op == "placeholder"]
    if any(_symbolic(x) for x in [*example_inputs, *placeholders]):
        return gm, guard
    pairs = []
    for node in gm.graph.nodes:
        bn = _batchnorm_params(gm, node)
        if bn is None:
            continue
        conv = _foldable_conv(gm, bn[0])
        if conv is None or bn[1].shape[0] != conv.out_channels:
            continue
        pairs.append((node, bn, conv))
    if not pairs:
        return gm, guard
    counters = batch_counters([t for _, bn, _ in pairs for t in bn[1:3]],
                              [bn[6] for _, bn, _ in pairs if bn[6] is not None])
    owned = [p for p in pairs if all(counters[id(t)] is not None for t in p[1][1:3])]
    if len(owned) < len(pairs):  # statistics a training-mode call could change unseen
        log.info("kiln: %d batchnorm(s) not folded: their running statistics belong to no "
                 "module with num_batches_tracked", len(pairs) - len(owned))
        pairs = owned
        if not pairs:
            return gm, guard

    graph = torch.fx.Graph()
    val_map: dict = {}
    out = graph.graph_copy(gm.graph, val_map)
    graph.output(out)
    new_gm = torch.fx.GraphModule(gm, graph)
    new_gm.meta = dict(getattr(gm, "meta", {}) or {})
    recipes: dict[str, tuple] = {}  # folded buffer -> ("weight" | "bias", source names, eps)
    for i, (bn_node, bn, conv) in enumerate(pairs):
        conv_node, mean, var, gamma, beta, eps, bn_mod, bn_names = bn
        sources = (conv.weight, conv.bias, mean, var, gamma, beta)
        source_names = (f"{conv_node.target}.weight",
                        None if conv.bias is None else f"{conv_node.target}.bias", *bn_names)
        weight = folded_value("weight", *sources, eps)
        bias = folded_value("bias", *sources, eps)
        w_name, b_name = f"_kiln_folded_{i}_weight", f"_kiln_folded_{i}_bias"
        new_gm.register_buffer(w_name, weight)
        new_gm.register_buffer(b_name, bias)
        recipes[w_name] = ("weight", source_names, eps)
        recipes[b_name] = ("bias", source_names, eps)
        old_bn, old_conv = val_map[bn_node], val_map[conv_node]
        with graph.inserting_before(old_bn):
            w = graph.get_attr(w_name)
            b = graph.get_attr(b_name)
            for attr_node, value in ((w, weight), (b, bias)):
                attr_node.meta["example_value"] = value
            fused = graph.call_function(
                torch.conv2d,
                (old_conv.args[0], w, b, conv.stride, conv.padding, conv.dilation, conv.groups))
        fused.meta = dict(old_bn.meta)
        old_bn.replace_all_uses_with(fused)
        graph.erase_node(old_bn)
        graph.erase_node(old_conv)
        for t in (*sources, *{id(c): c for c in (counters[id(mean)], counters[id(var)])}.values()):
            if t is not None:  # the counters: running statistics change without a version bump
                guard.sources.append((t, t._version))
        if bn_mod is not None:
            guard.eval_modules.append(bn_mod)
        guard.folded += 1
    graph.eliminate_dead_code(is_impure_node=writes_in_place)
    graph.lint()
    new_gm.recompile()
    new_gm.meta["kiln_folded_recipes"] = recipes  # how to recompute each (kiln.cache)
    log.info("kiln: folded %d conv+batchnorm pairs into conv weights", guard.folded)
    return new_gm, guard


