"""Exceptions of the fusebox package.

Every error the server sends back becomes a :class:`ServerError` carrying
the gRPC status, the server's message (for ``.fbk`` source the rendered
``file:line:col`` diagnostics) and the Fusebox error code of the
``fusebox-code`` trailer. Mistakes caught before anything is sent are the
usual Python exceptions (``TypeError``, ``ValueError``) or
:class:`NotFoundError`, with a message that names the argument.
"""
from __future__ import annotations

from typing import List, Optional

import grpc

#: FB_E* codes of include/fusebox/common.h, by number.
FB_CODES = {
    -1: "FB_EINVAL", -2: "FB_ENOMEM", -3: "FB_EVERIFY", -4: "FB_EPARSE", -5: "FB_ENOENT",
    -6: "FB_ECOMPILE", -7: "FB_EDEVICE", -8: "FB_EQUOTA", -9: "FB_EBOUNDS", -10: "FB_ETYPE",
    -11: "FB_EUNSUPPORTED", -12: "FB_EIO", -13: "FB_EINTERNAL", -14: "FB_ECANCELLED",
    -15: "FB_ETIMEOUT",
}


class Error(Exception):
    """Base class of every exception raised by fusebox."""


class NotFoundError(Error, LookupError, AttributeError):
    """No kernel or field of that name (raised before anything is sent)."""


class ServerError(Error):
    """A call to fuseboxd failed.

    Attributes:
        status: the gRPC status code (``grpc.StatusCode``).
        message: the server's message (diagnostics with file:line:col for
            source that does not parse).
        fb_code: the FB_E* code (a negative int) or None when the server
            sent none (for instance when it could not be reached).
        method: the RPC that failed.
    """

    def __init__(self, method: str, status: grpc.StatusCode, message: str,
                 fb_code: Optional[int] = None):
        self.method = method
        self.status = status
        self.message = message
        self.fb_code = fb_code
        name = FB_CODES.get(fb_code, "") if fb_code is not None else ""
        super().__init__(f"{method}: {status.name}{' (' + name + ')' if name else ''}: "
                         f"{message}")


class ConnectionLostError(ServerError):
    """The server is gone or cannot be reached (gRPC UNAVAILABLE)."""


class SessionLostError(ConnectionLostError):
    """The replica that held a session is gone (killed, or unreachable
    behind a proxy): its state is lost. ``str(e)`` is ``session S lost:
    replica R unreachable ...``; ``replica`` names R, ``session`` S."""

    def __init__(self, method: str, status: grpc.StatusCode, session: str, replica: str):
        self.session = session
        self.replica = replica
        msg = (f"session {session[:8]} lost: replica {replica or '?'} unreachable "
               "(its state is gone; open a new session)")
        self.method = method
        self.status = status
        self.message = msg
        self.fb_code = None
        Exception.__init__(self, msg)


class DeadlineExceededError(ServerError, TimeoutError):
    """A call, or a :meth:`Session.sync`, ran past its timeout (gRPC
    DEADLINE_EXCEEDED). The work it waited for may still be running on
    the server: :meth:`Session.cancel` stops it."""


class LaunchError(Error):
    """One or more launches failed; raised by :meth:`Session.sync`.

    Attributes:
        errors: every failed launch reported since the previous sync, as
            :class:`fusebox.LaunchFailure` records (seq, kernel, code,
            message).
        dropped: failures the server did not list (it keeps 64 per sync).
    """

    def __init__(self, errors: List["object"], dropped: int = 0):
        self.errors = errors
        self.dropped = dropped
        first = errors[0] if errors else None
        more = len(errors) - 1 + dropped
        # the package's own kernels are named by what they do ("set of field 'x'")
        what = (f"({first.kernel})" if first is not None and "'" in first.kernel
                else f"of kernel '{first.kernel}'" if first is not None else "")
        msg = (f"launch {first.seq} {what} failed: {first.message}"
               if first is not None and first.seq else
               (first.message if first is not None else "launches failed"))
        if more > 0:
            msg += f" (and {more} more)"
        super().__init__(msg)


def from_rpc(method: str, e: grpc.RpcError) -> ServerError:
    """A ServerError for a failed gRPC call."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = (e.details() if hasattr(e, "details") else str(e)) or ""
    fb_code = None
    md = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    for k, v in md or ():
        if k == "fusebox-code":
            try:
                fb_code = int(v)
            except ValueError:
                pass
    cls = (ConnectionLostError if code == grpc.StatusCode.UNAVAILABLE else
           DeadlineExceededError if code == grpc.StatusCode.DEADLINE_EXCEEDED else ServerError)
    return cls(method, code, details, fb_code)


def replica_gone(e: grpc.RpcError) -> bool:
    """Whether a failed call of a live session says that its replica is
    gone, rather than anything fuseboxd itself answered (fuseboxd always
    sends ``fusebox-code``): UNAVAILABLE or a proxy's 502/503 without it, a
    stream reset by a proxy, or NOT_FOUND "... (lost or moved)" from
    another replica."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = (e.details() if hasattr(e, "details") else str(e)) or ""
    if code == grpc.StatusCode.NOT_FOUND and "(lost or moved)" in details:
        return True
    md = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    if any(k == "fusebox-code" for k, _ in md or ()):
        return False
    return (code == grpc.StatusCode.UNAVAILABLE or "http2 header with status" in details or
            (code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
                      grpc.StatusCode.CANCELLED) and "RST_STREAM" in details))


class LayoutWarning(UserWarning):
    """Advice from the ``.fbk`` front end that fails nothing, e.g. several
    fields interleaved in one dense block (an array of structures, slower
    when a loop reads only one of them); the message has the
    ``file:line:col`` and the ``field x: T (axes: sizes)`` line to write
    instead. :class:`fusebox.Session` and :meth:`fusebox.Client.describe`
    emit each warning of the program once (the server sends at most 16,
    then one saying how many more)."""
