"""A long prompt is tokenized without stopping everything else: the engine's tokenizer releases
the GIL (the host's gRPC server and health checks keep answering), and the gateway tokenizes on
a worker thread (its event loop keeps serving other streams). A megabyte takes about a second."""
from __future__ import annotations

import asyncio
import threading
import time

from kvserve.backend.engine.engine_tokenizer import load_engine_tokenizer
from kvserve.seam.tokenizer import LONG_TEXT_CHARS, ModelTokenizer

LONG = "many small words " * 60_000  # ~1 MB: about a second of tokenization on this machine


def _held_encode_s(tok) -> float:
    """How long one encode of LONG takes: what a stall would be if it held everything up."""
    start = time.perf_counter()
    tok.encode_batch([LONG])
    return time.perf_counter() - start


def _max_stall(encode_s: float) -> float:
    # A quarter of the encode (several hundred ms): a scheduler hiccup on a busy 2-core machine
    # stays below it, a stall for the whole encode does not, on a machine of any speed.
    return 0.25 * encode_s


def test_the_engine_tokenizer_lets_other_threads_run(llama_dir) -> None:
    tok = load_engine_tokenizer(llama_dir)
    assert LONG_TEXT_CHARS < len(LONG)
    gaps: list[float] = []
    done = threading.Event()

    def ticker() -> None:
        while not done.is_set():
            start = time.perf_counter()
            time.sleep(0.01)
            gaps.append(time.perf_counter() - start)

    limit = _max_stall(_held_encode_s(tok.tokenizer))
    thread = threading.Thread(target=ticker)
    thread.start()
    try:
        ids = tok.encode(LONG)
    finally:
        done.set()
        thread.join()
    assert max(gaps) < limit, (max(gaps), limit)
    assert ids == tok.tokenizer.encode(LONG, add_special_tokens=True).ids  # the same tokens as encode() gives


def test_the_gateway_tokenizes_a_long_text_off_its_event_loop(llama_dir) -> None:
    tok = ModelTokenizer.from_folder(llama_dir)

    async def run() -> tuple[list[int], float]:
        gaps: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            while not stop.is_set():
                start = time.perf_counter()
                await asyncio.sleep(0.01)
                gaps.append(time.perf_counter() - start)

        task = asyncio.create_task(ticker())
        ids = await tok.encode_async(LONG, add_special_tokens=False)
        stop.set()
        await task
        return ids, max(gaps)

    limit = _max_stall(_held_encode_s(tok.tokenizer))
    ids, stall = asyncio.run(run())
    assert stall < limit, (stall, limit)
    assert ids == tok.encode(LONG, add_special_tokens=False)
