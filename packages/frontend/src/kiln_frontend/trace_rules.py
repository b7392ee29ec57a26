"""What the symbolic interpreter does with a Python function that torch itself defines.

A call met while tracing is one of three things (``Rule``):

- ``INLINE``: its bytecode is traced into the caller's graph (user code; the methods of
  ``torch.nn.modules``; small torch helpers that models call, e.g. the mask helpers of
  ``torch.nn.functional`` used by ``nn.MultiheadAttention``);
- ``GRAPH``: it becomes one ``call_function`` node (public ``torch.*`` functions, and the
  private kernels listed here, e.g. ``torch._transformer_encoder_layer_fwd``);
- ``SKIP``: a graph break; the call runs in Python (every other function in torch's files);
- ``CONSTANT``: called while tracing and folded (``torch.distributed.is_available()``).

The decision is looked up, most specific first, in two tables: ``FUNCTION_RULES`` (one
function, by its dotted import path) and ``MODULE_RULES`` (every function whose code lives in
a module, by the module's dotted name derived from the file, longest prefix wins).  Code
outside torch's files is user code and always inlined.  Both tables refuse duplicates;
``register_function`` / ``register_module`` add to them (issue 10 widens them).

Paths in ``FUNCTION_RULES`` are resolved lazily (``torch.nn.functional._canonical_mask``);
one this torch does not have is ignored and listed by ``unresolved()``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import os
import types
from typing import Any

__all__ = [
    "FUNCTION_RULES",
    "MODULE_RULES",
    "TORCH_COMPILER",
    "TORCH_COMPILER_SOURCES",
    "Decision",
    "Rule",
    "captures_frames_of",
    "in_torch_compiler",
    "lookup",
    "register_function",
    "register_module",
    "runs_torch_compiler",
    "torch_module_of_file",
    "unresolved",
]


class Rule(enum.Enum):
    INLINE = "inline"
    GRAPH = "graph"
    SKIP = "skip"
    #: called while tracing, on constants only; its result is a constant of the graph
    #: (process-wide predicates such as ``torch.distributed.is_available()``)
    CONSTANT = "constant"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Decision:
    """A rule and why it applies (the why is what a graph break or the debug log says)."""

    rule: Rule
    why: str
    #: an INLINE module whose own frames are captured too when Python runs them (after a
    #: graph break inside them, their code runs as frames the hook sees)
    captures_frames: bool = False

    def __str__(self) -> str:
        return f"{self.rule}: {self.why}"


#: dotted import path of one function -> decision
FUNCTION_RULES: dict[str, Decision] = {}
#: dotted module name (``torch.nn.modules``) -> decision for functions whose code lives there
MODULE_RULES: dict[str, Decision] = {}

#: id(function) -> (function, decision); the function is kept so its id stays valid
_resolved: dict[int, tuple[Any, Decision]] = {}
_unresolved: list[str] = []


def register_function(path: str, rule: Rule, why: str) -> None:
    """Decide ``rule`` for the function at the import path ``path``; refuses duplicates."""
    if path in FUNCTION_RULES:
        raise ValueError(f"trace rule for function {path!r} already registered: "
                         f"{FUNCTION_RULES[path]}")
    FUNCTION_RULES[path] = Decision(rule, why)
    _resolved.clear()


def register_module(name: str, rule: Rule, why: str, *, captures_frames: bool = False) -> None:
    """Decide ``rule`` for every function whose code lives in module ``name`` (or below);
    ``captures_frames``: the frame hook captures that code's frames too (INLINE only)."""
    if name in MODULE_RULES:
        raise ValueError(f"trace rule for module {name!r} already registered: "
                         f"{MODULE_RULES[name]}")
    if captures_frames and rule is not Rule.INLINE:
        raise ValueError(f"captures_frames needs an INLINE rule, not {rule} ({name!r})")
    MODULE_RULES[name] = Decision(rule, why, captures_frames)


# -- the tables ---------------------------------------------------------------------------

register_module("torch", Rule.SKIP, "torch internals are not inlined")
register_module("torch.nn.modules", Rule.INLINE,
                "methods of torch.nn modules are plain tensor code")

for _path in ("torch.nn.functional._canonical_mask", "torch.nn.functional._none_or_dtype",
              "torch.nn.functional._mha_shape_check", "torch.nn.functional._in_projection_packed",
              "torch.nn.functional._in_projection", "torch.backends.mha.get_fastpath_enabled"):
    register_function(_path, Rule.INLINE,
                      "a torch helper of nn.MultiheadAttention / nn.TransformerEncoderLayer")
for _path in ("torch._transformer_encoder_layer_fwd", "torch._native_multi_head_attention"):
    register_function(_path, Rule.GRAPH,
                      "a fused kernel of nn.TransformerEncoderLayer / nn.MultiheadAttention")

# Torch's own Python code that is plain tensor code: inlined, as TorchDynamo does (issue 10).
register_module("torch.masked", Rule.INLINE,
                "torch.masked reductions and normalizations are plain tensor code", captures_frames=True)
register_module("torch.signal", Rule.INLINE, "torch.signal.windows are plain tensor code", captures_frames=True)
register_module("torch.testing._internal", Rule.INLINE,
                "OpInfo sample functions and test helpers are plain tensor code", captures_frames=True)
register_module("torch.func", Rule.INLINE, "torch.func.functional_call swaps module state")
register_module("torch._functorch.functional_call", Rule.INLINE,
                "the implementation of torch.func.functional_call")
# ... with a skip list: modules under an inlined prefix that leave tensor code
register_module("torch.testing._internal.common_utils", Rule.SKIP,
                "test-suite machinery (environment, subprocesses, seeds)")
register_module("torch.masked.maskedtensor", Rule.SKIP,
                "MaskedTensor is a tensor subclass, not plain tensor code")

# tensor parallel's hooks (distribute_module's lambdas, the ParallelStyles' prepare functions):
# their DTensor calls are graph nodes (symbolic/variables/distributed.py)
register_module("torch.distributed.tensor._api", Rule.INLINE,
                "distribute_module's forward hooks call the ParallelStyle's functions")
register_module("torch.distributed.tensor.parallel.style", Rule.INLINE,
                "a ParallelStyle's hooks make and redistribute DTensors (graph nodes)")

for _path in ("torch.nn.functional.triplet_margin_with_distance_loss",
              "torch.nn.functional.threshold"):
    register_function(_path, Rule.INLINE,
                      "a torch.nn.functional helper that calls user code or a kernel by name")
for _path in ("torch.distributed.is_available", "torch.fx._symbolic_trace.is_fx_tracing",
              "torch.fx._symbolic_trace.is_fx_symbolic_tracing", "torch.compiler.is_compiling",
              "torch.compiler.is_dynamo_compiling", "torch.compiler.is_exporting",
              "torch.cuda.is_available", "torch.backends.mps.is_available"):
    register_function(_path, Rule.CONSTANT,
                      "a predicate of the process, fixed while compiled code runs")
register_function("torch._check", Rule.GRAPH,
                  "folded when its condition is known (symbolic/variables/ctx_managers.py)")
# Tensor's reflected operators are Python wrappers (``try: ... except TypeError: return
# NotImplemented``) around one kernel: one graph node each
for _name in ("__rsub__", "__rdiv__", "__rtruediv__", "__rpow__", "__rmatmul__", "__rmod__",
              "__rfloordiv__", "__rlshift__", "__rrshift__"):
    register_function(f"torch.Tensor.{_name}", Rule.GRAPH,
                      "a reflected operator of Tensor: one kernel behind a Python wrapper")
del _path, _name


#: torch's own compiler (TorchDynamo, Inductor, AOTAutograd, export), as places in torch's
#: source tree (folders or files below the torch package, one tuple of path parts each).
#: kiln never imports any of it: a frame's file (``torch_module_of_file``) or a generated
#: function's module name is compared with these places. Its frames and every frame they
#: call run as plain Python, never seen by kiln (the C hook's SKIP_TREE), and a
#: ``torch.compile``'d callee runs as torch compiled it. Tracing it would trace torch's
#: compiler compiling (its dataclasses, sources, guards, shape env...): minutes of work and
#: internal errors, for code that is no user's.
TORCH_COMPILER_SOURCES: tuple[tuple[str, ...], ...] = (
    ("_dynamo",),
    ("_inductor",),
    ("_functorch", "aot_autograd"),
    ("_functorch", "_aot_autograd"),
    ("_functorch", "partitioners"),
    ("_functorch", "compilers"),
    ("export",),
    ("_export",),
)

#: the decision for code in those places
TORCH_COMPILER = Decision(Rule.SKIP, "torch's own compiler: a torch.compile'd function runs "
                                     "as torch compiled it, in Python")


def in_torch_compiler(module: str | None) -> bool:
    """Whether ``module`` (a dotted module name) lives in one of ``TORCH_COMPILER_SOURCES``."""
    if not module:
        return False
    package, *parts = module.split(".")
    return package == "torch" and any(tuple(parts[:len(place)]) == place
                                      for place in TORCH_COMPILER_SOURCES)


def runs_torch_compiler(filename: str) -> bool:
    """Whether code in ``filename`` is torch's own compiler (``TORCH_COMPILER_SOURCES``)."""
    return in_torch_compiler(torch_module_of_file(filename))


# -- lookup -------------------------------------------------------------------------------

def _resolve(path: str) -> Any:
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _function_table() -> dict[int, tuple[Any, Decision]]:
    if not _resolved:
        _unresolved.clear()
        for path, decision in FUNCTION_RULES.items():
            fn = _resolve(path)
            if fn is None:
                _unresolved.append(path)
                continue
            _resolved[id(fn)] = (fn, decision)
    return _resolved


def unresolved() -> list[str]:
    """Paths in ``FUNCTION_RULES`` this torch does not have."""
    _function_table()
    return list(_unresolved)


@functools.lru_cache(maxsize=4096)
def torch_module_of_file(filename: str) -> str | None:
    """``torch.nn.modules.linear`` for ``.../torch/nn/modules/linear.py``; None outside torch."""
    import torch

    torch_dir = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
    real = os.path.realpath(filename)
    if not real.startswith(torch_dir):
        return None
    rel = os.path.splitext(real[len(torch_dir):])[0].replace(os.sep, ".")
    if rel == "__init__":
        return "torch"
    return "torch." + rel.removesuffix(".__init__")


def _module_decision(module: str) -> Decision | None:
    if in_torch_compiler(module):
        return TORCH_COMPILER
    name = module
    while True:
        decision = MODULE_RULES.get(name)
        if decision is not None:
            return decision
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]


def captures_frames_of(filename: str) -> bool:
    """Whether frames of code in ``filename`` (a torch file) are captured although torch's
    files are skipped: its module is inlined with ``captures_frames``."""
    module = torch_module_of_file(filename)
    if module is None:
        return False
    decision = _module_decision(module)
    return decision is not None and decision.captures_frames


def lookup(fn: Any) -> Decision | None:
    """The decision for ``fn``: its own entry, else its module's; None when no rule names it
    (user code, or a callable that is not a Python function)."""
    hit = _function_table().get(id(fn))
    if hit is not None and hit[0] is fn:
        return hit[1]
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return None
    module = torch_module_of_file(code.co_filename)
    if module is None:
        return None
    return _module_decision(module)
