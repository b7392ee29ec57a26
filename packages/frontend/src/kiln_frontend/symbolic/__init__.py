"""The symbolic interpreter: bytecode -> FX graph, with variable trackers.

* ``translator``: ``InstructionTranslator`` (the frame) and ``InliningInstructionTranslator``
  (called user functions);
* ``handlers/``: one module per opcode family, registered with ``registry.handler``;
* ``variables/``: the trackers, registered with ``variables.tracker_for``;
* ``output_graph``: the FX graph, its inputs, guards and the backend call;
* ``codegen``: bytecode that rebuilds tracked values in the transformed code.
"""

from . import handlers  # noqa: F401  (registers the opcode handlers)
from .output_graph import OutputGraph
from .registry import handler, lookup
from .translator import (
    InliningInstructionTranslator,
    InstructionTranslator,
    InstructionTranslatorBase,
    RestartAnalysis,
)

__all__ = [
    "InstructionTranslator",
    "InstructionTranslatorBase",
    "InliningInstructionTranslator",
    "OutputGraph",
    "RestartAnalysis",
    "handler",
    "lookup",
]
