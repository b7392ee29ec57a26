"""Guards for compiled graphs holding constants computed from weights at compile time.

A constant made from a weight (a BatchNorm folded into a conv, a weight stored channels-last
or packed for MKL's GEMM) does not see a later in-place write to that weight
(``load_state_dict``, an optimizer step, ``p.mul_(0.5)`` under ``no_grad``). ``WeightsGuard``
keeps such a graph honest: it compiles again when one of those weights was written.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable

log = logging.getLogger("kiln")

__all__ = ["WeightsGuard"]

_VERSION = operator.attrgetter("_version")
_TRAINING = operator.attrgetter("training")


class WeightsGuard:
    """A compiled graph whose constants were computed from weights (layout copies, folded
    BatchNorms: their sources; a hit's stored tensors kept under the weights' hash: every
    weight) is valid while they are: an in-place write to one of them (``load_state_dict``, an
    optimizer step) or a module of theirs switched to or from training makes the next call
    compile again (``compile_fn``; the pipeline guards its own result), with one log line.
    kiln's pipeline (``compile_inference``), a graph-cache hit and the codegens' ``compile_fx``
    use it.

    The check is two C-level passes: the sum of the tensors' version counters (each counter
    only grows, so the sum is unchanged iff every counter is) and the modules' ``training``
    flags, no Python frame per tensor."""

    def __init__(self, fn: Callable, compile_fn: Callable[[], Callable], tensors, modules, *,
                 version_sum: int | None = None):
        self.fn = fn
        self.compile_fn = compile_fn
        self.tensors: list | None = list(tensors)
        self.modules = list(modules)
        #: the versions the constants were computed at (default: the tensors' versions now)
        self.version_sum = sum(map(_VERSION, self.tensors)) if version_sum is None else version_sum
        self.training = list(map(_TRAINING, self.modules))

    @classmethod
    def around(cls, fn: Callable, compile_fn: Callable[[], Callable], tensors, modules=(), *,
               version_sum: int | None = None) -> Callable:
        """``fn`` behind a guard over ``tensors`` (and ``modules``' flags), or ``fn`` itself
        when no constant was computed from a tensor."""
        tensors = list(tensors)
        return cls(fn, compile_fn, tensors, modules, version_sum=version_sum) if tensors else fn

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
            f"{len(self.tensors)} tensors, {len(self.modules)} modules"
        return f"<kiln weights guard: {state}>"

    def __call__(self, *args):
        if self.tensors is not None and (
            sum(map(_VERSION, self.tensors)) != self.version_sum
            or list(map(_TRAINING, self.modules)) != self.training
        ):
            log.info("kiln: weights that constants were computed from (folded, copied or packed) "
                     "changed since compile, or a module of theirs left its mode: compiling again")
            self.fn, self.tensors = self.compile_fn(), None
        return self.fn(*args)
