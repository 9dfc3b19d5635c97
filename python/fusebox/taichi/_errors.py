"""Errors of fusebox.taichi (all are fusebox.Error)."""
from fusebox.errors import Error


class TaichiSyntaxError(Error, SyntaxError):
    """A construct outside what fusebox.taichi translates: the message
    names it, the user's file and line, and what to write instead."""

    def __init__(self, msg: str):
        Error.__init__(self, msg)
        self.msg = msg

    def __str__(self) -> str:
        return self.msg


class TaichiCompilationError(Error):
    """The server refused the translated kernel (a type mismatch, ...);
    the message points at the user's Python file and line."""


class TaichiTypeError(TaichiCompilationError, TypeError):
    """A kernel argument of the wrong kind."""


class TaichiRuntimeError(Error, RuntimeError):
    """Misuse of the runtime (declaring a field after the first launch, ...)."""
