"""Errors raised by kiln-frontend's capture layer.

``KilnError`` is the base of every error we raise on purpose.  ``Unsupported`` means the
symbolic interpreter met something it cannot put in a graph (a data-dependent branch, a call
it cannot trace, ...): without ``nopython`` that becomes a graph break, with it the error
reaches the user, its message naming the user's ``file:line``.  ``BackendCompilerFailed``
wraps whatever a backend raised while compiling a graph.
"""

from __future__ import annotations


class KilnError(Exception):
    """Base class of kiln-frontend's own errors."""


class Unsupported(KilnError):
    """Something the symbolic interpreter cannot capture.

    ``reason`` is the short reason in words ("data-dependent branch on a tensor");
    ``filename``/``lineno``/``source_line`` say where in the user's code it happened, when
    known (``with_location`` fills them in).
    """

    def __init__(self, reason: str, *, filename: str | None = None, lineno: int | None = None,
                 source_line: str | None = None):
        self.reason = reason
        self.filename = filename
        self.lineno = lineno
        self.source_line = source_line
        super().__init__(self._message())

    def _message(self) -> str:
        msg = self.reason
        if self.source_line:
            msg = f"{msg} ({self.source_line})"
        if self.filename is not None and self.lineno is not None:
            msg = f"{self.filename}:{self.lineno}: {msg}"
        return msg

    def with_location(self, filename: str | None, lineno: int | None,
                      source_line: str | None = None) -> Unsupported:
        """Fill in the user's location once (the innermost location wins)."""
        if self.filename is None and filename is not None:
            self.filename = filename
            self.lineno = lineno
            self.source_line = source_line
            self.args = (self._message(),)
        return self

    @property
    def location(self) -> str | None:
        if self.filename is None:
            return None
        return f"{self.filename}:{self.lineno}"


class BackendCompilerFailed(KilnError):
    """The backend's ``compiler_fn(gm, example_inputs)`` raised ``inner``."""

    def __init__(self, backend_name: str, inner: BaseException):
        self.backend_name = backend_name
        self.inner = inner
        super().__init__(f"backend {backend_name!r} raised {type(inner).__name__}: {inner}")


__all__ = ["KilnError", "Unsupported", "BackendCompilerFailed"]
