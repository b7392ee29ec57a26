"""Where each graph constant comes from (a recipe), and binding recipes to a live module.

Recipes (``describe``), by graph constant name:

- ``("attr", name)``: the live module tensor (graph-relative name, ``kiln.names``);
- ``("layout", name, stride)``: a copy of it in another layout (a conv weight stored
  channels-last), made again from the live tensor;
- ``("folded", (which, names, eps), stride)``: a conv weight or bias with a BatchNorm folded
  in, computed again from the live tensors with ``kiln.passes.folded_value`` (the fold's own
  code; checked bit for bit against the compiled constant when described);
- ``("stored", tensor)``: a tensor kept as is (one the trace itself created, or one we cannot
  tie to the module: then the artifact is valid only for these weights);
- ``("derived", derivation, source, args)``: made by a registered derivation from graph
  constant ``source`` (``kiln_loopir.derived_constants``: a weight packed for MKL's GEMM).
- ``("computed", (subgraph, names), stride)``: a weight-only subgraph's result
  (``kiln.passes.fold_weight_subgraphs``: DeBERTa's projected position table), computed
  again by running ``subgraph`` (a GraphModule) on the live tensors ``names``.

A constant computed from a weight in any other way has no recipe (``None``): its artifact
runs from its value in this process and is not cached.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from kiln_loopir.derived_constants import THREAD_TUNED, derive

from .names import GraphNames
from .passes.fold_batchnorm import folded_value
from .passes.fold_weight_subgraphs import recompute

log = logging.getLogger("kiln.cache")

__all__ = ["NoRecipe", "bind", "describe", "one_thread"]


class NoRecipe(Exception):
    """A constant has no recipe; the message says why."""


def _fold_recipe(name: str, value, target, gm, names: GraphNames, folds) -> tuple | None:
    """The recipe of a constant one of ``folds`` made (``(kind, its recipes by buffer name,
    the recipe maker)``: the weight-subgraph fold's, the batchnorm fold's), or None: not a
    fold's, or one whose recipe cannot be written (then it is stored, valid for these
    weights only)."""
    if not isinstance(value, torch.Tensor):
        return None
    for kind, made, recipe_of in folds:
        if target in made:
            try:
                return recipe_of(name, value, made[target], gm, names)
            except NoRecipe as e:
                log.debug("kiln: %s constant %s stored as is: %s", kind, name, e)
    return None


def describe(constant_buffers, values: dict, gm, names: GraphNames, folded: dict,
             trace_constants: frozenset[str], computed: dict | None = None
             ) -> tuple[dict[str, tuple], bool]:
    """(recipe by constant name, whether a stored tensor may hold weight values). Raises
    ``NoRecipe``. ``constant_buffers``: the loop graph's; ``values``: the module's constants;
    ``folded``: the batchnorm fold's recipes by buffer name; ``trace_constants``: constants
    the trace made (it saw fake weights: they hold none); ``computed``: the weight-subgraph
    fold's recipes by buffer name."""
    computed = computed or {}
    targets = {b.name: b.target for b in constant_buffers}
    derivations = {b.name: b.recipe for b in constant_buffers if getattr(b, "recipe", None)}
    recipes, weight_valued = {}, False
    for name, value in values.items():
        if name in derivations:
            derivation, source, args = derivations[name]
            if source not in values:
                raise NoRecipe(f"constant {name} is derived from {source}, not a graph constant")
            recipes[name] = ("derived", derivation, source, tuple(args))
            continue
        target = targets.get(name)
        recipe = _fold_recipe(name, value, target, gm, names,
                              (("computed", computed, _computed), ("folded", folded, _folded)))
        if recipe is not None:
            recipes[name] = recipe
            continue
        norm = names.normalize(target) if target else None
        live = None
        if norm is not None:
            try:
                live = names.resolve(gm, norm)
            except AttributeError:
                live = None
        if not isinstance(live, torch.Tensor) or not isinstance(value, torch.Tensor):
            weight_valued = weight_valued or target not in trace_constants
            if isinstance(value, torch.Tensor):  # a view would save its whole storage
                value = value.detach()
                if value.untyped_storage().nbytes() > value.nbytes:
                    value = value.clone()
            recipes[name] = ("stored", value)
        elif _same_tensor(live, value):
            recipes[name] = ("attr", norm)
        elif (live.shape == value.shape and live.dtype == value.dtype
              and live.device == value.device and value.storage_offset() == 0
              and torch.equal(live.detach(), value)):
            recipes[name] = ("layout", norm, tuple(value.stride()))
        else:
            raise NoRecipe(f"constant {name} is computed from parameter {target}")
    return recipes, weight_valued


def bind(recipes: dict[str, tuple], gm, names: GraphNames) -> dict[str, Any]:
    """Each constant's value for the live module ``gm``: recipes run again (layout copies and
    refolds on one thread; MKL packing with the graph's threads, as it runs with them)."""
    values = {}
    with one_thread():
        for name, (kind, ref, *rest) in recipes.items():
            if kind != "derived":
                values[name] = _bound(name, kind, ref, rest, gm, names)
    for name in _derivation_order(recipes):
        _, derivation, source, args = recipes[name]
        # packed on one thread, a hit's BERT-sized linears ran 1.5-2x slower
        with contextlib.nullcontext() if derivation in THREAD_TUNED else one_thread():
            values[name] = derive(derivation, values[source], *args)
    return values


def _bound(name: str, kind: str, ref, rest: list, gm, names: GraphNames) -> Any:
    if kind == "stored":
        return ref
    if kind == "folded":
        return _fold_again(ref, gm, names, tuple(rest[0]))
    if kind == "computed":
        return _compute_again(ref, gm, names, tuple(rest[0]))
    value = names.resolve(gm, ref)
    if not isinstance(value, torch.Tensor):
        raise LookupError(f"constant {name} ({ref}) is not a tensor here")
    value = value.detach()
    if kind == "layout":
        (stride,) = rest
        value = torch.empty_strided(value.shape, stride, dtype=value.dtype,
                                    device=value.device).copy_(value)
    return value


def _folded(name: str, value: torch.Tensor, recipe: tuple, gm, names: GraphNames) -> tuple:
    which, qualnames, eps = recipe
    norms = tuple(None if q is None else names.normalize(q) for q in qualnames)
    if any(n is None and q is not None for n, q in zip(norms, qualnames, strict=True)):
        raise NoRecipe(f"constant {name} is folded from tensors outside the graph's names")
    recipe = (which, norms, eps)
    try:
        with one_thread():
            again = _fold_again(recipe, gm, names, tuple(value.stride()))
    except Exception as e:
        raise NoRecipe(f"constant {name} cannot be folded again ({type(e).__name__}: {e})") from e
    if (again.shape != value.shape or again.dtype != value.dtype or again.device != value.device
            or again.stride() != value.stride() or value.storage_offset() != 0
            or not torch.equal(again, value)):
        raise NoRecipe(f"constant {name} does not match its fold recipe")
    return ("folded", recipe, tuple(value.stride()))


def _computed(name: str, value: torch.Tensor, recipe: tuple, gm, names: GraphNames) -> tuple:
    sub_gm, targets = recipe
    norms = tuple(names.normalize(t) for t in targets)
    if any(n is None for n in norms):
        raise NoRecipe(f"constant {name} is computed from tensors outside the graph's names")
    recipe = (sub_gm, norms)
    try:
        again = _compute_again(recipe, gm, names, tuple(value.stride()))
    except Exception as e:
        raise NoRecipe(f"constant {name} cannot be computed again ({type(e).__name__}: {e})"
                       ) from e
    if (again.shape != value.shape or again.dtype != value.dtype or again.device != value.device
            or not torch.equal(again, value)):
        raise NoRecipe(f"constant {name} does not match its recipe")
    return ("computed", recipe, tuple(value.stride()))


def _compute_again(recipe: tuple, gm, names: GraphNames, stride: tuple) -> torch.Tensor:
    sub_gm, norms = recipe
    tensors = [names.resolve(gm, n) for n in norms]
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        raise LookupError(f"a source of a computed constant ({norms}) is not a tensor here")
    value = recompute(recipe, tensors)
    if tuple(value.stride()) != stride:
        value = torch.empty_strided(value.shape, stride, dtype=value.dtype,
                                    device=value.device).copy_(value)
    return value


def _fold_again(recipe: tuple, gm, names: GraphNames, stride: tuple) -> torch.Tensor:
    which, norms, eps = recipe
    tensors = []
    for norm in norms:
        t = None if norm is None else names.resolve(gm, norm)
        if norm is not None and not isinstance(t, torch.Tensor):
            raise LookupError(f"fold source {norm} is not a tensor here")
        tensors.append(None if t is None else t.detach())
    return folded_value(which, *tensors, eps, stride=stride)


def _derivation_order(recipes: dict) -> list[str]:
    """The derived constants, each after the derived constant it is made from."""
    done = {n for n, (kind, *_) in recipes.items() if kind != "derived"}
    order, pending = [], [n for n in recipes if n not in done]
    while pending:
        ready = [n for n in pending if recipes[n][2] in done]
        if not ready:
            raise LookupError(f"derived constants {pending} have no source among the constants")
        order += ready
        done.update(ready)
        pending = [n for n in pending if n not in done]
    return order


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.device == b.device and a.dtype == b.dtype and a.shape == b.shape
            and a.stride() == b.stride() and a.data_ptr() == b.data_ptr())


@contextlib.contextmanager
def one_thread():
    """Run refolds and layout copies on one intra-op thread: each is one small memory-bound
    pass, and on a loaded machine every parallel region waits for a descheduled worker
    (resnet18's 40 refolds: ~0.04 s on one thread, ~0.4 s on two busy cores)."""
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
