"""POST /v1/load_lora_adapter and POST /v1/unload_lora_adapter, vLLM's run-time LoRA routes.

Mounted only with --allow-runtime-lora-updating (vLLM mounts them only when run-time updating is
allowed; without it they are unknown routes: 404). They need the API key like every route but
/health, /metrics and /version (the middleware's). The backend does the work (a LoRA control
request, seam.tensors.LORA_CONTROL_PARAM), on every replica; its refusals come back as vLLM's
answers: an unknown name on unload 404, bad adapter files or a name already loaded 400. Success
is vLLM's plain-text sentence with 200.
"""
from __future__ import annotations

from aiohttp import web

from kvserve.frontend.backend_client import BackendError, BackendRejected, LoRAControl
from kvserve.frontend.http import GATEWAY, Gateway, read_json_body
from kvserve.frontend.openai import fields as F
from kvserve.frontend.openai.api_errors import ApiError, bad_request, from_backend
from kvserve.seam.error_wire import ErrorKind
from kvserve.seam.limits import MAX_LORA_NAME_CHARS

_MAX_PATH = 4096


def add_lora_routes(app: web.Application) -> None:
    app.router.add_post("/v1/load_lora_adapter", load_lora_adapter)
    app.router.add_post("/v1/unload_lora_adapter", unload_lora_adapter)


def _name(gateway: Gateway, body: dict) -> str:
    name = F.opt_str(body, "lora_name", max_len=MAX_LORA_NAME_CHARS, allow_empty=False)
    if name is None:
        raise bad_request("'lora_name' is required", param="lora_name")
    if name in gateway.config.served_model_names or name in gateway.config.embedding_model_names:
        raise bad_request("lora_name: a served model already has this name", param="lora_name")
    return name


async def _control(gateway: Gateway, action: str, name: str, path: str | None = None) -> None:
    await gateway.ensure_ready()  # also learns from a remote backend whether it serves adapters
    if not gateway.config.enable_lora or not isinstance(gateway.backend, LoRAControl):
        raise bad_request("LoRA adapters are not enabled on this server (start it with --enable-lora)",
                          param="lora_name", code="lora_disabled")
    try:
        await gateway.backend.lora_control(action, name, path)
    except BackendRejected as exc:
        if exc.kind is ErrorKind.NOT_FOUND:
            raise ApiError(404, f"the LoRA adapter {name!r} cannot be found", param="lora_name",
                           code="model_not_found") from None
        if exc.kind is ErrorKind.INVALID:  # the engine's message names the problem (file, tensor, rank)
            raise ApiError(400, exc.message, param=exc.param or "lora_name") from None
        raise from_backend(exc, prompt_param="lora_path") from None
    except BackendError as exc:
        raise from_backend(exc, prompt_param="lora_path") from None


async def load_lora_adapter(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = await read_json_body(request, gateway.config.max_request_body_bytes, gateway.config.body_timeout)
    name = _name(gateway, body)
    path = F.opt_str(body, "lora_path", max_len=_MAX_PATH, allow_empty=False)
    if path is None:
        raise bad_request("'lora_path' is required (the adapter's PEFT folder on the backend)", param="lora_path")
    await _control(gateway, "load", name, path)
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    body = await read_json_body(request, gateway.config.max_request_body_bytes, gateway.config.body_timeout)
    name = _name(gateway, body)
    await _control(gateway, "unload", name)
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
