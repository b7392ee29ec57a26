"""Counters of what loopir did (read with ``kiln_loopir.counters``; reset with ``.clear()``).

Keys:
  ``graphs_lowered``      graphs lowered by ``lower``
  ``buffers``             ComputedBuffers created by lowering
  ``externs``             ExternKernels created (matmul, conv, ... and fallbacks)
  ``fused_groups``        FusedGroups produced by ``schedule``
  ``nodes``               SchedNodes placed into groups by ``schedule``
  ``fusions``             SchedNodes that joined an existing group
  ``groups_reordered``    pointwise groups whose loops were re-ordered by the stores that
                          reach memory (their first node's buffer ended in registers)
  ``reused_buffers``      allocations that reuse a freed buffer (memory plan)
  ``in_place_buffers``    allocations that write over a buffer their step reads last
                          (memory plan, ``Allocation.in_place``)
  ``aten_fallbacks``      a Counter {op name: count} of ops lowered as the aten fallback
"""

from __future__ import annotations

from collections import Counter


class LoopirCounters(dict):
    KEYS = ("graphs_lowered", "buffers", "externs", "fused_groups", "nodes", "fusions",
            "groups_reordered", "reused_buffers", "in_place_buffers")

    def __init__(self):
        super().__init__()
        self.clear()

    def clear(self) -> None:
        super().clear()
        for k in self.KEYS:
            self[k] = 0
        self["aten_fallbacks"] = Counter()

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def snapshot(self) -> dict:
        d = dict(self)
        d["aten_fallbacks"] = dict(self["aten_fallbacks"])
        return d


counters = LoopirCounters()
