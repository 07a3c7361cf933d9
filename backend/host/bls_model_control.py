"""pb_utils.load_model() / unload_model(): the repository's explicit model control, asked from a
model's own thread (the Python backend's BLS model-loading API).

Loads and unloads run on the host's event loop, where the gRPC RPCs run them, so a model and a
client asking at once take turns per model as two clients do. The calling thread waits on the
loop: for a load until the model serves (or failed), for an unload until the model takes no new
requests (TRITONSERVER_ServerUnloadModel does not wait for its versions to finalize either).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from .infer_errors import InferError
from .pb_utils.triton_errors import TritonModelException
from .repository import ModelRepository


class LoopModelControl:
    def __init__(self, repository: ModelRepository, loop: asyncio.AbstractEventLoop) -> None:
        self._repository = repository
        self._loop = loop
        self._loop_thread = threading.get_ident()  # made on the loop: it must never wait on itself

    def load(self, model_name: str) -> None:
        self._refuse_on_the_loop()
        self._wait(asyncio.run_coroutine_threadsafe(self._repository.load_model(model_name), self._loop))

    def unload(self, model_name: str) -> None:
        self._refuse_on_the_loop()
        taken_out: concurrent.futures.Future[None] = concurrent.futures.Future()

        def settle(done: concurrent.futures.Future[None]) -> None:
            # a refusal (mode none) comes before anything was taken out
            if not taken_out.done():
                if done.cancelled() or done.exception() is None:
                    taken_out.set_result(None)
                else:
                    taken_out.set_exception(done.exception())  # type: ignore[arg-type]

        unloading = asyncio.run_coroutine_threadsafe(
            self._repository.unload_model(model_name, on_taken_out=lambda: taken_out.set_result(None)), self._loop)
        unloading.add_done_callback(settle)
        self._wait(taken_out)

    def _refuse_on_the_loop(self) -> None:
        if threading.get_ident() == self._loop_thread:
            raise TritonModelException("model control cannot be waited for on the host's event loop")

    @staticmethod
    def _wait(future: concurrent.futures.Future[None]) -> None:
        try:
            future.result()
        except InferError as exc:
            raise TritonModelException(exc.message) from None
