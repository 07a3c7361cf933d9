"""Compiles GrammarSpecs with xgrammar, off the engine thread, with a time bound and a bounded cache.

    caller thread            compile pool (2 threads)             engine thread
    submit(spec) ──────────► CompileJob: [cache hit] or compile ──► job.done? admit : wait
          │ cache hit: a done job at once, no thread hop                job.expired? reject 400

A job that is still compiling when its time is up is answered with a 400 by the engine; the
compile itself cannot be interrupted (xgrammar has no cancel), so it finishes in its pool thread
and its result still goes into the cache. Two pool threads bound what stuck compiles can cost;
jobs queued behind them time out the same way (their clock starts at submission).

xgrammar and the tokenizer's vocabulary table are loaded on the first constrained request, on a
pool thread: an engine that never sees one never pays for either (about 3 s of imports here).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from kvserve.backend.structured.spec import FIELD, GrammarSpec
from kvserve.backend.structured.string_bounds import bounded_strings_as_patterns
from kvserve.seam.error_wire import invalid

log = logging.getLogger("kvserve.engine.grammar")

COMPILE_TIMEOUT_S = 10.0
# Whitespace allowed between two JSON tokens. Unbounded, a small model can loop on newlines
# until max_tokens and return JSON cut short; 16 still fits pretty-printing a few levels deep.
MAX_JSON_WHITESPACE = 16
MAX_CACHED_GRAMMARS = 256
_POOL_THREADS = 2


class CompileJob:
    """One request's compile: done when `future` is; past `deadline` (monotonic) it is refused."""

    __slots__ = ("spec", "future", "deadline")

    def __init__(self, spec: GrammarSpec, future: Future, deadline: float) -> None:
        self.spec, self.future, self.deadline = spec, future, deadline

    def done(self) -> bool:
        return self.future.done()

    def expired(self, now: float | None = None) -> bool:
        return not self.future.done() and (now if now is not None else time.monotonic()) > self.deadline

    def result(self):
        """The CompiledGrammar; ValueError naming the field when it did not compile."""
        return self.future.result()


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: frozenset[int], *,
                 timeout_s: float = COMPILE_TIMEOUT_S, max_cached: int = MAX_CACHED_GRAMMARS) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = sorted(stop_token_ids)
        self.timeout_s = timeout_s
        self.max_cached = max_cached
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()
        self._setup_lock = threading.Lock()
        self._xgr_compiler = None
        self._pool: ThreadPoolExecutor | None = None
        self.compiles = 0  # compiles that ran (not cache hits), for tests and the benchmark
        # Called on a pool thread when a job finishes (the AsyncEngine wakes its loop with it).
        self.on_done: Callable[[], None] | None = None

    # ---- any thread -------------------------------------------------------------------------
    def submit(self, spec: GrammarSpec) -> CompileJob:
        deadline = time.monotonic() + self.timeout_s
        cached = self._cached(spec)
        if cached is not None:
            future: Future = Future()
            future.set_result(cached)
            return CompileJob(spec, future, deadline)
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(_POOL_THREADS, thread_name_prefix="kvserve-grammar")
            future = self._pool.submit(self.compile, spec)
        if self.on_done is not None:
            future.add_done_callback(lambda _f: self.on_done())
        return CompileJob(spec, future, deadline)

    def compile(self, spec: GrammarSpec):
        """Compile now on this thread (or take it from the cache); ValueError names the field."""
        cached = self._cached(spec)
        if cached is not None:
            return cached
        compiler = self._compiler()
        try:
            compiled = _compile(compiler, spec)
        except ValueError:
            raise
        except Exception as exc:  # xgrammar reports every bad grammar as a RuntimeError with a C++ location
            raise invalid(FIELD, f"the {spec.kind} constraint does not compile: {_reason(exc)}") from None
        with self._lock:
            self.compiles += 1
            self._cache[spec.key] = compiled
            self._cache.move_to_end(spec.key)
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)
        return compiled

    def cache_size(self) -> int:
        with self._lock:
            return len(self._cache)

    def shutdown(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    # ---- internals --------------------------------------------------------------------------
    def _cached(self, spec: GrammarSpec):
        with self._lock:
            compiled = self._cache.get(spec.key)
            if compiled is not None:
                self._cache.move_to_end(spec.key)
            return compiled

    def _compiler(self):
        with self._setup_lock:
            if self._xgr_compiler is None:
                import xgrammar as xgr
                info = tokenizer_info(self._tokenizer, self._vocab_size, self._stop_token_ids)
                # Its own cache is off: ours is keyed by the canonical spec and bounded by count.
                self._xgr_compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._xgr_compiler


def tokenizer_info(tokenizer, vocab_size: int, stop_token_ids: list[int]):
    """xgrammar's view of the model's vocabulary, from the `tokenizers` JSON (no transformers).

    The vocabulary type (byte-level BPE, byte-fallback SentencePiece, raw) is detected by
    xgrammar itself from the tokenizer's JSON, as its from_huggingface does."""
    import xgrammar as xgr
    backend_json = tokenizer.backend_json()
    metadata = xgr.TokenizerInfo._detect_metadata_from_hf(backend_json)
    vocab = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    return xgr.TokenizerInfo(vocab, metadata["vocab_type"], vocab_size=max(vocab_size, len(vocab)),
                             stop_token_ids=stop_token_ids, add_prefix_space=metadata["add_prefix_space"])


def _compile(compiler, spec: GrammarSpec):
    if spec.kind == "json":
        schema = bounded_strings_as_patterns(json.loads(spec.text))
        return compiler.compile_json_schema(json.dumps(schema), max_whitespace_cnt=MAX_JSON_WHITESPACE)
    if spec.kind == "json_object":
        # OpenAI's json_object is an object (xgrammar's builtin JSON grammar takes any value).
        return compiler.compile_json_schema('{"type": "object", "additionalProperties": true}',
                                            max_whitespace_cnt=MAX_JSON_WHITESPACE)
    if spec.kind == "regex":
        return compiler.compile_regex(spec.text)
    if spec.kind in ("choice", "grammar"):
        return compiler.compile_grammar(spec.text)
    if spec.kind == "structural_tag":
        import xgrammar as xgr
        try:
            tag = xgr.StructuralTag.from_json(json.loads(spec.text))
        except Exception as exc:
            raise invalid(FIELD, f"not a valid structural_tag: {_reason(exc)}") from None
        return compiler.compile_structural_tag(tag)
    raise invalid(FIELD, f"unknown constraint {spec.kind!r}")


def _reason(exc: BaseException) -> str:
    """xgrammar's first line without its '[time] /project/cpp/file.cc:123:' prefix (no paths to
    clients) and without any text of the grammar it may quote after it (errors quote no request)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    if ".cc:" in text:
        text = text.split(".cc:", 1)[1].split(":", 1)[-1].strip()
    for cut in (" near:", " The JSON string is", ": \""):
        text = text.split(cut, 1)[0]
    return text[:120]
