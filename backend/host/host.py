"""start_host(): load a repository and serve it; HostHandle.stop() undoes it all.

Order matters. Start: models load first (in threads, so the loop stays free),
then the gRPC and HTTP endpoints open, as tritonserver opens its endpoints
after loading. Stop: readiness drops, the gRPC server stops (in-flight RPCs
get a grace period, then are cancelled, which marks their requests
cancelled), then every model instance is finalized on its own thread.
"""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field

import grpc

from .kserve.grpc_service import InferenceServicer
from .http_endpoints import HttpEndpoints
from .kserve.raw_requests import add_servicer
from .host_metrics import REGISTRY, HostMetrics
from .bls_model_control import LoopModelControl
from .pb_utils.host_hooks import set_model_control, set_model_ready_hook
from .repository import ModelRepository

_LOG = logging.getLogger("kvserve.host")
# Clients may ping an idle connection this often. The gateway pings every 10 s, calls or
# not, to notice a dead backend (frontend/backend_client/triton_client.py); gRPC servers by default take a
# ping without data only every 5 minutes and close the connection (GOAWAY too_many_pings)
# after a few early ones, so an idle gateway logged an error and reconnected every ~30 s.
# tritonserver needs the same on its command line (docs/deployment.md, deploy/).
MIN_PING_INTERVAL_WITHOUT_DATA_MS = 5_000
MAX_GRPC_MESSAGE_BYTES = 2**31 - 1


def _grpc_options() -> list[tuple[str, int]]:
    return [
        # tritonserver's cap (INT32_MAX both ways; gRPC's own default is 4 MiB). What a big
        # message costs is bounded elsewhere: element counts are checked before any decoding,
        # and large inputs are decoded off the event loop (request_parse.py).
        ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES),
        # gRPC sets SO_REUSEPORT by default, so a second host on a taken port bound it too and
        # the kernel split connections between the two; tritonserver leaves it off unless
        # --reuse-grpc-port is given. Off: a taken port is a bind error.
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_WITHOUT_DATA_MS),
    ]


@dataclass
class HostHandle:
    host: str
    grpc_port: int
    metrics_port: int | None
    repository: ModelRepository
    _server: grpc.aio.Server = field(repr=False)
    _servicer: InferenceServicer = field(repr=False)
    _http: HttpEndpoints | None = field(repr=False, default=None)
    _stopped: bool = field(repr=False, default=False)

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str | None:
        return None if self.metrics_port is None else f"http://{self.host}:{self.metrics_port}/metrics"

    def ready(self) -> bool:
        return self._servicer.server_ready()

    async def stop(self, grace: float = 2.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._servicer.shutting_down = True
        set_model_control(None)  # no model starts a load the shutdown below would not finalize
        await self._server.stop(grace)
        await self.repository.wait_for_model_control()  # a load under way finishes, then is finalized
        await asyncio.to_thread(self.repository.shutdown)
        if self._http is not None:
            await self._http.stop()
        set_model_ready_hook(None)
        _LOG.info("host stopped")


async def start_host(
    repository: str | os.PathLike[str],
    grpc_port: int = 0,
    metrics_port: int | None = 0,
    host: str = "127.0.0.1",
    strict_readiness: bool = True,
    load_models: frozenset[str] | None = None,
    explicit_model_control: bool | None = None,
) -> HostHandle:
    """Port 0 picks a free port (read it back from the handle); metrics_port=None disables HTTP.
    load_models: only these models (tritonserver's --model-control-mode=explicit --load-model); None: all.
    explicit_model_control: RepositoryModelLoad/Unload are allowed; None means "when load_models is
    given" (explicit mode with `--load-model '*'` loads everything and still allows them)."""
    if explicit_model_control is None:
        explicit_model_control = load_models is not None
    metrics = HostMetrics()
    repo = ModelRepository(repository, metrics, explicit_control=explicit_model_control)
    repo.scan(load_models)
    await asyncio.to_thread(repo.load_all)
    set_model_ready_hook(repo.model_ready)
    # pb_utils.load_model / unload_model; in mode none the repository refuses them as the RPCs
    set_model_control(LoopModelControl(repo, asyncio.get_running_loop()))

    servicer = InferenceServicer(repo, metrics, strict_readiness=strict_readiness)
    server = grpc.aio.server(options=_grpc_options())
    add_servicer(servicer, server)  # ModelInfer/ModelStreamInfer parse their requests off the loop
    try:
        bound = server.add_insecure_port(f"{host}:{grpc_port}")
    except RuntimeError:  # newer grpcio raises where older ones returned 0
        bound = 0
    if bound == 0:
        await asyncio.to_thread(repo.shutdown)
        raise OSError(f"cannot bind gRPC to {host}:{grpc_port} (address in use, or not this machine's)")
    await server.start()

    http: HttpEndpoints | None = None
    if metrics_port is not None:
        http = HttpEndpoints(REGISTRY, live=lambda: True, ready=servicer.server_ready)
        try:
            metrics_port = await http.start(host, metrics_port)
        except OSError as exc:
            await server.stop(None)
            await asyncio.to_thread(repo.shutdown)
            raise OSError(f"cannot bind metrics to {host}:{metrics_port} ({exc.strerror or exc})") from None
    _LOG.info("serving gRPC on %s:%d, metrics on %s", host, bound,
              f"{host}:{metrics_port}" if http else "(disabled)")
    return HostHandle(host, bound, metrics_port, repo, server, servicer, http)
