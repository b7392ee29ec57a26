"""``KILN_COMPILE_DEBUG=1``: one folder per compiled graph.

    <KILN_DEBUG_DIR or ./kiln_debug>/run_<date>_<time>_pid<pid>/graph_<n>/
        fx_graph.txt         the torch-level graph the backend received
        aten_graph.txt       the ATen graph from kiln_aotgrad.trace_inference
        ir_pre_fusion.txt    print(loop graph) from kiln_loopir.lower
        ir_post_fusion.txt   print(schedule) from kiln_loopir.schedule
        output_code.py       wrapper + kernels (kiln_loopir.wrapper.output_code, the one
                             generator); ``python output_code.py`` runs it on random inputs
                             (constants.pt beside it holds the graph's tensors)

The run folder's path is printed (stderr) once per process.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import os
import sys
import threading
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

    def write_output_code(self, module: Any, compiled: Any = None, aten_gm: Any = None) -> None:
        """``output_code.py``: loopir's one standalone generator (``module.meta["output_code"]``:
        wrapper, kernels rebuilt through the codegen, a benchmark on random inputs) and the
        graph's tensors as ``constants.pt`` beside it."""
        if self.folder is None:
            return
        text = (getattr(module, "meta", None) or {}).get("output_code")
        if text is None:
            text = "# this module has no standalone output_code.py; its wrapper:\n"
            text += _commented(getattr(module, "wrapper_source", ""))
        try:
            constants = dict(getattr(module, "constants", {}) or {})
            saved = {k: v.detach() for k, v in constants.items() if _has_storage(v)}
            if saved:  # not derived opaque ones (a packed weight): output_code.py derives them
                torch.save(saved, self.folder / "constants.pt")
        except Exception as e:  # a debug aid must never break a compile
            log.warning("kiln: could not write constants.pt: %s", e)
        (self.folder / "output_code.py").write_text(text)


def _has_storage(t) -> bool:
    """A tensor torch.save can write (an opaque one, MKL's packed weight, has no storage)."""
    if not isinstance(t, torch.Tensor):
        return True
    try:
        t.untyped_storage()
    except (NotImplementedError, RuntimeError):
        return False
    return True


NO_TRACE = DebugTrace(None)


def _commented(text: str) -> str:
    return "".join(f"# {line}\n" for line in text.splitlines())
