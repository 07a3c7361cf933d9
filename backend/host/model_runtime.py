"""One loaded version of a model: its config, its instances and their shared queue.

Requests wait in one queue that every instance thread pulls from (the default
scheduler: one request per execute). With `dynamic_batching` and a positive
max_batch_size an instance takes whatever is waiting, up to max_batch_size
requests, into one execute call, without the batcher's delay.
"""
from __future__ import annotations

import enum
import logging
import queue
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from . import pb_utils
from .infer_errors import InferError
from .host_metrics import HostMetrics
from .model_config import (
    ConfigError, config_from_dict, config_to_json, instance_kind_name, is_decoupled, model_filename, normalize,
)
from .model_instance import ModelInstance, describe, import_model_module
from .pb_utils.triton_errors import TritonError
from .pb_utils.inference_request import InferenceRequest
from .request_handle import RequestHandle

_LOG = logging.getLogger("kvserve.host")


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    UNLOADED = "UNLOADED"


@dataclass(slots=True)
class PendingRequest:
    request: InferenceRequest
    handle: RequestHandle
    enqueued_ns: int


class ModelRuntime:
    def __init__(self, *, name: str, version: int, model_dir: Path, config: mc.ModelConfig,
                 metrics: HostMetrics) -> None:
        self.name = name
        self.version = version
        self.version_str = str(version)
        self.model_dir = model_dir
        self.version_dir = model_dir / str(version)
        self.metrics = metrics
        self.state = ModelState.LOADING
        self.reason = ""
        self._queue: queue.SimpleQueue[PendingRequest | None] = queue.SimpleQueue()
        self._instances: list[ModelInstance] = []
        self._set_config(config)

    def _set_config(self, config: mc.ModelConfig) -> None:
        self.config = config
        self.config_json = config_to_json(config)
        self.decoupled = is_decoupled(config)
        self.model_file = self.version_dir / model_filename(config)
        dynamic = config.HasField("dynamic_batching") and config.max_batch_size > 0
        self._max_batch = config.max_batch_size if dynamic else 1

    # ---- loading ----

    def load(self) -> None:
        """Blocking; never raises: a failure leaves this version UNAVAILABLE with a reason."""
        try:
            self._auto_complete()
            instances = self._plan_instances()
            futures = [(inst, inst.start()) for inst in instances]
            errors = []
            for inst, future in futures:
                try:
                    future.result()
                except BaseException as exc:
                    errors.append(f"model instance '{inst.name}': {describe(exc)}")
            self._instances = [inst for inst in instances if inst.initialized]
            if errors:
                self._stop_instances(timeout=30.0)
                raise ConfigError("failed to initialize " + "; ".join(errors))
            self.state = ModelState.READY
            self.metrics.model_loaded(self.name, self.version_str)
            _LOG.info("successfully loaded '%s' version %s", self.name, self.version)
        except Exception as exc:
            self.state = ModelState.UNAVAILABLE
            detail = str(exc) if isinstance(exc, ConfigError) else describe(exc)
            self.reason = f"failed to load '{self.name}' version {self.version}: {detail}"
            _LOG.error("%s", self.reason)

    def _auto_complete(self) -> None:
        # Like Triton: a throwaway import, so state set here never reaches the instances.
        module = import_model_module(self.model_file, f"{self.name}_autocomplete")
        sys.modules.pop(module.__name__, None)
        hook = getattr(module.TritonPythonModel, "auto_complete_config", None)
        if hook is None:
            return
        result = hook(pb_utils.ModelConfig(self.config_json))
        if not isinstance(result, pb_utils.ModelConfig):
            raise ConfigError(f"auto_complete_config function in model '{self.name}' must return a valid "
                              "pb.ModelConfig object.")
        self._set_config(normalize(config_from_dict(result._model_config), self.model_dir))

    def _plan_instances(self) -> list[ModelInstance]:
        instances = []
        for group in self.config.instance_group:
            devices = list(group.gpus) if group.kind == mc.ModelInstanceGroup.KIND_GPU else [0]
            index = 0
            for device in devices:
                for _ in range(group.count):
                    instances.append(ModelInstance(self, name=f"{group.name}_{index}",
                                                   kind=instance_kind_name(group.kind), device_id=device))
                    index += 1
        return instances

    # ---- serving ----

    def user_ready(self) -> bool:
        """Every instance's model says it is ready (see ModelInstance.user_ready)."""
        return all(inst.user_ready() for inst in self._instances)

    def submit(self, request: InferenceRequest, handle: RequestHandle) -> None:
        if self.state != ModelState.READY:
            raise InferError(TritonError.UNAVAILABLE,
                             f"Request for unknown model: '{self.name}' version {self.version} is not at ready state")
        self.metrics.pending_delta(self.name, self.version_str, 1)
        self._queue.put(PendingRequest(request, handle, time.monotonic_ns()))

    def next_batch(self) -> list[PendingRequest] | None:
        """Called by instance threads; None tells the instance to finalize and exit."""
        first = self._queue.get()
        if first is None:
            return None
        batch = [first]
        while len(batch) < self._max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)  # leave the stop signal for its owner
                break
            batch.append(item)
        now = time.monotonic_ns()
        self.metrics.pending_delta(self.name, self.version_str, -len(batch))
        self.metrics.executed(self.name, self.version_str)
        for pending in batch:
            pending.handle.queue_us = (now - pending.enqueued_ns) / 1000.0
        return batch

    def shutdown(self, timeout: float = 30.0) -> None:
        if self.state == ModelState.READY:
            self.state = ModelState.UNLOADED
        self._stop_instances(timeout)

    def _stop_instances(self, timeout: float) -> None:
        for _ in self._instances:
            self._queue.put(None)
        deadline = time.monotonic() + timeout
        for inst in self._instances:
            if not inst.join(max(0.0, deadline - time.monotonic())):
                _LOG.warning("model instance '%s' did not stop within %.0fs", inst.name, timeout)
        self._instances = []
