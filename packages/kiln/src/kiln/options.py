"""``Options``: what ``kiln.compile(options={...})`` and the ``kiln`` backend accept."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["Options", "KNOWN_MODES"]

#: torch.compile's modes; kiln accepts them all and so far compiles the same way for each
KNOWN_MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Options:
    """Options of the ``kiln`` backend (``kiln.compile(..., options={...})``).

    - ``codegen``: the name of a codegen registered in the entry-point group ``kiln.codegens``
      (``"cpp"``, ``"triton"``) forces it; ``None`` (default) picks the codegen declaring the
      device (CPU → cpp, CUDA → triton).
    - ``debug``: write a debug folder per compiled graph (FX graph, ATen graph, IR before and
      after fusion, output_code.py). ``None`` (default): on when ``KILN_COMPILE_DEBUG=1``.
    - ``debug_dir``: where debug folders go; default ``$KILN_DEBUG_DIR`` or ``./kiln_debug``.
    - ``cpp_flags``: extra compiler flags for the C++ codegen (appended to its defaults).
    - ``num_threads``: threads of the C++ kernels (default ``torch.get_num_threads()``).
    - ``mode``: torch.compile's ``mode`` (``compile(mode=...)`` arrives here); accepted and
      recorded, it does not change code generation yet.
    - ``partitioner``: how training graphs are cut into forward and backward (``"min_cut"``,
      default: save few bytes, recompute cheap pointwise ops; ``"save_all"``: for comparison).
    - ``activation_memory_budget``: 0 < f <= 1; below 1 the min-cut saves fewer bytes and
      recomputes more (docs/training.md).
    - ``fallback_random``: random ops (rand, randn, randint, dropout's bernoulli) call eager's
      generator on every device, so results match eager's random stream; by default they are
      counter-based philox numbers in generated kernels where the codegen has them (Triton).
    """

    codegen: str | None = None
    debug: bool | None = None
    debug_dir: str | None = None
    cpp_flags: tuple[str, ...] = ()
    num_threads: int | None = None
    mode: str | None = None
    partitioner: str = "min_cut"
    activation_memory_budget: float = 1.0
    fallback_random: bool = False

    def __post_init__(self) -> None:
        if self.partitioner not in ("min_cut", "save_all"):
            raise ValueError(
                f"unknown partitioner {self.partitioner!r}; known partitioners: min_cut, save_all"
            )
        if not 0.0 < float(self.activation_memory_budget) <= 1.0:
            raise ValueError(
                f"activation_memory_budget must be in (0, 1], got {self.activation_memory_budget}"
            )
        if self.codegen is not None:
            from kiln_loopir.codegen_registry import codegen_names

            if self.codegen not in codegen_names():
                raise ValueError(
                    f"unknown codegen {self.codegen!r}; known codegens: {', '.join(codegen_names())}"
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


#: the Options of the compile now lowering a graph (None: outside one); the bodies of
#: higher-order operators it meets are compiled with them (``kiln.higher_order``)
_BODY_OPTIONS: contextvars.ContextVar[Options | None] = contextvars.ContextVar(
    "kiln_body_options", default=None)


@contextlib.contextmanager
def body_options(config: Options) -> Iterator[None]:
    """Bodies met while this is open are compiled with ``config`` (``kiln.stages``' lower
    stage opens it: ``codegen="triton"`` on a CPU makes Triton bodies too)."""
    token = _BODY_OPTIONS.set(config)
    try:
        yield
    finally:
        _BODY_OPTIONS.reset(token)


def current_body_options() -> Options:
    """The Options a body met now is compiled with: the lowering compile's, else the
    defaults (loopir lowering a graph by itself)."""
    return _BODY_OPTIONS.get() or Options()
