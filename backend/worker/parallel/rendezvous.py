"""How the ranks of one world meet, on one machine or several: which ranks each node runs, what the
head publishes in the TCP store, how a worker claims its rank (and is refused when it does not fit
the head's world), and the heartbeats that tell the head a rank on another node is still there.

The store keys (all values are text or JSON, never Python objects: wire.py says why):

    engine_config, step_timeout_s      the head's, read by every worker
    world                              {"world_size": N, "nnodes": M}: a worker started for another
                                       world is refused, and says so under refused/<rank>
    joined/<rank>                      a counter: a second process for the same rank is refused
    arrived/<rank>                     the rank is ready to build the process groups
    refused                            why a rank gave up while starting: the head fails with it at once
    beat/<rank>                        a counter a rank on another node advances every second
    abort                              set by the head when it kills its ranks: the other nodes' exit
"""
from __future__ import annotations

import json
import os
import threading
import time

START_TIMEOUT_S = 300.0  # the default bound on the workers' start: interpreter, imports, rendezvous
DEFAULT_MASTER_PORT = 29501  # vLLM's, for the mp backend across nodes
_BEAT_EVERY_S = 1.0


def start_timeout_s() -> float:
    """KVSERVE_TP_START_TIMEOUT_S bounds how long the head waits for every rank to arrive (and a
    worker for the head): another node that never comes fails the start with a message, not a hang."""
    return float(os.environ.get("KVSERVE_TP_START_TIMEOUT_S", START_TIMEOUT_S))


def ranks_of_node(world_size: int, nnodes: int, node_rank: int) -> range:
    """The contiguous ranks node `node_rank` runs: world_size // nnodes each, the first
    world_size % nnodes nodes one more (TP=3 on 2 nodes: node 0 runs ranks 0 and 1, node 1 rank 2).
    Node 0 always holds rank 0, the engine."""
    if not 0 < nnodes <= world_size:
        raise ValueError(f"nnodes: {nnodes} nodes for a world of {world_size} rank(s): every node needs a rank")
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"node_rank: must be in [0, nnodes={nnodes}), got {node_rank}")
    base, extra = divmod(world_size, nnodes)
    start = node_rank * base + min(node_rank, extra)
    return range(start, start + base + (node_rank < extra))


def node_of_rank(world_size: int, nnodes: int, rank: int) -> int:
    return next(n for n in range(nnodes) if rank in ranks_of_node(world_size, nnodes, n))


def publish(store, config_json: bytes, step_timeout_s: float, world_size: int, nnodes: int) -> None:
    """The head: what every worker reads before it loads anything."""
    store.set("world", json.dumps({"world_size": world_size, "nnodes": nnodes}))
    store.set("step_timeout_s", str(step_timeout_s))
    store.set("engine_config", config_json)


def refuse(store, rank: int, message: str) -> None:
    """A worker that cannot take part tells the head why (the head fails its start with this)."""
    try:
        store.set("refused", message)  # one key: the head cannot list keys, and a refused rank may not be one it expects
    except RuntimeError:
        pass  # the head is gone: nobody to tell


def claim_rank(store, rank: int, world_size: int, nnodes: int | None) -> None:
    """A worker: check that the head's world is the one this process was started for and take its
    rank; raises ValueError (after telling the head) when it is not."""
    world = json.loads(store.get("world"))
    problems = []
    if world["world_size"] != world_size:
        problems.append(f"this node was started for a world of {world_size} rank(s), the head's has "
                        f"{world['world_size']} (the same --tensor-parallel-size on every node)")
    if nnodes is not None and world["nnodes"] != nnodes:
        problems.append(f"this node was started with --nnodes {nnodes}, the head with {world['nnodes']}")
    if not 0 < rank < world["world_size"]:
        problems.append(f"rank {rank} is not a worker rank of a world of {world['world_size']}")
    elif store.add(f"joined/{rank}", 1) > 1:
        problems.append(f"rank {rank} has already joined (is the same --node-rank running twice?)")
    if problems:
        message = f"rank {rank} refused: " + "; ".join(problems)
        refuse(store, rank, message)
        raise ValueError(message)


def read_config(store, rank: int, model: str | None, num_threads: int | None):
    """A worker: the head's engine config, with this node's path to the model and its thread count
    when its launcher gives them (another machine keeps its files elsewhere and has its own cores).
    A config this node cannot use is refused, and the head told why."""
    from kvserve.backend.worker.parallel.wire import decode_config
    changes = {k: v for k, v in (("model", model), ("num_threads", num_threads)) if v is not None}
    try:
        return decode_config(store.get("engine_config"), **changes)
    except (TypeError, ValueError) as exc:
        hint = "" if model else " (pass this node's path with --model)"
        message = f"rank {rank} cannot use the head's engine config: {exc}{hint}"
        refuse(store, rank, message)
        raise ValueError(message) from None


def start_heartbeat(open_client, rank: int) -> None:
    """A worker on another node: advance beat/<rank> every second on a connection of its own (the
    main thread's client may be blocked in a get), so the head notices a node that went away while
    the engine was idle, when no collective would tell it."""
    client = open_client()

    def beat() -> None:
        while True:
            try:
                client.add(f"beat/{rank}", 1)
                if client.check(["abort"]):  # the head lost another rank: no rank outlives the engine
                    os._exit(1)
            except RuntimeError:
                return  # the head is gone; the main thread learns it from its collectives
            time.sleep(_BEAT_EVERY_S)

    threading.Thread(target=beat, name=f"kvserve-beat-{rank}", daemon=True).start()


class HeartbeatWatch:
    """The head's view of the ranks on other nodes: each must advance its counter within `bound_s`.
    Read at most once a second, so that the check costs nothing on the step's path."""

    def __init__(self, store, ranks: list[int], bound_s: float) -> None:
        self.store, self.bound_s = store, bound_s
        now = time.monotonic()
        self.seen = {rank: (-1, now) for rank in ranks}
        self.next_read = now

    def check(self) -> str | None:
        """None while every remote rank beats; else what is wrong, for the WorkerLost message."""
        now = time.monotonic()
        if not self.seen or now < self.next_read:
            return None
        self.next_read = now + _BEAT_EVERY_S
        for rank, (count, since) in self.seen.items():
            try:
                current = self.store.add(f"beat/{rank}", 0)
            except RuntimeError as exc:
                return f"the rendezvous store failed: {exc}"
            if current != count:
                self.seen[rank] = (current, now)
            elif now - since > self.bound_s:
                return f"tensor parallel rank {rank} (on another node) sent no heartbeat for {now - since:.0f} s"
        return None
