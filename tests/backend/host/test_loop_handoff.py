"""The loop hand-off: callbacks from other threads run on the loop, in order, none lost, one
wake-up per burst; once the loop is closed, submit raises (the stream ignores it)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from kvserve.backend.host.kserve.loop_handoff import handoff_for


def test_callbacks_from_threads_all_run_on_the_loop_in_order() -> None:
    seen: list[tuple[int, int]] = []
    threads_seen: set[int] = set()

    async def main() -> None:
        handoff = handoff_for(asyncio.get_running_loop())
        assert handoff is handoff_for(asyncio.get_running_loop())
        done = asyncio.Event()
        loop = asyncio.get_running_loop()

        def record(sender: int, i: int) -> None:
            threads_seen.add(threading.get_ident())
            seen.append((sender, i))
            if len(seen) == 4 * 2000:
                done.set()

        def send(sender: int) -> None:
            for i in range(2000):
                handoff.submit(record, sender, i)

        workers = [threading.Thread(target=send, args=(s,)) for s in range(4)]
        for w in workers:
            w.start()
        await asyncio.wait_for(done.wait(), 30)
        for w in workers:
            w.join()
        assert threads_seen == {threading.get_ident()}
        assert loop.is_running()

    asyncio.run(main())
    for sender in range(4):
        assert [i for s, i in seen if s == sender] == list(range(2000))


def test_submit_after_the_loop_closed_raises() -> None:
    loop = asyncio.new_event_loop()

    async def make():
        return handoff_for(asyncio.get_running_loop())

    handoff = loop.run_until_complete(make())
    loop.close()
    with pytest.raises(RuntimeError):
        handoff.submit(print, "never")
