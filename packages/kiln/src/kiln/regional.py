"""Regional compilation: a block repeated through a model (each layer of a transformer) is
compiled once and its compiled code serves every instance.

    kiln.compile_repeated_blocks(model)        # the children of ModuleLists of one class
    kiln.compile_repeated_blocks(model, block_classes=(MyLayer,))

    @kiln.compile_region                       # every instance of the class shares one region
    class MyLayer(nn.Module): ...

How: per block class, one *template* (a copy of the first instance, with the class's own
forward) and one compiled function ``run(params, args, kwargs)`` =
``torch.func.functional_call(template, params, args, kwargs)``. The block's parameters and
buffers are graph inputs (``params``), never baked in, so the frontend's guards on them are
tensor guards (shape, dtype, device, requires_grad), not identities: every instance with the
same shapes passes them, and an instance with other shapes or dtypes recompiles. Before each
call the instance's other Python state (attributes of it and its submodules: ``training``,
``layer_idx``, the submodules' hook dicts) is copied onto the template, so what the trace read
of it is guarded as usual: an instance that differs in something the forward reads
recompiles, one that differs in what it never reads does not. The instance's own hooks run
around the call, as eager runs them.

Instances whose module trees differ (other submodule classes, other parameter names) get a
template each. The template holds one copy of a block's parameters (never read: every call
passes the instance's).
"""

from __future__ import annotations

import copy
import functools
import types
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

__all__ = ["compile_repeated_blocks", "compile_region"]


def _structure(module: nn.Module) -> tuple:
    """What ``functional_call`` on a shared template needs to be the same."""
    return tuple(
        (name, type(m), tuple(m._parameters), tuple(m._buffers))
        for name, m in module.named_modules()
    )


class _Region:
    """One template and its compiled runner (one per block class and structure)."""

    def __init__(self, first: nn.Module, compile_kwargs: dict[str, Any], forward=None):
        from .api import compile as kiln_compile

        template = copy.deepcopy(first)
        template.__dict__.pop("forward", None)  # the class's own forward
        if forward is not None:  # the class's forward before compile_region replaced it
            template.forward = types.MethodType(forward, template)
        self.template = template
        self.paths = [name for name, _ in template.named_modules()]
        self.template_modules = [m for _, m in template.named_modules()]
        #: what a call passes: (module position, attribute name, key in ``params``), the
        #: parameters of every module first, then the buffers, as named_parameters and
        #: named_buffers order them
        self.tensor_slots = [
            (i, table, name, f"{path}.{name}" if path else name)
            for table in ("_parameters", "_buffers")
            for i, (path, m) in enumerate(zip(self.paths, self.template_modules, strict=True))
            for name in getattr(m, table)]

        def run(params, args, kwargs):
            return torch.func.functional_call(template, params, args, kwargs)

        # its own code object, so its cache entries (and cache limit) are this region's
        name = f"region_{type(first).__name__}"
        run.__code__ = run.__code__.replace(co_name=name)
        run.__name__ = run.__qualname__ = name
        self.compiled = kiln_compile(run, **compile_kwargs)

    def __call__(self, instance: nn.Module, *args: Any, **kwargs: Any) -> Any:
        # Cheap per call (a region runs once per layer): one walk of the instance's modules,
        # each module's state copied by one dict update (in C: cheaper than comparing
        # attribute by attribute, and the guard tree rechecks what it read), the parameters
        # read by position.
        sources = [m for _, m in instance.named_modules()]
        for depth, (source, target) in enumerate(zip(sources, self.template_modules,
                                                     strict=True)):
            _copy_state(source.__dict__, target.__dict__, depth == 0)
        params = {}
        for i, table, name, key in self.tensor_slots:
            value = getattr(sources[i], table)[name]
            if value is not None:
                params[key] = value
        return self.compiled(params, args, kwargs)


def _block_own(key: str) -> bool:
    """The block's own entries that stay the template's: its forward and hooks (the
    instance's run around the call, as eager runs them)."""
    return key == "forward" or "hook" in key


def _copy_state(source: dict, target: dict, root: bool) -> None:
    """``target`` (a template module's __dict__) takes ``source``'s attributes, keeping its
    own parameter, buffer and module tables (and, for the block itself, ``_block_own``)."""
    own = target["_parameters"], target["_buffers"], target["_modules"]
    if root:
        kept = {k: v for k, v in target.items() if _block_own(k)}
        target.update(source)
        for key in [k for k in source if _block_own(k) and k not in kept]:
            del target[key]
        target.update(kept)
    else:
        target.update(source)
    target["_parameters"], target["_buffers"], target["_modules"] = own


class _Regions:
    """Regions by (class, structure), made on first use."""

    def __init__(self, compile_kwargs: dict[str, Any], forward=None):
        self.compile_kwargs = compile_kwargs
        self.forward = forward
        self.regions: dict[tuple, _Region] = {}

    def region_for(self, instance: nn.Module) -> _Region:
        key = (type(instance), _structure(instance))
        region = self.regions.get(key)
        if region is None:
            region = self.regions[key] = _Region(instance, self.compile_kwargs, self.forward)
        return region


def _repeated_blocks(model: nn.Module, block_classes: tuple[type, ...] | None) -> list[nn.Module]:
    if block_classes:
        return [m for m in model.modules() if type(m) in block_classes]
    found: list[nn.Module] = []
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m) > 1 and \
                len({type(c) for c in m}) == 1:
            found.extend(m)
    return found


def compile_repeated_blocks(model: nn.Module, block_classes: Iterable[type] | None = None,
                            **compile_kwargs: Any) -> nn.Module:
    """Compile each repeated block of ``model`` once for all its instances (module
    docstring). Blocks: the children of an ``nn.ModuleList`` whose children are all of one
    class, or the instances of ``block_classes``. ``compile_kwargs`` go to ``kiln.compile``.
    Returns ``model`` (its blocks now run compiled; the rest stays eager)."""
    classes = tuple(block_classes) if block_classes is not None else None
    regions = _Regions(compile_kwargs)
    blocks = _repeated_blocks(model, classes)
    if not blocks:
        raise ValueError("compile_repeated_blocks found no repeated blocks (no ModuleList of "
                         "modules of one class); pass block_classes")
    for block in blocks:
        region = regions.region_for(block)
        block.forward = functools.partial(region, block)
    return model


def compile_region(cls: type | None = None, **compile_kwargs: Any) -> Any:
    """Class decorator: every instance of the ``nn.Module`` class runs one compiled region
    (``@kiln.compile_region`` or ``@kiln.compile_region(dynamic=False)``)."""
    if cls is None:
        return functools.partial(compile_region, **compile_kwargs)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError("kiln.compile_region decorates an nn.Module class")
    original = cls.forward
    regions = _Regions(compile_kwargs, original)

    def forward(self, *args, **kwargs):
        return regions.region_for(self)(self, *args, **kwargs)

    functools.update_wrapper(forward, original)
    cls.forward = forward
    return cls
