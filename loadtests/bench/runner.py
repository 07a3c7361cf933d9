"""Drives one benchmark run: paces sends, caps concurrency, shows progress.

`--max-concurrency` gates the send, not the arrival: a request that arrives
while the cap is reached waits client-side, and its TTFT starts when it is
actually sent (vllm bench serve behaves the same way).
"""
from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from kvserve.loadtests.bench.arrival import paced, send_offsets
from kvserve.loadtests.bench.bench_request import BenchRequest, RequestRecord
from kvserve.loadtests.bench.client import EndpointConfig, send_request


@dataclass(slots=True)
class LoadConfig:
    request_rate: float = float("inf")
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0
    request_timeout_s: float = 600.0
    show_progress: bool = True


@dataclass(slots=True)
class RunResult:
    records: list[RequestRecord]
    duration: float  # first send to last completion, seconds
    max_in_flight: int = 0


class _InFlight:
    """Peak number of requests on the wire; asyncio is single-threaded, so a
    plain counter is safe here."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    def enter(self) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)

    def leave(self) -> None:
        self.now -= 1


def _progress_bar(total: int, enabled: bool) -> Any:  # tqdm | None
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the bar is a nicety; never fail a run for it
        return None
    return tqdm(total=total, file=sys.stderr, unit="req", dynamic_ncols=True)


async def run_load(requests: list[BenchRequest], endpoint: EndpointConfig, load: LoadConfig) -> RunResult:
    if load.max_concurrency is not None and load.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {load.max_concurrency}")
    offsets = send_offsets(len(requests), load.request_rate, load.burstiness, load.seed)
    gate = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None
    in_flight = _InFlight()
    bar = _progress_bar(len(requests), load.show_progress)
    timeout = aiohttp.ClientTimeout(total=load.request_timeout_s)
    # No per-host connection cap: the semaphore is the only limit we want.
    connector = aiohttp.TCPConnector(limit=0, force_close=False)

    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        start = time.perf_counter()

        async def one(req: BenchRequest) -> RequestRecord:
            if gate is not None:
                await gate.acquire()
            in_flight.enter()
            try:
                return await send_request(session, endpoint, req, start)
            finally:
                in_flight.leave()
                if gate is not None:
                    gate.release()
                if bar is not None:
                    bar.update(1)

        tasks = [asyncio.create_task(one(req)) async for req in paced(requests, offsets, start)]
        records = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - start
    if bar is not None:
        bar.close()
    return RunResult(records=records, duration=duration, max_in_flight=in_flight.peak)
