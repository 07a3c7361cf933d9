"""ModelInfer and ModelStreamInfer receive their requests as bytes, parsed on a worker thread.

grpc.aio runs a method's request deserializer on the event loop, and parsing a
16 MiB ModelInferRequest (then copying its buffers out) takes tens of
milliseconds there, during which ServerLive and every other stream wait. The
generated registration (`add_GRPCInferenceServiceServicer_to_server`) is used
as it is, through a stand-in server that swaps the deserializer of those two
methods for none before handing the handlers to the real server.

ModelStreamInfer's responses may likewise leave as bytes: stream_wire.py builds them
on the model's thread, and the serializer here passes bytes through.
"""
from __future__ import annotations

import asyncio

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

_RAW_METHODS = ("ModelInfer", "ModelStreamInfer")


class _RawRegistration:
    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server
        self.registered = False

    def add_generic_rpc_handlers(self, handlers) -> None:  # type: ignore[no-untyped-def]
        pass  # built again below from the edited handlers

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        for name in _RAW_METHODS:
            handlers[name] = handlers[name]._replace(request_deserializer=None)
        handlers["ModelStreamInfer"] = handlers["ModelStreamInfer"]._replace(response_serializer=_bytes_or_message)
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
        self._server.add_registered_method_handlers(service, handlers)
        self.registered = True


def _bytes_or_message(response: bytes | pb.ModelStreamInferResponse) -> bytes:
    return response if isinstance(response, bytes) else response.SerializeToString()


def add_servicer(servicer: service_pb2_grpc.GRPCInferenceServiceServicer, server: grpc.aio.Server) -> None:
    shim = _RawRegistration(server)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, shim)  # type: ignore[arg-type]
    assert shim.registered, "tritonclient's generated registration changed"


async def parse_message(data: bytes) -> pb.ModelInferRequest:
    """A ModelInferRequest from the wire, parsed off the loop; DecodeError if malformed."""
    return await asyncio.to_thread(pb.ModelInferRequest.FromString, data)


__all__ = ["DecodeError", "add_servicer", "parse_message"]
