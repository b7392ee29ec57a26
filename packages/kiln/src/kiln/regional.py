"""Regional compilation: a block repeated through a model (each layer of a transformer) is
compiled once and its compiled code serves every instance.

    kiln.compile_repeated_blocks(model)        # the children of ModuleLists of one class
    kiln.compile_repeated_blocks(model, block_classes=(MyLayer,))

    @kiln.compile_region                       # every instance of the class shares one region
    class MyLayer(nn.Module): ...

How: per block class, one *template* (a copy of the first instance, with the class's own
forward and no tensors of its own) and one compiled function ``run(tensors, args, kwargs)`` =
``torch.func.functional_call(template, params, args, kwargs)``, ``params`` named from the flat
``tensors``. The block's parameters and buffers are graph inputs, never baked in, so the
frontend's guards on them are tensor guards (shape, dtype, device, requires_grad), not
identities: every instance with the same shapes passes them, and an instance with other
shapes or dtypes recompiles. Before each call the instance's other Python state (attributes
of it and its submodules: ``training``, ``layer_idx``, the submodules' hook dicts) is copied
onto the template, so what the trace read of it is guarded as usual: an instance that differs
in something the forward reads recompiles, one that differs in what it never reads does not.
The instance's own hooks run around the call, as eager runs them.

A call runs once per layer, so what it reads is found once per instance (``_Binding``): the
module dicts to copy and where each tensor lives; a call checks that the bound tree still
holds, copies, reads the tensors from the live tables and calls the compiled region.

Instances whose module trees differ (other submodule classes, other parameter names) get a
template each.
"""

from __future__ import annotations

import copy
import functools
import operator
import types
import weakref
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

        bound = first.__dict__.get("forward")  # a binding (compile_repeated_blocks)
        template = copy.deepcopy(first, {id(bound): None} if bound is not None else None)
        # the class's own forward (or, under compile_region, the one it replaced), held in
        # the template's __dict__ so a call's copy of the instance's entries restores it
        template.__dict__["forward"] = types.MethodType(
            forward if forward is not None else type(first).forward, template)
        for m in template.modules():  # every call passes the instance's (a None too)
            for table in (m._parameters, m._buffers):
                table.update(dict.fromkeys(table))
        self.template = template
        self.paths = [name for name, _ in template.named_modules()]
        self.template_modules = [m for _, m in template.named_modules()]
        #: what a call passes, by position: (module position, table, name), the parameters
        #: of every module first, then the buffers, as named_parameters and named_buffers
        #: order them
        self.tensor_slots = [
            (i, table, name)
            for table in ("_parameters", "_buffers")
            for i, m in enumerate(self.template_modules)
            for name in getattr(m, table)]
        keys = tuple(f"{self.paths[i]}.{name}" if self.paths[i] else name
                     for i, _, name in self.tensor_slots)

        def run(tensors, args, kwargs):
            params = {k: t for k, t in zip(keys, tensors, strict=True) if t is not None}
            return torch.func.functional_call(template, params, args, kwargs)

        # its own code object, so its cache entries (and cache limit) are this region's
        name = f"region_{type(first).__name__}"
        run.__code__ = run.__code__.replace(co_name=name)
        run.__name__ = run.__qualname__ = name
        self.compiled = kiln_compile(run, **compile_kwargs)


#: a module's own tables, which stay the template's when the instance's entries are copied
_OWN_TABLES = ("_parameters", "_buffers", "_modules")
_children = operator.itemgetter("_modules")
_parameters = operator.itemgetter("_parameters")
_buffers = operator.itemgetter("_buffers")


def _block_own(key: str) -> bool:
    """The block's own entries that stay the template's: its forward and hooks (the
    instance's run around the call, as eager runs them)."""
    return key == "forward" or "hook" in key


class _Binding:
    """One block instance bound to its region, so a call costs a few microseconds (it runs
    once per layer): the module dicts a call copies onto the template and where each tensor
    it passes lives are found once, by ``bind``. Each call then checks, in C (map over the
    dicts), that the instance's module tree is the one bound (each module's submodules by
    identity, the sizes of its __dict__ and its parameter and buffer tables), copies every
    module's __dict__ onto its template module (a ``dict.update``, keeping the template's
    own tables), reads the tensors from the live tables, and calls the compiled region. The
    frontend's guards then check, as for any frame, what the trace read of the template
    (``training``, hook dicts, attributes) and the tensors' shapes, dtypes and devices. A
    changed tree binds again (another region if its structure changed); a key the instance
    gained or lost shows in a size."""

    __slots__ = ("regions", "instance", "region", "copies", "root_drop", "slots", "srcs",
                 "tgts", "src_lens", "tgt_lens", "tree")

    def __init__(self, regions: _Regions, instance: nn.Module):
        # weak: the decorator's bindings are values of a WeakKeyDictionary keyed by instance
        self.regions, self.instance = regions, weakref.ref(instance)
        self.bind()

    def bind(self) -> None:
        instance = self.instance()
        region = self.region = self.regions.region_for(instance)
        srcs = self.srcs = [m.__dict__ for _, m in instance.named_modules()]
        tgts = self.tgts = [m.__dict__ for m in region.template_modules]
        owns = [{k: tgt[k] for k in _OWN_TABLES} for tgt in tgts]
        owns[0].update({k: v for k, v in tgts[0].items() if _block_own(k)})
        self.root_drop = [k for k in srcs[0] if _block_own(k) and k not in owns[0]]
        self.copies = list(zip(srcs, tgts, owns, strict=True))
        for src, tgt, own in self.copies:  # the template now holds no key of another
            tgt.clear()
            tgt.update(src)
            tgt.update(own)
        for key in self.root_drop:
            del tgts[0][key]
        self.src_lens = list(map(len, srcs))
        self.tgt_lens = list(map(len, tgts))
        self.tree = self._tree()
        self.slots = [(srcs[i], table, name) for i, table, name in region.tensor_slots]

    def _tree(self) -> list:
        """The bound module tree, as a call checks it: submodules, table sizes."""
        srcs = self.srcs
        return [*map(tuple, map(dict.values, map(_children, srcs))),
                *map(len, map(_parameters, srcs)), *map(len, map(_buffers, srcs))]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if list(map(len, self.srcs)) != self.src_lens or self._tree() != self.tree:
            self.bind()
        for src, tgt, own in self.copies:
            tgt.update(src)
            tgt.update(own)
        tgts = self.tgts
        for key in self.root_drop:
            del tgts[0][key]
        if list(map(len, tgts)) != self.tgt_lens:  # the instance lost a key and gained one
            self.bind()
        tensors = [src[table][name] for src, table, name in self.slots]
        return self.region.compiled(tensors, args, kwargs)


class _Regions:
    """Regions by (class, structure), made on first use, and each instance's binding."""

    def __init__(self, compile_kwargs: dict[str, Any], forward=None):
        self.compile_kwargs = compile_kwargs
        self.forward = forward
        self.regions: dict[tuple, _Region] = {}
        self.bindings: weakref.WeakKeyDictionary[nn.Module, _Binding] = \
            weakref.WeakKeyDictionary()

    def region_for(self, instance: nn.Module) -> _Region:
        key = (type(instance), _structure(instance))
        region = self.regions.get(key)
        if region is None:
            region = self.regions[key] = _Region(instance, self.compile_kwargs, self.forward)
        return region

    def binding_for(self, instance: nn.Module) -> _Binding:
        binding = self.bindings.get(instance)
        if binding is None:
            binding = self.bindings[instance] = _Binding(self, instance)
        return binding


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
        block.forward = regions.binding_for(block)
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
        return regions.binding_for(self)(*args, **kwargs)

    functools.update_wrapper(forward, original)
    cls.forward = forward
    return cls
