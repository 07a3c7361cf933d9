"""One instance of a Python-backend model: a fresh import of model.py, its
TritonPythonModel object and the one thread that runs initialize, every
execute and finalize (as Triton's stub process runs them on its main thread).

execute() therefore never runs on the event loop. A decoupled model's execute
returns None and may keep sending from threads of its own; `async def execute`
runs on a per-instance asyncio loop, in the background for decoupled models.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import gc
import importlib.util
import itertools
import logging
import re
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from . import pb_utils
from .pb_utils.host_hooks import set_thread_model
from .pb_utils.inference_request import InferenceRequest
from .pb_utils.response import InferenceResponse

if TYPE_CHECKING:
    from .model_runtime import ModelRuntime

_LOG = logging.getLogger("kvserve.host")
_module_ids = itertools.count()


class HostCheckError(Exception):
    """A contract violation found by the host itself (reported without a type name, as Triton does)."""


def _return_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc keeps them for reuse otherwise: an
    unloaded SmolLM2 left the host's RSS at 1.4 GiB, 0.7 GiB after this). Elsewhere, nothing."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def import_model_module(path: Path, tag: str) -> ModuleType:
    """A fresh module object per call: instances never share module state, as in Triton."""
    pb_utils.install()
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.append(folder)  # model.py may import files next to it, as under Triton
    name = f"_kvserve_model_{re.sub(r'[^0-9A-Za-z_]', '_', tag)}_{next(_module_ids)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and typing look classes up by module name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    if not hasattr(module, "TritonPythonModel"):
        raise AttributeError(f"{path} does not define class 'TritonPythonModel'")
    return module


def describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, HostCheckError) else f"{type(exc).__name__}: {exc}"


class ModelInstance:
    def __init__(self, runtime: "ModelRuntime", *, name: str, kind: str, device_id: int) -> None:
        self.runtime = runtime
        self.name = name
        self.kind = kind
        self.device_id = device_id
        self.initialized = False
        self._model: Any = None
        self._ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._main, name=f"kvserve-host-{name}", daemon=True)
        self._aloop: asyncio.AbstractEventLoop | None = None

    def initialize_args(self) -> dict[str, str]:
        rt = self.runtime
        return {
            "model_config": rt.config_json,
            "model_instance_kind": self.kind,
            "model_instance_name": self.name,
            "model_instance_device_id": str(self.device_id),
            "model_repository": str(rt.model_dir),
            "model_version": str(rt.version),
            "model_name": rt.name,
        }

    def user_ready(self) -> bool:
        """The model's own `is_model_ready()` (the Python backend's user-defined
        readiness); True when it has none. Runs on the gRPC loop, so it must be cheap;
        raising or returning a non-boolean counts as not ready."""
        hook = getattr(self._model, "is_model_ready", None) if self.initialized else None
        if hook is None:
            return True
        try:
            result = hook()
        except Exception as exc:
            _LOG.warning("is_model_ready of model instance '%s' raised %s", self.name, type(exc).__name__)
            return False
        if not isinstance(result, bool):
            _LOG.warning("is_model_ready of model instance '%s' returned a non-boolean", self.name)
            return False
        return result

    def start(self) -> concurrent.futures.Future[None]:
        self._thread.start()
        return self._ready

    def join(self, timeout: float | None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ---- instance thread ----

    def _main(self) -> None:
        set_thread_model(self.runtime.name, str(self.runtime.version_dir))
        try:
            module = import_model_module(self.runtime.model_file, f"{self.runtime.name}_{self.name}")
            self._model = module.TritonPythonModel()
            if hasattr(self._model, "initialize"):
                self._model.initialize(self.initialize_args())
        except BaseException as exc:  # reported as a load failure, never fatal to the host
            self._ready.set_exception(exc)
            return
        self.initialized = True
        self._ready.set_result(None)
        while (batch := self.runtime.next_batch()) is not None:
            self._execute([p.request for p in batch])
        self._finalize()

    def _execute(self, requests: list[InferenceRequest]) -> None:
        try:
            result = self._model.execute(requests)
            if asyncio.iscoroutine(result):
                result = self._run_coroutine(result, requests)
            self._process_returned(requests, result)
        except Exception as exc:
            self._fail_all(requests, exc)

    def _process_returned(self, requests: list[InferenceRequest], result: Any) -> None:
        # The checks and messages of Triton's Stub::ProcessReturnedResponses.
        if result is None:
            return
        if self.runtime.decoupled:
            raise HostCheckError(f"Python model '{self.name}' is using the decoupled mode and the execute "
                                 "function must return None.")
        if not isinstance(result, list):
            raise HostCheckError(f"Expected a list in the execute return, found type '{type(result)}'.")
        if len(result) != len(requests):
            raise HostCheckError(
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(result)}\n")
        for request, response in zip(requests, result):
            if response is None:
                continue
            if not isinstance(response, InferenceResponse):
                raise HostCheckError("Expected an 'InferenceResponse' object in the execute function return "
                                     f"list, found type '{type(response)}'.")
            request.get_response_sender()._send_returned(response)

    def _fail_all(self, requests: list[InferenceRequest], exc: BaseException) -> None:
        message = f"Failed to process the request(s) for model '{self.name}', message: {describe(exc)}"
        _LOG.error(message, exc_info=not isinstance(exc, HostCheckError))
        for request in requests:
            request.get_response_sender()._fail(message)

    def _run_coroutine(self, coro: Any, requests: list[InferenceRequest]) -> Any:
        if self._aloop is None:
            self._aloop = asyncio.new_event_loop()
            threading.Thread(target=self._aloop.run_forever, name=f"kvserve-host-{self.name}-aio",
                             daemon=True).start()
        future = asyncio.run_coroutine_threadsafe(coro, self._aloop)
        if not self.runtime.decoupled:
            return future.result()

        def done(f: concurrent.futures.Future[Any]) -> None:
            try:
                self._process_returned(requests, f.result())
            except Exception as exc:
                self._fail_all(requests, exc)

        future.add_done_callback(done)
        return None

    def _finalize(self) -> None:
        try:
            if hasattr(self._model, "finalize"):
                self._model.finalize()
        except Exception:
            _LOG.exception("finalize of model instance '%s' failed", self.name)
        finally:
            if self._aloop is not None:
                self._aloop.call_soon_threadsafe(self._aloop.stop)
            # Triton's stub process exits here, and the model's memory goes with it. In this one
            # process the model is dropped and its reference cycles collected now, so a model
            # unloaded (explicit model control) gives its weights and caches back before the next load.
            self._model = None
            gc.collect()
            _return_freed_memory()
