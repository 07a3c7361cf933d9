"""The body of model_repository/embed/1/model.py: a decoupled Triton Python-backend
model over EmbeddingBatcher.

`execute()` parses, tokenizes and checks each request and hands it to the
batcher, then returns; the batcher's thread runs the passes. Results go
through a queue to a response thread, which sends each request's one response
(FINAL) and, between sends, polls `is_cancelled()` so a client that went away
leaves the queue before its next pass. Decoupled because the batching is the
model's own (embed_batcher.py says why): a non-decoupled execute() would have
to hold Triton's instance thread until its requests' passes ran.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import threading

from kvserve.backend.embed.embed_batcher import (BatcherClosed, BatcherOverloaded, EmbeddingBatcher, EmbedJob,
                                                 EmbedResult)
from kvserve.backend.embed.embed_codec import embed_tensors, parse_embed_request
from kvserve.backend.embed.embed_telemetry import EmbedTelemetry
from kvserve.backend.embed.embedder import DEFAULT_EMBEDDING_MODEL, Embedder, EmbedderConfig
from kvserve.backend.triton import X_REQUEST_ID_PARAM
from kvserve.observability.thread_names import name_this_thread
from kvserve.seam.error_wire import ErrorKind, RequestError, WireError

log = logging.getLogger("kvserve.backend.embed")
_POLL_S = 0.01
ENV_PREFIX = "KVSERVE_EMBED_"


def embedder_config_from_triton(model_config: dict) -> EmbedderConfig:
    """Parameters from config.pbtxt, overridden by KVSERVE_EMBED_<NAME> environment variables.
    An empty `model` is the default embedding model, all-MiniLM-L6-v2, fetched into the cache."""
    values = {k: v.get("string_value", "") for k, v in (model_config.get("parameters") or {}).items()}
    values.update({k[len(ENV_PREFIX):].lower(): v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)})
    if not values.get("model"):
        from kvserve.backend.models import ensure_known_model
        values["model"] = str(ensure_known_model(DEFAULT_EMBEDDING_MODEL))
    if not values.get("served_model_name"):
        values["served_model_name"] = model_config.get("name") or "embed"
    return EmbedderConfig.from_strings(values)


def _gateway_request_id(request) -> str | None:
    try:
        value = json.loads(request.parameters() or "{}").get(X_REQUEST_ID_PARAM)
    except (AttributeError, json.JSONDecodeError, TypeError):
        return None
    return value[:128] if isinstance(value, str) and value else None


class TritonEmbedModel:
    def __init__(self, pb_utils, args: dict) -> None:
        self.pb = pb_utils
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException("kvserve's embed model must be decoupled")
        from kvserve.backend.triton import TritonLLMModel
        TritonLLMModel._setup_observability()
        self.config = embedder_config_from_triton(model_config)
        self.embedder = Embedder(self.config)
        metrics = self._backend_metrics(args)
        self._log_ids: dict[str, str] = {}
        self.batcher = EmbeddingBatcher(self.embedder, EmbedTelemetry(metrics, self.config.served_model_name,
                                                                      self._log_ids))
        self._ids = itertools.count()
        self._live: dict[str, object] = {}  # request id -> response sender
        self._results: queue.SimpleQueue[EmbedResult | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._respond_loop, name="kvserve-embed-respond", daemon=True)
        self._thread.start()
        log.info("kvserve embed model ready: %s (dimension=%d, max_model_len=%d, pooling=%s)", self.config.model,
                 self.embedder.dimension, self.embedder.max_model_len, self.embedder.pooling.mode)

    def _backend_metrics(self, args: dict):
        from kvserve.observability.metrics_catalogue import EMBED_METRICS
        from kvserve.observability.metrics_backend import BackendMetrics
        try:
            return BackendMetrics(self.pb, {"model": args.get("model_name", "embed"),
                                            "version": str(args.get("model_version", "1"))}, specs=EMBED_METRICS)
        except Exception:  # metrics unavailable (e.g. disabled in tritonserver): keep serving
            log.exception("embed model metrics disabled")
            return None

    def execute(self, requests) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                parsed = parse_embed_request(self.pb, request, self.embedder)
                rid = f"{request.request_id() or 'emb'}-{next(self._ids)}"
                self._live[rid] = sender
                gateway_id = _gateway_request_id(request)
                if gateway_id:
                    self._log_ids[rid] = gateway_id
                try:
                    self.batcher.submit(EmbedJob(rid, parsed.inputs, parsed.dimensions, parsed.normalize,
                                                 self._results.put, parsed.traceparent))
                except BaseException:
                    self._live.pop(rid, None)
                    self._log_ids.pop(rid, None)
                    raise
            except RequestError as exc:
                self._send_error(sender, exc.wire())
            except BatcherOverloaded as exc:
                self._send_error(sender, WireError(ErrorKind.OVERLOADED, f"unavailable: {exc}"))
            except BatcherClosed as exc:
                self._send_error(sender, WireError(ErrorKind.SHUTDOWN, f"unavailable: {exc}"))
            except Exception as exc:  # no traceback in the logs: it names files (debug level has it)
                log.error("could not queue an embedding request (%s)", type(exc).__name__)
                log.debug("queueing failure", exc_info=True)
                self._send_error(sender, WireError(ErrorKind.INTERNAL, "internal error while queueing the request"))
        return None

    def finalize(self) -> None:
        from kvserve.observability.tracing import flush_tracing
        self.batcher.shutdown()
        flush_tracing()
        self._stop.set()
        self._results.put(None)
        self._thread.join(timeout=10)

    # ---- response thread ----------------------------------------------------------------------
    def _respond_loop(self) -> None:
        name_this_thread()
        while not self._stop.is_set():
            batch = []
            try:
                batch.append(self._results.get(timeout=_POLL_S))
                while True:
                    batch.append(self._results.get_nowait())
            except queue.Empty:
                pass
            for result in batch:
                if result is None:
                    return
                self._send(result)
            self._check_cancellations()

    def _check_cancellations(self) -> None:
        for rid, sender in list(self._live.items()):
            try:
                cancelled = sender.is_cancelled()
            except Exception:
                cancelled = True
            if cancelled:
                self._live.pop(rid, None)
                self._log_ids.pop(rid, None)
                self.batcher.abort(rid)

    def _send(self, result: EmbedResult) -> None:
        sender = self._live.pop(result.request_id, None)
        if sender is None:
            return  # cancelled
        if result.error is not None:
            self._send_error(sender, WireError(result.error_kind or ErrorKind.INTERNAL, result.error))
            return
        try:
            response = self.pb.InferenceResponse(output_tensors=embed_tensors(self.pb, result.embeddings,
                                                                              result.prompt_tokens))
            sender.send(response, flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:
            log.error("sending an embedding response failed for %s (%s)", result.request_id, type(exc).__name__)
            log.debug("send failure", exc_info=True)

    def _send_error(self, sender, error: WireError) -> None:
        errors = self.pb.TritonError
        code = {ErrorKind.INVALID: errors.INVALID_ARG, ErrorKind.CONTEXT_LENGTH: errors.INVALID_ARG,
                ErrorKind.OVERLOADED: errors.UNAVAILABLE, ErrorKind.SHUTDOWN: errors.UNAVAILABLE}.get(
                    error.kind, errors.INTERNAL)  # what a direct client of tritonserver sees; the gateway reads the kind
        try:
            sender.send(self.pb.InferenceResponse(output_tensors=[], error=errors(error.format(), code)),
                        flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:
            log.error("sending an error response failed (%s)", type(exc).__name__)
