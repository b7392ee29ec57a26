"""Test-only workaround: make PyPI's torchvision importable beside the CPU build of torch.

PyPI's torchvision wheel links its `_C` extension against torch's CUDA libraries, which the CPU
build of torch 2.13 lacks. `_C` then fails to load, and `torchvision/_meta_registrations.py`
registers fake kernels for `torchvision::nms` / `torchvision::qnms` on operators that were never
defined ("operator torchvision::nms does not exist"), so `import torchvision` (and with it
`import timm`) fails. Defining the two schemas first lets torchvision import; its C ops stay
unavailable, which no model we test needs. Product code never does this (docs/testing.md).
"""

from __future__ import annotations

import glob
import importlib.util
import os

import torch

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_library = None


def _torchvision_ops_load() -> bool:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return True  # not installed: nothing to fix
    folder = list(spec.submodule_search_locations)[0]
    for so in glob.glob(os.path.join(folder, "_C*.so")):
        try:
            torch.ops.load_library(so)
            return True
        except OSError:
            return False
    return False


def install() -> bool:
    """Define the missing schemas when torchvision's C ops cannot load; True if it did."""
    global _library
    if _library is not None or _torchvision_ops_load():
        return False
    _library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS.values():
        _library.define(schema)
    return True
