"""The exceptions that make the translator trace a frame again from its start, each with what
to do differently: a graph break at an instruction, a refused shortcut, a ``requires_grad_()``
that ends the graph. Their own module: variable trackers that observe a shortcut raise them,
and importing the translator from there would close an import cycle."""

from __future__ import annotations

from ..exc import Unsupported

__all__ = ["RefusalRestart", "RequiresGradRestart", "RestartAnalysis"]


class RestartAnalysis(Exception):
    """Trace the frame again from the start and graph-break at instruction ``index``."""

    def __init__(self, index: int, reason: Unsupported):
        super().__init__(str(reason))
        self.index = index
        self.reason = reason


class RefusalRestart(RestartAnalysis):
    """Trace the frame again refusing ``feature`` (it breaks the graph where it is used):
    a shortcut it took was observed later (``OutputGraph.refused``)."""

    def __init__(self, feature: str, reason: Unsupported):
        super().__init__(-1, reason)
        self.feature = feature


class RequiresGradRestart(RestartAnalysis):
    """Trace the frame again with ``requires_grad_()`` of an intermediate breaking the
    graph (``OutputGraph.leaks_requires_grad``); it has no instruction of its own."""

    def __init__(self, reason: Unsupported):
        super().__init__(-1, reason)
