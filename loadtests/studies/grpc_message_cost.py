"""What one streamed gRPC message costs in CPU on this machine, with nothing else around it.

    python -m kvserve.loadtests.studies.grpc_message_cost --messages 20000 --size 276 --streams 64

A grpc.aio server (what the embedded Triton host runs) writes `--messages`
messages of `--size` bytes (276: one streamed token's response from the llm
model), spread over `--streams` concurrent server-streaming calls (64: the
benchmark's concurrency; the gateway opens one call per request), to a
grpc.aio client (what the gateway runs) in another process, which only
counts them. Reported: each process's
CPU time per message (its event loop and gRPC's own threads, from getrusage;
the client's from its first message to the end of the stream). That is the
floor under the host's and the gateway's per-token cost, before any of
kvserve's own code runs.
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import resource
import socket
import sys
import time
from typing import Any

import grpc

from kvserve.loadtests.bench.report import write_json

_SERVICE, _METHOD = "kvserve.bench.Cost", "Stream"


def _same(data: bytes) -> bytes:
    return data


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _client(port: int, streams: int, result: Any) -> None:
    asyncio.run(_count_messages(port, streams, result))


async def _count_messages(port: int, streams: int, result: Any) -> None:
    """Count the messages of every call; CPU from the first message to the end of the last call."""
    counted = [0]
    first_cpu: list[float] = []

    async def one(method: Any) -> None:
        async for _ in method(b"go", wait_for_ready=True, timeout=600):
            if not first_cpu:
                first_cpu.append(_cpu_s())
            counted[0] += 1

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        method = channel.unary_stream(f"/{_SERVICE}/{_METHOD}", request_serializer=_same,
                                      response_deserializer=_same)
        await asyncio.gather(*(one(method) for _ in range(streams)))
    result[0], result[1] = float(counted[0]), _cpu_s() - first_cpu[0]


async def _serve(port: int, messages: int, size: int,
                 streams: int) -> tuple[grpc.aio.Server, dict[str, float], asyncio.Event]:
    """A server whose calls share `messages` out; measured from the first call's start to the last's end."""
    payload = b"x" * size
    measured: dict[str, float] = {}
    done = asyncio.Event()
    shares = [messages // streams + (1 if i < messages % streams else 0) for i in range(streams)]
    open_calls = [streams]

    async def stream(_request: bytes, context: grpc.aio.ServicerContext) -> None:
        if not measured:
            measured.update(cpu_before=_cpu_s(), started=time.perf_counter())
        for _ in range(shares.pop()):
            await context.write(payload)
        open_calls[0] -= 1
        if open_calls[0] == 0:
            measured.update(server_cpu_s=_cpu_s() - measured["cpu_before"],
                            wall_s=time.perf_counter() - measured["started"])
            done.set()

    handler = grpc.method_handlers_generic_handler(_SERVICE, {_METHOD: grpc.unary_stream_rpc_method_handler(
        stream, request_deserializer=_same, response_serializer=_same)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, measured, done


def run(messages: int, size: int, streams: int) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    port, result = _free_port(), ctx.Array("d", 2)

    async def serve_and_count() -> dict[str, float]:
        server, measured, done = await _serve(port, messages, size, streams)
        client = ctx.Process(target=_client, args=(port, streams, result), daemon=True)
        client.start()
        try:
            await asyncio.wait_for(done.wait(), 600)
            await asyncio.get_running_loop().run_in_executor(None, client.join, 60)
        finally:
            if client.is_alive():
                client.kill()
            await server.stop(None)
        return measured

    measured = asyncio.run(serve_and_count())
    if result[0] != messages:
        raise RuntimeError(f"the client received {result[0]:.0f} of {messages} messages")
    return {"messages": float(messages), "size": float(size), "streams": float(streams), "wall_s": measured["wall_s"],
            "server_cpu_us_per_message": 1e6 * measured["server_cpu_s"] / messages,
            "client_cpu_us_per_message": 1e6 * result[1] / messages}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.studies.grpc_message_cost",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=20000)
    p.add_argument("--size", type=int, default=276, help="bytes per message")
    p.add_argument("--streams", type=int, default=64, help="concurrent calls the messages are spread over")
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE")
    opts = p.parse_args(argv)
    if opts.streams < 1 or opts.messages < opts.streams or opts.size < 0:
        print("grpc_message_cost: need --streams >= 1, --messages >= --streams, --size >= 0", file=sys.stderr)
        return 2
    doc = run(opts.messages, opts.size, opts.streams)
    print(f"{int(doc['messages'])} messages of {int(doc['size'])} bytes on {int(doc['streams'])} streams in "
          f"{doc['wall_s']:.2f} s: server "
          f"{doc['server_cpu_us_per_message']:.1f} us CPU per message, client {doc['client_cpu_us_per_message']:.1f} us")
    if opts.json_path:
        print(f"wrote {write_json(doc, opts.json_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
