"""The model repository: which models and versions exist, their load state, lookups.

Models load in parallel; one failing (bad config, no version, initialize
raising) is reported as not ready with a reason and never stops the others.

With explicit model control, load_model() and unload_model() (the
RepositoryModelLoad / RepositoryModelUnload RPCs) change what is served while
the host runs. They run on the event loop, one at a time per model, and do
their blocking work (initialize, finalize) in threads. A reload loads the new
versions beside the old ones and swaps only when all of them are READY, so a
broken model.py never takes down a model that was serving.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Coroutine, Iterable

from tritonclient.grpc import model_config_pb2 as mc

from .infer_errors import InferError
from .host_metrics import HostMetrics
from .model_config import ConfigError, normalize, parse_config_file, select_versions
from .model_runtime import ModelRuntime, ModelState
from .pb_utils.triton_errors import TritonError

_LOG = logging.getLogger("kvserve.host")
CONFIG_FILE = "config.pbtxt"
_INT64_MAX = 2**63 - 1  # model versions are int64 in tritonserver
POLLING_ENABLED = "explicit model load / unload is not allowed if polling is enabled"  # tritonserver's words


@dataclass(slots=True)
class ModelEntry:
    name: str
    model_dir: Path
    config: mc.ModelConfig | None = None
    versions: dict[int, ModelRuntime] = field(default_factory=dict)
    error: str = ""  # a failure before any version could be tried

    def ready_versions(self) -> list[int]:
        return sorted(v for v, rt in self.versions.items() if rt.state == ModelState.READY)


def parse_version(version: str) -> int:
    """A request's model version string as a number; INVALID_ARG otherwise. The message is
    tritonserver's without the string itself: a client's bytes are never repeated back."""
    # "-1", "abc", "1.0", " 1" and "²" are refused, and so is anything past an int64 (Python's
    # own conversion error, beyond 4300 digits, was an UNKNOWN quoting the limit).
    if not (version.isascii() and version.isdigit()) or len(version) > 19 or int(version) > _INT64_MAX:
        raise InferError(TritonError.INVALID_ARG,
                         "failed to get model version from specified version string, "
                         "version should be an integral value > 0")
    return int(version)


class ModelRepository:
    def __init__(self, root: str | Path, metrics: HostMetrics, explicit_control: bool = False) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"model repository '{self.root}' is not a directory")
        self.metrics = metrics
        self.entries: dict[str, ModelEntry] = {}
        # Models in the repository that explicit model control did not load: the index lists them
        # by name alone, as tritonserver's does ("every model available ... even if not loaded").
        self.not_loaded: list[str] = []
        # Versions that served and were unloaded since (explicit model control): tritonserver keeps
        # them in its index as UNAVAILABLE, reason "unloaded", until they load again.
        self.unloaded: dict[str, set[int]] = {}
        # --model-control-mode=explicit: load_model() and unload_model() are allowed.
        self.explicit_control = explicit_control
        self._control_locks: dict[str, asyncio.Lock] = {}
        self._control_tasks: set[asyncio.Task[None]] = set()

    def scan(self, only: frozenset[str] | None = None) -> None:
        """Find the models; with `only` (explicit model control) just those, and a name
        that is not in the repository is a failed model, as tritonserver reports it."""
        found = set()
        for model_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            if not (model_dir / CONFIG_FILE).is_file():
                continue
            if only is not None and model_dir.name not in only:
                self.not_loaded.append(model_dir.name)
                continue
            found.add(model_dir.name)
            self.entries[model_dir.name] = self._read_model(model_dir)
        for name in sorted((only or set()) - found):
            self.entries[name] = ModelEntry(name, self.root / name, error="failed to poll from model repository")
            _LOG.error("failed to load '%s': not found in the model repository", name)

    def _read_model(self, model_dir: Path) -> ModelEntry:
        """A model directory as an entry with one runtime (not yet loaded) per selected version;
        a bad config or no version to serve leaves the reason in `error` instead."""
        entry = ModelEntry(model_dir.name, model_dir)
        try:
            config = normalize(parse_config_file(model_dir / CONFIG_FILE), model_dir)
            entry.config = config
            versions = select_versions(model_dir, config)
            if not versions:
                raise ConfigError(f"at least one version must be available under the version policy of "
                                  f"model '{entry.name}'")
            for v in versions:
                entry.versions[v] = ModelRuntime(name=entry.name, version=v, model_dir=model_dir,
                                                 config=config, metrics=self.metrics)
        except (ConfigError, OSError) as exc:  # OSError: the files changed under a running host
            entry.error = str(exc)
            _LOG.error("failed to load '%s': %s", entry.name, exc)
        return entry

    def load_all(self) -> None:
        _load_runtimes([rt for e in self.entries.values() for rt in e.versions.values()])

    def lookup(self, name: str, version: str = "") -> ModelRuntime:
        """The runtime that serves (name, version); "" means the latest ready version."""
        entry = self.entries.get(name)
        unloaded = self.unloaded.get(name, set())
        if entry is None and not unloaded:
            raise InferError(TritonError.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        if not version:
            ready = entry.ready_versions() if entry is not None else []
            if not ready:  # NOT_FOUND, as tritonserver's lifecycle answers it
                raise InferError(TritonError.NOT_FOUND,
                                 f"Request for unknown model: '{name}' has no available versions")
            return entry.versions[ready[-1]]  # type: ignore[union-attr]
        number = parse_version(version)
        runtime = entry.versions.get(number) if entry is not None else None
        if runtime is None and number not in unloaded:
            raise InferError(TritonError.NOT_FOUND,
                             f"Request for unknown model: '{name}' version {number} is not found")
        if runtime is None or runtime.state != ModelState.READY:
            raise InferError(TritonError.UNAVAILABLE,
                             f"Request for unknown model: '{name}' version {number} is not at ready state")
        return runtime

    def model_ready(self, name: str, version: str = "") -> bool:
        """Loaded and, when the model defines `is_model_ready()`, ready by its own account."""
        try:
            return self.lookup(name, version).user_ready()
        except InferError:
            return False

    def all_ready(self) -> bool:
        """tritonserver's strict readiness: every model in the repository is ready."""
        return all(e.versions and not e.error and all(rt.state == ModelState.READY for rt in e.versions.values())
                   for e in self.entries.values())

    def index(self) -> list[tuple[str, str, str, str]]:
        rows = []
        for entry in self.entries.values():
            if not entry.versions:
                rows.append((entry.name, "", ModelState.UNAVAILABLE.value, entry.error))
            for v, rt in sorted(entry.versions.items()):
                rows.append((entry.name, str(v), rt.state.value, rt.reason))
        for name, versions in self.unloaded.items():
            rows.extend((name, str(v), ModelState.UNAVAILABLE.value, "unloaded") for v in versions)
        rows.extend((name, "", "", "") for name in self.not_loaded if name not in self.unloaded)
        return sorted(rows)

    def shutdown(self, timeout: float = 30.0) -> None:
        for entry in self.entries.values():
            _shutdown_runtimes(entry.versions.values(), timeout)

    # ---- explicit model control (RepositoryModelLoad / RepositoryModelUnload) ----

    async def load_model(self, name: str) -> None:
        """Load model `name` from its directory, or reload it when it is loaded. Raises InferError:
        UNAVAILABLE without explicit model control, INVALID_ARG for a name that is not a model of
        this repository, INTERNAL when the load fails (a model that was READY keeps serving)."""
        self._require_explicit_control()
        model_dir = self._model_dir_of(name)
        if model_dir is None:
            raise InferError(TritonError.INVALID_ARG, f"failed to load '{name}', failed to poll from model repository")
        await self._finish_even_if_cancelled(self._load_locked(name, model_dir))

    async def unload_model(self, name: str, on_taken_out: Callable[[], None] | None = None) -> None:
        """Unload every version of model `name`. As in tritonserver a model that is not loaded, or
        not in the repository at all, unloads successfully (nothing to do). `on_taken_out` is
        called once the model takes no new requests, before its versions finish and finalize."""
        self._require_explicit_control()
        if name in self.entries or self._model_dir_of(name) is not None:
            await self._finish_even_if_cancelled(self._unload_locked(name, on_taken_out))
        elif on_taken_out is not None:
            on_taken_out()

    async def wait_for_model_control(self) -> None:
        """Let loads and unloads under way finish, so that shutdown() finalizes what they loaded."""
        if self._control_tasks:
            await asyncio.gather(*self._control_tasks, return_exceptions=True)

    def _require_explicit_control(self) -> None:
        if not self.explicit_control:
            raise InferError(TritonError.UNAVAILABLE, POLLING_ENABLED)

    def _model_dir_of(self, name: str) -> Path | None:
        """The directory of model `name` in this repository (one with a config.pbtxt), or None.
        Only a plain directory name is looked up: a client's "../x" never reaches outside the root."""
        if not _is_plain_name(name):
            return None
        model_dir = self.root / name
        return model_dir if model_dir.is_dir() and (model_dir / CONFIG_FILE).is_file() else None

    async def _finish_even_if_cancelled(self, work: Coroutine[Any, Any, None]) -> None:
        # A client that gives up (deadline, disconnect) cancels its RPC. Cut short, a load would
        # leave initialized instances that nobody finalizes and release the model's lock mid-swap;
        # so the work is a task of its own that the RPC merely waits for.
        task = asyncio.ensure_future(work)
        self._control_tasks.add(task)
        task.add_done_callback(self._control_task_done)
        await asyncio.shield(task)

    def _control_task_done(self, task: asyncio.Task[None]) -> None:
        self._control_tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved here too: a caller that went away must not leave it unread

    def _lock_for(self, name: str) -> asyncio.Lock:
        # One lock per model: loads and unloads of one model never interleave, others run alongside.
        return self._control_locks.setdefault(name, asyncio.Lock())

    async def _load_locked(self, name: str, model_dir: Path) -> None:
        async with self._lock_for(name):
            candidate = self._read_model(model_dir)
            await asyncio.to_thread(_load_runtimes, list(candidate.versions.values()))
            failure = _load_failure(candidate)
            if failure:
                await self._settle_failed_load(candidate)
                raise InferError(TritonError.INTERNAL, failure)
            current = self.entries.get(name)
            self._install(candidate)  # new requests go to the new runtimes from here on
            if current is not None:
                self._mark_unloaded(current)  # versions the new load no longer has
                await self._retire(current)

    async def _settle_failed_load(self, candidate: ModelEntry) -> None:
        """As tritonserver since core PR #102: a model that was serving keeps serving as it was.
        One with nothing READY is shown failed, with the reason, as a failed start-up load is."""
        await self._retire(candidate)  # versions that did load are finalized: a model loads whole or not at all
        current = self.entries.get(candidate.name)
        if current is not None and current.ready_versions():
            return
        self._install(candidate)
        if current is not None:
            await self._retire(current)

    async def _unload_locked(self, name: str, on_taken_out: Callable[[], None] | None) -> None:
        async with self._lock_for(name):
            entry = self.entries.pop(name, None)  # from here lookups answer "unknown model"
            if on_taken_out is not None:
                on_taken_out()
            if entry is None:
                return
            if self._model_dir_of(name) is not None and name not in self.not_loaded:
                self.not_loaded.append(name)
            self._mark_unloaded(entry)
            await self._retire(entry)
            _LOG.info("successfully unloaded '%s'", name)

    def _install(self, entry: ModelEntry) -> None:
        self.entries[entry.name] = entry
        if entry.name in self.not_loaded:
            self.not_loaded.remove(entry.name)
        gone = self.unloaded.pop(entry.name, set()) - set(entry.versions)
        if gone:
            self.unloaded[entry.name] = gone

    def _mark_unloaded(self, entry: ModelEntry) -> None:
        """`entry` leaves the repository: its serving versions that no installed entry of the same
        name serves are shown unloaded. A version that never served (a failed load) is not."""
        serving = self.entries.get(entry.name)
        kept = set(serving.versions) if serving is not None and serving is not entry else set()
        gone = set(entry.ready_versions()) - kept
        if gone:
            self.unloaded.setdefault(entry.name, set()).update(gone)

    async def _retire(self, entry: ModelEntry) -> None:
        """Shut an entry's versions down (requests already queued finish first) and drop the
        metrics of the versions this model no longer serves."""
        runtimes = list(entry.versions.values())
        _stop_accepting(runtimes)
        await asyncio.to_thread(_shutdown_runtimes, runtimes)
        serving = self.entries.get(entry.name)
        still_served = set(serving.ready_versions()) if serving is not None else set()
        for version in entry.versions:
            if version not in still_served:
                self.metrics.model_unloaded(entry.name, str(version))


def _is_plain_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\0")


def _load_runtimes(runtimes: list[ModelRuntime]) -> None:
    """Blocking: load every runtime, in parallel (ModelRuntime.load never raises)."""
    if not runtimes:
        return
    with ThreadPoolExecutor(max_workers=min(8, len(runtimes)), thread_name_prefix="kvserve-load") as pool:
        list(pool.map(ModelRuntime.load, runtimes))


def _shutdown_runtimes(runtimes: Iterable[ModelRuntime], timeout: float = 30.0) -> None:
    for rt in runtimes:
        rt.shutdown(timeout)


def _stop_accepting(runtimes: Iterable[ModelRuntime]) -> None:
    """Called on the event loop, where requests are submitted: once a runtime is no longer READY
    its submit() refuses, so no request can be queued behind the stop signals of shutdown()."""
    for rt in runtimes:
        if rt.state == ModelState.READY:
            rt.state = ModelState.UNLOADED


def _load_failure(entry: ModelEntry) -> str:
    """Why a freshly loaded entry cannot serve; "" when every version is READY."""
    if entry.error:
        return f"failed to load '{entry.name}': {entry.error}"
    return "; ".join(rt.reason for rt in entry.versions.values() if rt.state != ModelState.READY)
