"""``Options``: what ``kiln.compile(options={...})`` and the ``kiln`` backend accept."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["Options", "KNOWN_CODEGENS", "KNOWN_MODES"]

#: codegen name -> "module:Class" (the module is imported only when that codegen is used)
KNOWN_CODEGENS: dict[str, str] = {
    "cpp": "kiln_codegen_cpp:CppCodegen",
    "triton": "kiln_codegen_triton:TritonCodegen",
}

#: torch.compile's modes; kiln accepts them all and so far compiles the same way for each
KNOWN_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Options:
    """Options of the ``kiln`` backend (``kiln.compile(..., options={...})``).

    - ``codegen``: ``"cpp"`` or ``"triton"`` forces that code generator; ``None`` (default)
      picks by device: CPU → cpp, CUDA → triton.
    - ``debug``: write a debug folder per compiled graph (FX graph, ATen graph, IR before and
      after fusion, output_code.py). ``None`` (default): on when ``KILN_COMPILE_DEBUG=1``.
    - ``debug_dir``: where debug folders go; default ``$KILN_DEBUG_DIR`` or ``./kiln_debug``.
    - ``cpp_flags``: extra compiler flags for the C++ codegen (appended to its defaults).
    - ``num_threads``: threads of the C++ kernels (default ``torch.get_num_threads()``).
    - ``mode``: torch.compile's ``mode`` (``compile(mode=...)`` arrives here); accepted and
      recorded, it does not change code generation yet.
    """

    codegen: str | None = None
    debug: bool | None = None
    debug_dir: str | None = None
    cpp_flags: tuple[str, ...] = ()
    num_threads: int | None = None
    mode: str | None = None

    def __post_init__(self) -> None:
        if self.codegen is not None and self.codegen not in KNOWN_CODEGENS:
            raise ValueError(
                f"unknown codegen {self.codegen!r}; known codegens: {', '.join(KNOWN_CODEGENS)}"
            )
        if self.mode not in KNOWN_MODES:
            known = ", ".join(repr(m) for m in KNOWN_MODES)
            raise ValueError(f"unknown mode {self.mode!r}; known modes: {known}")
        if isinstance(self.cpp_flags, str):
            object.__setattr__(self, "cpp_flags", tuple(self.cpp_flags.split()))
        else:
            object.__setattr__(self, "cpp_flags", tuple(self.cpp_flags))

    @classmethod
    def from_user(cls, options: Options | Mapping[str, Any] | None) -> Options:
        """``None``, a dict of the fields above, or an ``Options``; an unknown key raises
        ``ValueError`` listing the known ones."""
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        if not isinstance(options, Mapping):
            raise TypeError(f"options must be a dict or kiln.Options, not {type(options).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(
                f"unknown kiln option(s) {', '.join(map(repr, unknown))}; "
                f"known options: {', '.join(known)}"
            )
        return cls(**options)

    @property
    def debug_enabled(self) -> bool:
        return _env_flag("KILN_COMPILE_DEBUG") if self.debug is None else bool(self.debug)

    @property
    def debug_root(self) -> str:
        return self.debug_dir or os.environ.get("KILN_DEBUG_DIR") or "kiln_debug"
