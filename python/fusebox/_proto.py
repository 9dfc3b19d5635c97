"""The wire protocol: the generated message classes and the method paths.

fusebox/_gen/fusebox_pb2.py is made by protoc from proto/fusebox.proto when
the package is built (setup.py); gRPC method stubs are made here by hand
with ``channel.unary_unary`` and friends, so no grpc_tools is needed.
"""
from __future__ import annotations

import grpc

try:
    from fusebox._gen import fusebox_pb2 as pb  # noqa: F401
except ImportError as e:  # pragma: no cover - a build problem
    raise ImportError(
        "fusebox: the protocol stubs (fusebox/_gen/fusebox_pb2.py) are missing; they are "
        "generated from proto/fusebox.proto when the package is built: "
        "pip install ./python") from e

SERVICE = "/fusebox.v1.Fusebox/"


class Stub:
    """Callables for each method of the Fusebox service on one channel."""

    def __init__(self, channel: grpc.Channel):
        def uu(name, req, resp):
            return channel.unary_unary(SERVICE + name, request_serializer=req.SerializeToString,
                                       response_deserializer=resp.FromString)

        self.CreateSession = uu("CreateSession", pb.CreateSessionRequest,
                                pb.CreateSessionResponse)
        self.CloseSession = uu("CloseSession", pb.CloseSessionRequest, pb.CloseSessionResponse)
        self.Cancel = uu("Cancel", pb.CancelRequest, pb.CancelResponse)
        self.RegisterKernels = uu("RegisterKernels", pb.RegisterKernelsRequest,
                                  pb.RegisterKernelsResponse)
        self.GetInfo = uu("GetInfo", pb.InfoRequest, pb.ServerInfo)
        self.GetStats = uu("GetStats", pb.StatsRequest, pb.ServerStats)
        self.DescribeSource = uu("DescribeSource", pb.Source, pb.SourceInfo)
        self.Session = channel.stream_stream(
            SERVICE + "Session", request_serializer=pb.SessionRequest.SerializeToString,
            response_deserializer=pb.SessionResponse.FromString)
        # field chunks travel as bytes built and parsed by fusebox._wire
        # (one copy of the data each way, not three)
        self.WriteField = channel.stream_unary(
            SERVICE + "WriteField", request_serializer=_same,
            response_deserializer=pb.WriteFieldResponse.FromString)
        self.ListCheckpoints = uu("ListCheckpoints", pb.ListCheckpointsRequest,
                                  pb.CheckpointList)
        self.Checkpoint = channel.unary_stream(
            SERVICE + "Checkpoint", request_serializer=pb.CheckpointRequest.SerializeToString,
            response_deserializer=pb.CheckpointChunk.FromString)
        self.FetchCheckpoint = channel.unary_stream(
            SERVICE + "FetchCheckpoint",
            request_serializer=pb.FetchCheckpointRequest.SerializeToString,
            response_deserializer=pb.CheckpointChunk.FromString)
        self.Restore = channel.stream_unary(
            SERVICE + "Restore", request_serializer=pb.CheckpointChunk.SerializeToString,
            response_deserializer=pb.RestoreResponse.FromString)
        self.ReadField = channel.unary_stream(
            SERVICE + "ReadField", request_serializer=pb.ReadFieldRequest.SerializeToString,
            response_deserializer=_same)


def _same(b: bytes) -> bytes:
    return b
