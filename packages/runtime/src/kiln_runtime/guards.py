"""Guards for compiled graphs holding weights as constants, or constants computed from them.

A compiled graph binds each weight it reads as a graph constant: an alias of the weight's
memory taken at compile time (the code reads that memory, so an in-place write is seen), or a
constant computed from it (a BatchNorm folded into a conv, a weight stored channels-last or
packed for MKL's GEMM: an in-place write is *not* seen). Neither sees a weight given new memory
without an in-place write: ``p.data = other``, ``p.set_(other)``, ``torch.utils.swap_tensors``,
``vector_to_parameters``, a module's ``half()``/``to()`` when it swaps tensors. Such a graph
would compute with the old values. ``WeightsGuard`` keeps it honest: it compiles again when
a weight it guards has new memory or metadata, when one its constants were computed from was
written in place, or when a module of theirs switched to or from training.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable

import torch

from . import data_aliases

log = logging.getLogger("kiln")

__all__ = ["WeightsGuard"]

_VERSION = operator.attrgetter("_version")
_TRAINING = operator.attrgetter("training")
_DTYPE = operator.attrgetter("dtype")
#: ``a.is_set_to(b)``: same storage, storage offset, sizes and strides (one C call)
_IS_SET_TO = torch.Tensor.is_set_to
#: ``.data`` takes from guarded weights move its ``epoch``
_ALIASES = data_aliases.STATE


def _snapshot(t: torch.Tensor) -> torch.Tensor:
    """An alias of ``t``'s memory and view now (it also keeps that storage alive: no later
    storage can take its address while the guard compares against it)."""
    return t.detach()


class WeightsGuard:
    """A compiled graph that reads weights as constants is valid while they are what it was
    compiled from. It guards two lists of tensors (the live objects a user holds: a parameter,
    a buffer):

    - ``tensors``: weights constants were *computed* from (layout copies, MKL-packed weights,
      folded BatchNorms: their sources; a hit's stored tensors kept under the weights' hash:
      every weight): their memory and view, their dtype and their version counters, so an
      in-place write (``load_state_dict``, an optimizer step, ``p.mul_(0.5)`` under
      ``no_grad``) compiles again;
    - ``views``: weights the compiled code reads in place (a constant aliasing the weight's
      memory): their memory and view and dtype only; an in-place write is seen by the code
      and needs nothing.

    "Memory and view" is ``Tensor.is_set_to`` against an alias taken at guard time: the same
    storage (so the same device and data pointer), storage offset, sizes and strides. A change
    of either (``p.data = other``, ``p.set_(other)``, ``swap_tensors``, a dtype or device
    move of the module that keeps the parameter objects), or a module in ``modules`` switched
    to or from training, makes the next call compile again (``compile_fn``; the pipeline
    guards its own result), with one log line. kiln's pipeline (``compile_inference``), a
    graph-cache hit and the codegens' ``compile_fx`` use it.

    The check runs at every call as a few C-level passes, no Python frame per tensor: the sum
    of the version counters (each only grows, so the sum is unchanged iff every counter is),
    ``is_set_to`` against the aliases (stops at the first mismatch), the dtypes and the
    modules' ``training`` flags."""

    def __init__(self, fn: Callable, compile_fn: Callable[[], Callable], tensors, modules=(), *,
                 version_sum: int | None = None, views=()):
        self.fn = fn
        self.compile_fn = compile_fn
        self.tensors: list | None = list(tensors)
        self.modules = list(modules)
        seen = {id(t) for t in self.tensors}
        self.views = [t for t in views if id(t) not in seen and not seen.add(id(t))]
        #: the versions the constants were computed at (default: the tensors' versions now)
        self.version_sum = sum(map(_VERSION, self.tensors)) if version_sum is None else version_sum
        # aliases of those weights with version counters of their own (``w = p.data``): a
        # write through one moves only its counter, so it joins the sum
        readers = data_aliases.watch(self.tensors)
        self.version_sum += sum(map(_VERSION, readers))
        self._counted = self.tensors + readers  # every version counter summed
        self._epoch = data_aliases.STATE.epoch
        self._takes = data_aliases.takes(self.tensors)  # (the readers share their memory)
        self.training = list(map(_TRAINING, self.modules))
        self._guarded = self.tensors + self.views  # every tensor whose memory is checked
        self._aliases = list(map(_snapshot, self._guarded))
        self._dtypes = list(map(_DTYPE, self._guarded))

    @classmethod
    def around(cls, fn: Callable, compile_fn: Callable[[], Callable], tensors, modules=(), *,
               version_sum: int | None = None, views=()) -> Callable:
        """``fn`` behind a guard over ``tensors`` and ``views`` (and ``modules``' flags), or
        ``fn`` itself when it reads no weight and computed no constant from one."""
        tensors, views = list(tensors), list(views)
        if not tensors and not views:
            return fn
        return cls(fn, compile_fn, tensors, modules, version_sum=version_sum, views=views)

    @property
    def compiled(self) -> Callable:
        """What it runs now (wrappers are followed down to the graph by ``.compiled``)."""
        return self.fn

    @property
    def module(self):
        """The generated module of what it runs now (its wrapper, kernels and schedule)."""
        return self.fn.module

    def __repr__(self) -> str:
        state = "recompiled" if self.tensors is None else \
            f"{len(self.tensors)} tensors, {len(self.views)} views, {len(self.modules)} modules"
        return f"<kiln weights guard: {state}>"

    def changed(self) -> str | None:
        """Why the compiled graph is stale now (None while it is valid)."""
        if self.tensors is None:
            return None
        if sum(map(_VERSION, self._counted)) != self.version_sum:
            return "a weight that constants were computed from (folded, copied or packed) " \
                   "was written in place"
        if data_aliases.takes(self.tensors) != self._takes:
            return "a weight that constants were computed from had its .data taken (a write " \
                   "through it moves no version counter)"
        if not all(map(_IS_SET_TO, self._guarded, self._aliases)) \
                or list(map(_DTYPE, self._guarded)) != self._dtypes:
            return "a weight the graph reads has new memory, shape, strides or dtype " \
                   "(p.data = ..., p.set_(...), swap_tensors, a module moved)"
        if list(map(_TRAINING, self.modules)) != self.training:
            return "a module of a folded weight switched to or from training"
        return None

    def __call__(self, *args):
        if self.tensors is not None and (
            sum(map(_VERSION, self._counted)) != self.version_sum
            or (_ALIASES.epoch != self._epoch and self._taken_from())
            or not all(map(_IS_SET_TO, self._guarded, self._aliases))
            or list(map(_DTYPE, self._guarded)) != self._dtypes
            or list(map(_TRAINING, self.modules)) != self.training
        ):
            log.info("kiln: %s since compile: compiling again", self.changed())
            self._become(self.compile_fn())
        return self.fn(*args)

    def _become(self, fn: Callable) -> None:
        """Run ``fn`` from now on: take over its guard's state when it has one (a compile
        guards its own result; adopting it keeps one guard per graph however often the
        weights change, not a chain), else stop guarding."""
        if type(fn) is WeightsGuard:
            self.__dict__.update(fn.__dict__)
            return
        self.fn = fn
        self.tensors = self.views = self._guarded = self._aliases = None
        self._counted = None

    def _taken_from(self) -> bool:
        """Whether ``.data`` was taken from a weight it guards (another tensor's take only
        moves the epoch it compares against)."""
        if data_aliases.takes(self.tensors) != self._takes:
            return True
        self._epoch = data_aliases.STATE.epoch
        return False
