"""fusebox: the Python client of fuseboxd, the Fusebox GPU compute service.

    import fusebox, numpy as np
    with fusebox.connect() as fb:                    # a private fuseboxd
        with fb.session(file="heat.fbk", mode="async") as s:
            s.kernels.init()
            for _ in range(100):
                s.kernels.step(s.fields.T, s.fields.U, 0.2)
                s.kernels.step(s.fields.U, s.fields.T, 0.2)
            print(s.fields.T.to_numpy().sum(), s.sync().counters)

See docs/python.md.
"""
from fusebox.client import Client, ServerInfo, connect, find_fuseboxd
from fusebox.errors import (ConnectionLostError, DeadlineExceededError, Error, LaunchError,
                            LayoutWarning, NotFoundError, ServerError, SessionLostError)
from fusebox.session import (Counters, Field, FieldInfo, Kernel, KernelInfo, LaunchFailure,
                             Param, Program, Session, SyncResult)
from fusebox.picture import encode_png, splat, to_pixels, write_png
from fusebox.tools import bench, plot

__version__ = "0.1.0"
__all__ = [
    "Client", "ServerInfo", "connect", "find_fuseboxd", "ConnectionLostError", "DeadlineExceededError", "Error",
    "LaunchError", "LayoutWarning", "NotFoundError", "ServerError", "SessionLostError", "Counters", "Field", "FieldInfo", "Kernel",
    "KernelInfo", "LaunchFailure", "Param", "Program", "Session", "SyncResult", "bench", "plot",
    "encode_png", "splat", "to_pixels", "write_png",
]
