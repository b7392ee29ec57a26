"""Errors raised by kiln-frontend's capture layer.

``KilnError`` is the base of every error we raise on purpose.  ``Unsupported`` means the
symbolic interpreter met something it cannot put in a graph (a data-dependent branch, a call
it cannot trace, ...): without ``nopython`` that becomes a graph break, with it the error
reaches the user, its message naming the user's ``file:line``.  ``BackendCompilerFailed``
wraps whatever a backend raised while compiling a graph.  ``InternalError`` is kiln's own
bug (the frame runs eagerly and the message says how to report it).
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


#: where a kiln bug is reported (said in every internal-error message)
BUG_REPORT_HINT = ("This is a bug in kiln, not in your code; please report it as an issue "
                   "in the kiln repository, with the output of the run under KILN_DEBUG=1 "
                   "KILN_VERBOSE=1 and the code that triggered it.")


class InternalError(KilnError):
    """kiln itself failed while capturing a frame: an exception escaped the symbolic
    interpreter, or the code it generated (bytecode, guards) does not build.

    ``frame`` names the user's frame (``qualname (file:line)``), ``phase`` what kiln was
    doing ("tracing", "assembling bytecode", "building guards"), ``inner`` the exception."""

    def __init__(self, frame: str, phase: str, inner: BaseException):
        self.frame = frame
        self.phase = phase
        self.inner = inner
        super().__init__(f"kiln internal error while {phase} {frame}: "
                         f"{type(inner).__name__}: {inner}. {BUG_REPORT_HINT}")

    @property
    def reason(self) -> str:
        return f"internal error while {self.phase}: {type(self.inner).__name__}: {self.inner}"


__all__ = ["BUG_REPORT_HINT", "BackendCompilerFailed", "InternalError", "KilnError",
           "Unsupported"]
