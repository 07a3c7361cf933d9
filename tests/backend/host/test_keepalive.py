"""The host keeps an idle gateway connection: keepalive pings between calls are
accepted, not answered with GOAWAY too_many_pings (which made an idle `kvserve
serve` log an error and reconnect every ~30 s)."""
from __future__ import annotations

import asyncio

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from host_fixtures import BASIC
from kvserve.backend.host import host as host_module
from kvserve.backend.host import start_host
from kvserve.frontend.backend_client import triton_client


def _option(options: list[tuple[str, int]], name: str) -> int:
    return dict(options)[name]


def test_the_host_accepts_pings_as_often_as_the_gateway_sends_them() -> None:
    gateway = triton_client._CHANNEL_OPTIONS
    host = host_module._grpc_options()
    assert _option(gateway, "grpc.keepalive_permit_without_calls") == 1
    assert _option(host, "grpc.keepalive_permit_without_calls") == 1
    # Half the gateway's period: timer jitter must not turn a ping into a strike.
    assert _option(host, "grpc.http2.min_ping_interval_without_data_ms") * 2 <= _option(gateway, "grpc.keepalive_time_ms")


async def _states_while_idle(ping_every_ms: int, seconds: float, until_not_ready: bool) -> list[str]:
    """Connectivity of an idle channel that pings like the gateway's, sampled every 0.5 s for
    `seconds` (or, with until_not_ready, until it leaves READY)."""
    handle = await start_host(BASIC, metrics_port=None)
    channel = grpc.aio.insecure_channel(handle.grpc_url, options=[
        ("grpc.keepalive_time_ms", ping_every_ms), ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)])
    try:
        await service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(service_pb2.ServerLiveRequest())
        states = []
        for _ in range(int(seconds / 0.5)):
            await asyncio.sleep(0.5)
            states.append(channel.get_state().name)
            if until_not_ready and states[-1] != "READY":
                break
        return states
    finally:
        await channel.close()
        await handle.stop(grace=0.1)


def test_an_idle_pinging_channel_stays_connected(monkeypatch) -> None:
    # The gateway's 10 s period and the host's 5 s minimum, scaled down 10x to keep the test short.
    monkeypatch.setattr(host_module, "MIN_PING_INTERVAL_WITHOUT_DATA_MS", 500)
    states = asyncio.run(_states_while_idle(ping_every_ms=1_000, seconds=5.0, until_not_ready=False))
    assert set(states) == {"READY"}, states


def test_the_control_with_grpcs_server_defaults_loses_the_connection(monkeypatch) -> None:
    # What the host did before: gRPC's defaults close a connection pinged every second
    # (GOAWAY too_many_pings after a few pings), so the test above can tell the two apart.
    monkeypatch.setattr(host_module, "_grpc_options", lambda: [])
    states = asyncio.run(_states_while_idle(ping_every_ms=1_000, seconds=15.0, until_not_ready=True))
    assert states[-1] != "READY", states
