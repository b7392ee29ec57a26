"""Which codegen compiles a graph: by name or by device (the entry-point group
``kiln.codegens``, ``kiln_loopir.codegen_registry``), built from ``kiln.Options``; how random
ops lower for it; starting its slow resources early; what the registered codegens declare
about their toolchains and devices.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from kiln_loopir import codegen_registry

from .options import Options

log = logging.getLogger("kiln")

__all__ = [
    "codegen_by_name",
    "codegen_packages",
    "codegen_entry_for_device",
    "codegen_for_device",
    "prepare_codegen",
    "random_policy",
    "synchronize_of",
    "toolchains",
]


def codegen_by_name(name: str, config: Options | None = None):
    """A fresh codegen instance, built by the codegen registered as ``name`` in the entry-point
    group ``kiln.codegens`` (kiln_loopir.codegen_registry). An unknown name raises ValueError
    listing the known ones; a declared codegen that cannot load raises CodegenUnavailable."""
    return codegen_registry.get_codegen(name).build(config if config is not None else Options())


def synchronize_of(name: str):
    """The device wait codegen ``name`` declares (the profiler's clock), or None."""
    return codegen_registry.get_codegen(name).synchronize


def toolchains() -> dict[str, str]:
    """Each loadable codegen's toolchain text (compiler, Triton versions) by codegen name, for
    cache keys; a toolchain that cannot be asked reads ``unavailable (<error>)``, so keys stay
    stable where that codegen fails anyway."""
    out = {}
    for entry in codegen_registry.loadable_codegens():
        if entry.toolchain is None:
            continue
        try:
            out[entry.name] = entry.toolchain()
        except Exception as e:
            out[entry.name] = f"unavailable ({type(e).__name__})"
    return out


def codegen_packages() -> list[str]:
    """The top-level modules of the loadable codegens (their sources are part of cache keys)."""
    return sorted({entry.build.__module__.split(".")[0]
                   for entry in codegen_registry.loadable_codegens()})


def random_policy(config: Options) -> str:
    """How random ops lower (kiln_loopir.lowerings.random): eager's generator with
    ``fallback_random``; with a chosen codegen, philox numbers if it has them; otherwise
    ``"auto"``: philox where the device's codegen has them (CUDA), eager's generator elsewhere."""
    if config.fallback_random:
        return "eager"
    if config.codegen:
        return "philox" if codegen_registry.get_codegen(config.codegen).philox else "eager"
    return "auto"


def prepare_codegen(gm: torch.fx.GraphModule, example_inputs: Sequence, config: Options) -> None:
    """Let the graph's codegen start slow resources before tracing (``CodegenEntry.prepare``).
    Best effort: a failure here only costs the time it would have saved."""
    device = next((x.device for x in example_inputs if isinstance(x, torch.Tensor)), None)
    device = device or next((p.device for p in gm.parameters()), None)
    if device is None:
        return
    try:
        entry = codegen_entry_for_device(device, config)
        if entry.prepare is not None:
            entry.prepare(len(gm.graph.nodes))
    except Exception as e:  # noqa: BLE001
        log.debug("kiln: codegen prepare skipped: %s: %s", type(e).__name__, e)


def codegen_entry_for_device(device, config: Options | None = None) -> codegen_registry.CodegenEntry:
    """The registered codegen for a device: ``options["codegen"]`` when given, else the one
    declaring the device type (CPU -> cpp, CUDA -> triton)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    name = config.codegen if config is not None and config.codegen else None
    if name is None:
        name = codegen_registry.codegen_for_device_type(device.type).name
    return codegen_registry.get_codegen(name)


def codegen_for_device(device, config: Options | None = None):
    """A fresh codegen for a device (``codegen_entry_for_device``), built from ``config``."""
    return codegen_entry_for_device(device, config).build(config if config is not None else Options())
