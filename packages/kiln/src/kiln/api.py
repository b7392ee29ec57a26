"""``kiln.compile``: torch.compile's signature over kiln_frontend, with kiln's backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .options import Options

__all__ = ["compile"]


def compile(
    model: Any = None,
    *,
    fullgraph: bool = False,
    dynamic: bool | None = None,
    backend: str | Callable[..., Any] = "kiln",
    mode: str | None = None,
    options: dict[str, Any] | Options | None = None,
    disable: bool = False,
) -> Any:
    """Compile a function or ``nn.Module`` (or decorate one: ``@kiln.compile``,
    ``@kiln.compile(dynamic=True)``).

    - ``fullgraph``: a graph break raises ``kiln_frontend.Unsupported`` instead of splitting;
    - ``dynamic``: ``True`` traces sizes as symbols, ``False`` specializes, ``None`` decides;
    - ``backend``: ``"kiln"`` (default), ``"loopir_interpret"``, ``"eager"``, any name in the
      ``kiln.backends`` entry points, or a callable ``(gm, example_inputs) -> callable``;
    - ``mode``/``options``: handed to the backend (``kiln.Options`` fields for ``"kiln"``:
      unknown keys raise here, listing the known ones);
    - ``disable=True`` returns ``model`` untouched.
    """
    if model is not None and disable:
        return model
    import kiln_frontend

    if isinstance(options, Options):
        options = {k: v for k, v in vars(options).items() if v not in (None, ())}
    if backend in ("kiln", "loopir_interpret") and (options is not None or mode is not None):
        # validate now, not at the first call
        Options.from_user({**(options or {}), **({"mode": mode} if mode is not None else {})})
    return kiln_frontend.compile(
        model,
        fullgraph=fullgraph,
        dynamic=dynamic,
        backend=backend,
        mode=mode,
        options=options,
        disable=disable,
    )
