"""The body of model_repository/llm/1/model.py: a Triton Python-backend model over AsyncEngine.

`execute()` only parses and hands requests to the engine, then returns (the
model is decoupled). The engine thread's callbacks drop outputs into a queue; a
response thread turns them into InferenceResponses and sends them, and between
sends polls `is_cancelled()` on every live request, so a client that went away
is aborted (its KV blocks freed) within one engine step. The response thread
alone owns the live requests: `execute()` registers each one through the same
queue, ahead of anything the engine can say about it. Everything used from
Triton is passed in as `pb_utils`, which is Triton's own module in tritonserver
and the embedded host's in kvserve.
"""
from __future__ import annotations

import gc
import itertools
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from kvserve.backend.engine import (AsyncEngine, CompletionOutput, EngineClosed, EngineConfig, EngineOverloaded,
                                    RequestOutput, env_overrides)
from kvserve.backend.models import DEFAULT_CHAT_MODEL, resolve_model_arg
from kvserve.backend.triton.lora_adapters import (LoRAAdapters, listing_text, lora_control_text,
                                                  lora_settings_from_triton)
from kvserve.backend.triton.model_tensors import (ChoiceTotals, choice_tensors, describe_tensors, engine_control_action,
                                                  is_describe_request, parse_request, prompt_logprob_tensors,
                                                  text_tensors)
from kvserve.backend.triton.telemetry import EngineTelemetry, RequestLog
from kvserve.observability.thread_names import name_this_thread
from kvserve.seam import tensors as T
from kvserve.seam.error_wire import ErrorKind, RequestError, WireError

log = logging.getLogger("kvserve.backend")
# How long the response thread waits for outputs before it sweeps for cancellations anyway. While
# requests generate, every engine step wakes it (and it sweeps after each); this bounds only how
# late an idle or waiting request's cancellation is seen. Each wake-up on a 2-core machine
# preempts a thread of the engine's OpenMP team, so it is not shorter than it needs to be
# (at 10 ms the idle wake-ups were most of this thread's CPU, ~4 sweeps per 40 ms step).
_POLL_S = 0.05
# After the engine stopped for good (a lost tensor-parallel worker): how long the error responses
# get to leave before the process exits, and its status (a supervisor restarts it).
_FATAL_FLUSH_S = 2.0
EXIT_ENGINE_LOST = 1


@dataclass(slots=True, eq=False)
class _Live:
    request_id: str
    sender: object
    stream: bool
    logprobs: int | None  # the request's k (None: no logprobs)
    prompt_logprobs: int | None = None  # the request's prompt_logprobs k
    # The engine's prompt logprobs until a response carries them (a whole response waits for its end).
    pending_prompt: list | None = None
    totals: dict[int, ChoiceTotals] = field(default_factory=dict)
    log: RequestLog | None = None  # its request-scoped log lines
    held: dict[int, CompletionOutput] = field(default_factory=dict)  # streamed tokens waiting for stream_interval
    started: set[int] = field(default_factory=set)  # choices whose first response went out


def engine_config_from_triton(model_config: dict) -> EngineConfig:
    """Parameters from config.pbtxt, overridden by KVSERVE_* environment variables."""
    values = {k: v.get("string_value", "") for k, v in (model_config.get("parameters") or {}).items()}
    values.update(env_overrides())
    values = {k: v for k, v in values.items() if k in EngineConfig.setting_names()}
    given = values.get("model", "")
    values["model"] = resolve_model_arg(given)
    if not values.get("served_model_name"):
        # As vLLM names a model: the `model` argument as given (the default model's name when
        # empty), not Triton's model name ("llm"), which no OpenAI client calls it by. A gateway
        # learns it with a describe request (seam.tensors.DESCRIBE_PARAM).
        values["served_model_name"] = given or DEFAULT_CHAT_MODEL
    return EngineConfig.from_strings(values)


class TritonLLMModel:
    def __init__(self, pb_utils, args: dict) -> None:
        self.pb = pb_utils
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException("kvserve's llm model must be decoupled")
        self._setup_observability()
        self.config = engine_config_from_triton(model_config)
        lora_settings = lora_settings_from_triton(model_config)  # refused before the weights load
        metrics = self._backend_metrics(args)
        max_loras = self.config.max_loras if self.config.enable_lora else 0
        self.telemetry = EngineTelemetry(metrics, self.config.model_name, max_loras)
        self.engine = AsyncEngine(self.config, [self.telemetry])
        self.engine.on_fatal = self._exit_after_fatal
        if metrics is not None:
            metrics.on_cache_config(self.config.block_size, self.config.kv_cache_dtype,
                                    self.config.enable_prefix_caching, self.engine.engine.runner.num_blocks)
        self.lora = LoRAAdapters(self.engine, lora_settings, enabled=self.config.enable_lora,
                                 base_model_name=self.config.model_name)
        try:
            self.lora.load_startup_modules()
        except Exception:
            self.engine.shutdown()
            raise
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()
        self._live: dict[str, _Live] = {}  # the response thread's alone
        # (live, None): a new request; (live, output); (live, error): refused at admission; None: stop.
        self._outputs: queue.SimpleQueue[tuple[_Live, RequestOutput | WireError | None] | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._respond_loop, name="kvserve-respond", daemon=True)
        self._thread.start()
        # What loading made (the model, the tokenizer: ~300k objects here) lives as long as the model.
        # Frozen, Python's full collections stop walking it on the engine's thread between decode
        # steps (a batch-1 step 0.97x, BENCHMARKS.md §7); finalize() hands it back.
        gc.collect()
        gc.freeze()
        log.info("kvserve model ready: %s (max_model_len=%d)", self.config.model, self.engine.max_model_len)

    @staticmethod
    def _setup_observability() -> None:
        from kvserve.observability.logging import configure_logging, logging_configured
        from kvserve.observability.tracing import setup_tracing
        if not logging_configured():  # tritonserver's stub: nobody did (the embedded host has)
            configure_logging()
        setup_tracing(os.environ.get("KVSERVE_OTLP_TRACES_ENDPOINT") or None, service_name="kvserve-backend")

    def _backend_metrics(self, args: dict):
        from kvserve.observability.metrics_backend import BackendMetrics
        try:
            return BackendMetrics(self.pb, {"model": args.get("model_name", "llm"),
                                            "version": str(args.get("model_version", "1"))})
        except Exception:  # metrics unavailable (e.g. disabled in tritonserver): keep serving
            log.exception("backend metrics disabled")
            return None

    # ---- Triton entry points ------------------------------------------------------------------
    def execute(self, requests) -> None:
        arrival = time.time()  # a request's `timeout` counts from here, tokenization included
        for request in requests:
            sender = request.get_response_sender()
            if is_describe_request(request):
                self._describe(sender)
                continue
            control = lora_control_text(request)
            if control is not None:  # a load reads files: off the thread that queues requests
                threading.Thread(target=self._control, args=(sender, self._lora_control, control),
                                 name="kvserve-lora-control", daemon=True).start()
                continue
            action = engine_control_action(request)
            if action is not None:  # it waits for the engine thread: off the thread that queues requests
                threading.Thread(target=self._control, args=(sender, self._engine_control, action),
                                 name="kvserve-engine-control", daemon=True).start()
                continue
            try:
                parsed = parse_request(self.pb, request)
            except ValueError as exc:
                self._send_error(sender, _wire_error(exc))
                continue
            rid = f"{request.request_id() or 'req'}-{next(self._ids)}"
            live = _Live(rid, sender, parsed.stream, parsed.params.logprobs, parsed.params.prompt_logprobs,
                         log=RequestLog.for_request(request, rid, parsed.traceparent))
            self._outputs.put((live, None))
            try:
                # Resolved here, once: a request queued with an adapter keeps it even if it is
                # unloaded before the request runs (the engine never frees it under a request).
                lora = {} if parsed.lora_name is None else {"lora_request": self.lora.resolve(parsed.lora_name)}
                self.telemetry.request_adapter(rid, parsed.lora_name)
                self.engine.add_request(rid, parsed.prompt, parsed.params,
                                        lambda out, live=live: self._outputs.put((live, out)),
                                        parsed.traceparent, arrival, **lora)
            except Exception as exc:
                self.telemetry.request_adapter(rid, None)
                self._outputs.put((live, _wire_error(exc)))
                continue
            live.log.queued(parsed.prompt, parsed.params, parsed.stream, self.tokenizer)
        return None

    def _describe(self, sender) -> None:
        facts = {"max_model_len": self.engine.max_model_len, "served_model_name": self.config.model_name,
                 "enable_lora": self.lora.enabled}
        try:
            sender.send(self.pb.InferenceResponse(output_tensors=describe_tensors(self.pb, facts)),
                        flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:
            log.error("sending the model's description failed (%s)", type(exc).__name__)

    def _control(self, sender, answer: Callable[[str], str], order: str) -> None:
        """A control request (LoRA adapters: seam.tensors.LORA_CONTROL_PARAM, the engine:
        ENGINE_CONTROL_PARAM): one FINAL answer, the text `answer` makes of its order, or its error."""
        try:
            text = answer(order)
        except Exception as exc:
            self._send_error(sender, _wire_error(exc))
            return
        try:
            sender.send(self.pb.InferenceResponse(output_tensors=text_tensors(self.pb, text)),
                        flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:
            log.error("sending a control answer failed (%s)", type(exc).__name__)

    def _lora_control(self, order: str) -> str:
        return listing_text(self.lora.control(order))

    def _engine_control(self, action: str) -> str:
        if action not in T.ENGINE_ACTIONS:
            raise RequestError(f"{T.ENGINE_CONTROL_PARAM}: action must be one of {', '.join(T.ENGINE_ACTIONS)}",
                               T.ENGINE_CONTROL_PARAM)
        return json.dumps({"action": action, "forgotten_blocks": self.engine.reset_prefix_cache()})

    def _exit_after_fatal(self, exc: BaseException) -> None:
        """The engine cannot step again: let the failed requests' responses go, then end the process
        (tritonserver's stub or the embedded host) with a non-zero status; readiness is False meanwhile."""
        def leave() -> None:
            deadline = time.monotonic() + _FATAL_FLUSH_S
            while time.monotonic() < deadline and (not self._outputs.empty() or self._live):
                time.sleep(0.05)
            log.critical("exiting with status %d: %s", EXIT_ENGINE_LOST, exc)
            logging.shutdown()
            os._exit(EXIT_ENGINE_LOST)
        threading.Thread(target=leave, name="kvserve-fatal-exit", daemon=True).start()

    def is_model_ready(self) -> bool:
        """Triton Python backend's user-defined readiness (ModelReady RPC): False
        while the engine is unhealthy, e.g. for a few seconds after a failed step."""
        return self.engine.healthy()

    def finalize(self) -> None:
        from kvserve.observability.tracing import flush_tracing
        self.engine.shutdown()
        flush_tracing()  # the spans of the last requests (a stub process may not run atexit)
        self._stop.set()
        self._outputs.put(None)
        self._thread.join(timeout=10)
        gc.unfreeze()  # what the model leaves in reference cycles (its engine and callbacks) can go

    # ---- response thread ----------------------------------------------------------------------
    def _respond_loop(self) -> None:
        name_this_thread()
        while not self._stop.is_set():
            # Send everything one engine step produced, then poll cancellations once per batch
            # (not once per response: that would be quadratic in the number of live requests).
            batch = []
            try:
                batch.append(self._outputs.get(timeout=_POLL_S))
                while True:
                    batch.append(self._outputs.get_nowait())
            except queue.Empty:
                pass
            for item in batch:
                if item is None:
                    return
                live, what = item
                if what is None:
                    self._live[live.request_id] = live
                elif isinstance(what, WireError):
                    self._live.pop(live.request_id, None)
                    self._send_error(live.sender, what)
                else:
                    self._send_output(live, what)
            self._check_cancellations()

    def _check_cancellations(self) -> None:
        for rid, live in list(self._live.items()):
            try:
                cancelled = live.sender.is_cancelled()
            except Exception:
                cancelled = True
            if cancelled:
                self._live.pop(rid, None)
                self.engine.abort(rid)

    def _send_output(self, live: _Live, out: RequestOutput) -> None:
        if live.request_id not in self._live and not out.finished:
            return  # cancelled: the engine's final output for it is dropped below
        try:
            if out.error is not None:
                self._send_error(live.sender, WireError(out.error_kind or ErrorKind.INTERNAL, out.error,
                                                        out.error_param))
                return
            if out.prompt_logprobs is not None:
                live.pending_prompt = out.prompt_logprobs
            responses = []
            for choice in self._due_choices(live, out):
                totals = live.totals[choice.index]  # _due_choices counted its tokens there
                if not live.stream:
                    totals.text.append(choice.text)
                    totals.token_ids.extend(choice.token_ids)
                    totals.logprobs.extend(choice.logprobs or [])
                    if choice.finish_reason is None:
                        continue
                    choice.text, choice.token_ids = "".join(totals.text), totals.token_ids
                    choice.logprobs = totals.logprobs
                tensors = choice_tensors(self.pb, choice, totals, len(out.prompt_token_ids),
                                         out.num_cached_tokens, live.logprobs)
                if live.pending_prompt is not None:  # before any choice's first token reaches the client
                    tensors += prompt_logprob_tensors(self.pb, out.prompt_token_ids, live.pending_prompt,
                                                      live.prompt_logprobs or 0)
                    live.pending_prompt = None
                responses.append(self.pb.InferenceResponse(output_tensors=tensors))
            final = self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if out.finished else 0
            if live.request_id not in self._live:
                responses = []  # cancelled by the client: only close the stream
            for i, response in enumerate(responses):
                live.sender.send(response, flags=final if i == len(responses) - 1 else 0)
            if final and not responses:
                live.sender.send(flags=final)
        except Exception as exc:
            log.error("sending a response failed for %s (%s)", live.request_id, type(exc).__name__)
            log.debug("send failure", exc_info=True)
            self.engine.abort(live.request_id)
        finally:
            if out.finished:
                self._live.pop(live.request_id, None)
                if live.log is not None:
                    live.log.finished(out)

    def _due_choices(self, live: _Live, out: RequestOutput) -> list[CompletionOutput]:
        """The choices of `out` to send now, counting their tokens. Streamed tokens
        wait until stream_interval of them are due, merged into one delta; a
        choice's first response (time to first token) and its last never wait."""
        due = []
        for choice in out.outputs:
            live.totals.setdefault(choice.index, ChoiceTotals()).completion_tokens += len(choice.token_ids)
            if not live.stream:
                due.append(choice)
                continue
            held = live.held.pop(choice.index, None)
            if held is not None:
                choice = _merge(held, choice)
            if (self.config.stream_interval > 1 and choice.index in live.started
                    and choice.finish_reason is None and len(choice.token_ids) < self.config.stream_interval):
                live.held[choice.index] = choice
                continue
            live.started.add(choice.index)
            due.append(choice)
        if out.finished:  # e.g. an abort: nothing may stay behind the final response
            due.extend(live.held.pop(index) for index in sorted(live.held))
        return due

    def _send_error(self, sender, error: WireError) -> None:
        try:
            triton_error = self.pb.TritonError(error.format(), self._triton_code(error.kind))
            sender.send(self.pb.InferenceResponse(output_tensors=[], error=triton_error),
                        flags=self.pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as exc:
            log.error("sending an error response failed (%s)", type(exc).__name__)

    def _triton_code(self, kind: ErrorKind):
        """The gRPC status a direct client of tritonserver sees (the gateway reads the kind)."""
        errors = self.pb.TritonError
        if kind in (ErrorKind.INVALID, ErrorKind.CONTEXT_LENGTH):
            return errors.INVALID_ARG
        if kind in (ErrorKind.OVERLOADED, ErrorKind.SHUTDOWN, ErrorKind.TIMEOUT):
            return errors.UNAVAILABLE
        if kind is ErrorKind.NOT_FOUND:
            return errors.NOT_FOUND
        return errors.INTERNAL


def _wire_error(exc: Exception) -> WireError:
    """What the client is told when a request cannot be queued."""
    if isinstance(exc, RequestError):
        return exc.wire()
    if isinstance(exc, ValueError):
        return WireError(ErrorKind.INVALID, str(exc))
    if isinstance(exc, (EngineOverloaded, EngineClosed)):
        return WireError(exc.kind, f"unavailable: {exc}")
    # No traceback in the logs: it names files (debug level has it).
    log.error("could not queue a request (%s)", type(exc).__name__)
    log.debug("queueing failure", exc_info=True)
    return WireError(ErrorKind.INTERNAL, "internal error while queueing the request")


def _merge(first: CompletionOutput, then: CompletionOutput) -> CompletionOutput:
    """One delta carrying `first` followed by `then` (same choice)."""
    logprobs = None
    if first.logprobs is not None or then.logprobs is not None:
        logprobs = [*(first.logprobs or []), *(then.logprobs or [])]
    return CompletionOutput(index=then.index, text=first.text + then.text,
                            token_ids=[*first.token_ids, *then.token_ids], finish_reason=then.finish_reason,
                            stop_reason=then.stop_reason, logprobs=logprobs)
