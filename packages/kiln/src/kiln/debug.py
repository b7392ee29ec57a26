"""``KILN_COMPILE_DEBUG=1``: one folder per compiled graph.

    <KILN_DEBUG_DIR or ./kiln_debug>/run_<date>_<time>_pid<pid>/graph_<n>/
        fx_graph.txt         the torch-level graph the backend received
        aten_graph.txt       the ATen graph from kiln_aotgrad.trace_inference
        ir_pre_fusion.txt    print(loop graph) from kiln_loopir.lower
        ir_post_fusion.txt   print(schedule) from kiln_loopir.schedule
        output_code.py       wrapper + kernels; ``python output_code.py`` runs it on random
                             inputs (constants.pt beside it holds the graph's tensors)

The run folder's path is printed (stderr) once per process.
"""

from __future__ import annotations

import datetime
import importlib
import itertools
import logging
import os
import sys
import threading
import types
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("kiln")

__all__ = ["DebugTrace", "NO_TRACE"]

_lock = threading.Lock()
_run_dir: Path | None = None
_graph_ids = itertools.count()


class DebugTrace:
    """Writes one compile's artifacts; the disabled trace (``NO_TRACE``) writes nothing."""

    def __init__(self, folder: Path | None):
        self.folder = folder

    @classmethod
    def for_compile(cls, config) -> DebugTrace:
        if not config.debug_enabled:
            return NO_TRACE
        global _run_dir
        with _lock:
            if _run_dir is None:
                stamp = datetime.datetime.now().strftime("%Y%m%d_%H%M%S")
                _run_dir = Path(config.debug_root).resolve() / f"run_{stamp}_pid{os.getpid()}"
                _run_dir.mkdir(parents=True, exist_ok=True)
                print(f"kiln: compile debug output in {_run_dir}", file=sys.stderr)
            folder = _run_dir / f"graph_{next(_graph_ids)}"
        folder.mkdir(parents=True, exist_ok=True)
        return cls(folder)

    def __bool__(self) -> bool:
        return self.folder is not None

    def write(self, name: str, obj: Any) -> None:
        """Write ``obj`` as text: a GraphModule as its readable code, anything else as str()."""
        if self.folder is None:
            return
        if isinstance(obj, torch.fx.GraphModule):
            text = obj.print_readable(print_output=False)
            text += "\n\n# ---- graph ----\n" + str(obj.graph)
        else:
            text = str(obj)
        (self.folder / name).write_text(text if text.endswith("\n") else text + "\n")

    def write_output_code(self, module: Any, compiled: Any, aten_gm: Any) -> None:
        if self.folder is None:
            return
        try:
            text, constants = _output_code(module, compiled, aten_gm)
            if constants:
                torch.save(constants, self.folder / "constants.pt")
        except Exception as e:  # a debug aid must never break a compile
            log.warning("kiln: could not write output_code.py: %s", e)
            text = f"# kiln could not render output_code.py: {e!r}\n"
            text += "\n# wrapper source:\n" + _commented(getattr(module, "wrapper_source", ""))
        (self.folder / "output_code.py").write_text(text)


NO_TRACE = DebugTrace(None)


def _commented(text: str) -> str:
    return "".join(f"# {line}\n" for line in text.splitlines())


def _importable(obj: Any) -> tuple[str, str] | None:
    """(module to import, attribute path) that gives back ``obj``, if any: a module's dotted
    name or an object's ``__module__``/``__qualname__``, resolved by importing the longest
    importable prefix (``torch.ops.aten`` is ``import torch`` + ``.ops.aten``)."""
    if isinstance(obj, types.ModuleType):
        dotted = obj.__name__
    else:
        module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if not module or not qualname or "<" in qualname:
            return None
        dotted = f"{module}.{qualname}"
    atoms = dotted.split(".")
    for cut in range(len(atoms), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(atoms[:cut]))
        except Exception:
            continue
        try:
            for atom in atoms[cut:]:
                found = getattr(found, atom)
        except AttributeError:
            return None
        return (".".join(atoms[:cut]), ".".join(atoms[cut:])) if found is obj else None
    return None


def _namespace_of(compiled: Any) -> dict:
    call = getattr(compiled, "call", compiled)
    return dict(getattr(call, "__globals__", {}) or {})


def _input_specs(aten_gm) -> list:
    """(dtype, size, stride, device) of each placeholder, sizes from the symbols' hints."""
    specs = []
    for node in aten_gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            size = [_hint(s) for s in val.shape]
            stride = [_hint(s) for s in val.stride()]
            specs.append(("tensor", str(val.dtype), size, stride, str(val.device)))
        elif isinstance(val, torch.SymInt | int):
            specs.append(("int", _hint(val)))
        else:
            specs.append(("const", repr(val)))
    return specs


def _hint(s) -> int:
    if isinstance(s, torch.SymInt):
        return int(s.node.hint) if s.node.hint is not None else 8
    return int(s)


_TEMPLATE = '''\
"""output_code.py: the code kiln generated for one graph (KILN_COMPILE_DEBUG).

Run it alone: ``python output_code.py`` rebuilds the kernels with codegen {codegen!r}, loads
constants.pt (the graph's tensors) and calls the wrapper on random inputs.
"""
import os
import torch

CODEGEN = {codegen!r}
INPUTS = {inputs!r}

# ---- kernels ({nkernels}) ----
{kernels}

def _namespace():
    from kiln.backend import codegen_by_name
    from kiln_loopir.codegen_protocol import KernelDef
    ns = {{}}
{imports}
    here = os.path.dirname(os.path.abspath(__file__))
    if os.path.exists(os.path.join(here, "constants.pt")):
        ns.update(torch.load(os.path.join(here, "constants.pt"), weights_only=False))
    kernels = [KernelDef(name, source, list(arg_names), meta=dict(meta))
               for name, source, arg_names, meta in KERNELS]
    if kernels:
        ns.update(codegen_by_name(CODEGEN).finalize(kernels))
    return ns


globals().update(_namespace())

# ---- wrapper ----
{wrapper}

def _random_inputs():
    args = []
    for spec in INPUTS:
        if spec[0] == "tensor":
            _, dtype, size, stride, device = spec
            dtype = getattr(torch, dtype.split(".")[-1])
            t = torch.empty_strided(size, stride, dtype=dtype, device=device)
            if dtype.is_floating_point:
                t.normal_()
            elif dtype == torch.bool:
                t.copy_(torch.rand(size) > 0.5)
            else:
                t.copy_(torch.randint(0, 4, size))
            args.append(t)
        elif spec[0] == "int":
            args.append(spec[1])
        else:
            args.append(eval(spec[1]))
    return args


if __name__ == "__main__":
    outputs = {entry}(_random_inputs())
    for i, out in enumerate(outputs):
        print(i, tuple(out.shape), out.dtype, out.device)
'''


def _output_code(module: Any, compiled: Any, aten_gm: Any) -> tuple[str, dict]:
    wrapper = getattr(module, "wrapper_source", None) or getattr(module, "source", "")
    kernels = list(getattr(module, "kernels", []) or [])
    kernel_names = {k.name for k in kernels}
    namespace = _namespace_of(compiled)
    imports, constants = [], {}
    entry = getattr(module, "entry", "call")
    for name, value in sorted(namespace.items()):
        if name.startswith("__") or name in kernel_names or name == entry:
            continue
        code = getattr(value, "__code__", None)
        if code is not None and code.co_filename.startswith("<kiln-wrapper"):
            continue  # defined by the wrapper source itself
        if isinstance(value, torch.Tensor):
            constants[name] = value.detach().cpu() if value.device.type == "meta" else value
            continue
        where = _importable(value)
        if where is None:
            if not isinstance(value, int | float | str | bool | type(None)):
                imports.append(f"    # not reproducible here: {name} ({type(value).__name__})")
            else:
                imports.append(f"    ns[{name!r}] = {value!r}")
            continue
        mod, path = where
        if f"    import {mod}" not in imports:
            imports.append(f"    import {mod}")
        imports.append(f"    ns[{name!r}] = {mod}{'.' + path if path else ''}")
    kernel_tuples = [
        (k.name, k.source, list(k.arg_names), _plain(getattr(k, "meta", {}) or {})) for k in kernels
    ]
    kernel_text = "KERNELS = [\n"
    for name, source, arg_names, meta in kernel_tuples:
        kernel_text += f"    ({name!r}, {_source_literal(source)}, {arg_names!r}, {meta!r}),\n"
    kernel_text += "]\n"
    text = _TEMPLATE.format(
        codegen=getattr(module, "codegen", "") or "cpp",
        inputs=_input_specs(aten_gm),
        nkernels=len(kernels),
        kernels=kernel_text,
        imports="\n".join(imports) or "    pass",
        wrapper=wrapper,
        entry=entry,
    )
    return text, constants


def _source_literal(source: str) -> str:
    if "'''" not in source and not source.endswith("\\"):
        return "r'''" + source + "'''" if "\\" in source else "'''" + source + "'''"
    return repr(source)


def _plain(meta: dict) -> dict:
    """The repr-able part of a kernel's meta (what output_code.py can carry)."""
    out = {}
    for k, v in meta.items():
        if isinstance(v, int | float | str | bool | type(None) | tuple | list):
            try:
                if eval(repr(v)) == v:  # noqa: S307 - our own literal
                    out[k] = v
            except Exception:
                pass
    return out
