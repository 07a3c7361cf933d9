"""Soak test: N minutes of mixed load against a running kvserve, watching the
server's processes for leaks.

    python -m kvserve.loadtests.bench.sustained.soak --url http://127.0.0.1:8000 --minutes 30 \\
        --concurrency 16 [--api-key KEY] [--pid PID] [--out soak.json]

Load: completions and chat, streaming and not, n=1 or 2, short and long
outputs, prompts that share prefixes and prompts that do not, a few invalid
requests, and 10% of requests cancelled by the client at a random point
(mid-stream, or before the answer for non-streaming calls). Mixed in
(--constrained-fraction, 15%): chat requests constrained by a JSON schema, by
json_object, or to a forced tool call (tools + tool_choice); every such answer
that completes, whole or streamed, must parse as JSON matching its schema (the
tool's parameters for a call). Also mixed in (--api-fraction, 15%): OpenAI
Responses and Anthropic Messages requests, some continuing a stored Response,
whose answers and event streams are checked against their APIs (soak_apis.py),
and stored Responses read back or deleted. Only the deliberately invalid
requests may get a 4xx. 10% of the clients (--slow-fraction) are slow
readers: they stream long answers through a small socket receive buffer and read
a few hundred bytes at a time with a pause between reads, so the server's write
buffers fill; the others must not stall behind them, nothing may leak.

Watched: resident memory (RSS) and open file descriptors of the server
process and all its children (the embedded host), sampled every few seconds
(psutil when installed, else /proc), plus the engine's gauges. After the
warm-up, each series must be flat: RSS may not grow by more than
--rss-tolerance (default 5% or 16 MiB, whichever is larger) between the first
and the last quarter of the window, fds by more than --fd-tolerance. The process
that holds the KV cache (the largest) is judged less the engine's
kvserve:kv_cache_touched_bytes: on the CPU the cache's memory is committed as its
blocks are first used, and all of them are used in turn, so its RSS grows by
the cache's size over a long enough run (engine_process says why). The
report (stdout, and JSON with --out) says FLAT or GROWING per process; the
exit code is 0 only when everything is flat and the engine ended idle.

The server's pid is found from the port it listens on (psutil), or given.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from urllib.parse import urlparse

try:
    import psutil
except ImportError:  # /proc fallback
    psutil = None

import aiohttp

from kvserve.loadtests.bench.server_api import metric_sums
from kvserve.loadtests.bench.sustained.soak_apis import (API_KINDS, EventStream, ResponseChains, api_request,
                                                         check_stream, check_whole, read_back, token_limit)
from kvserve.loadtests.bench.sustained.soak_mix import (CONSTRAINED_KINDS, StreamJoin, check_answer,
                                                        constrained_body, message_of)

PROMPTS = ["Once upon a time", "The history of the city begins", "Write a short poem about the sea",
           "Explain how a paged KV cache works", "List three facts about the moon"]


@dataclass
class Counts:
    ok: int = 0
    cancelled: int = 0
    client_errors: int = 0  # 4xx, expected for the deliberately invalid requests
    unexpected_4xx: int = 0  # a 4xx for any other request: a failure
    server_errors: int = 0  # 5xx or an error event: never expected
    transport_errors: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    # kind (plain, json_schema, json_object, tools, responses, messages, slow, invalid) -> outcome -> count
    kinds: dict[str, dict[str, int]] = field(default_factory=dict)
    # constrained or API kind (and responses_store, the read-backs) -> valid / truncated (cut at
    # max_tokens) / invalid, for answers that completed
    checks: dict[str, dict[str, int]] = field(default_factory=dict)
    invalid_answers: list[str] = field(default_factory=list)  # the first few, with why

    def bad_answers(self) -> int:
        return sum(c.get("invalid", 0) for c in self.checks.values())

    def check(self, kind: str, verdict: str) -> None:
        slot = self.checks.setdefault(kind, {})
        key = verdict.split(":")[0]
        slot[key] = slot.get(key, 0) + 1
        if key == "invalid" and len(self.invalid_answers) < 20:
            self.invalid_answers.append(f"{kind}: {verdict}")


# ---- process sampling ---------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    if psutil is not None:
        try:
            return [c.pid for c in psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def _rss_and_fds(pid: int) -> tuple[int, int] | None:
    if psutil is not None:
        try:
            proc = psutil.Process(pid)
            return proc.memory_info().rss, proc.num_fds()
        except psutil.Error:
            return None
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration, ValueError):
        return None


def find_server_pid(port: int) -> int | None:
    if psutil is None:
        return None
    for conn in psutil.net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return conn.pid
    return None


def sample(root: int) -> dict[str, dict[str, int]]:
    out = {}
    for pid in [root, *_children(root)]:
        got = _rss_and_fds(pid)
        if got is not None:
            out[str(pid)] = {"rss": got[0], "fds": got[1]}
    return out


# ---- load -----------------------------------------------------------------------------------------
def _kind(rng: random.Random, args: argparse.Namespace, slow: bool) -> str:
    if rng.random() < 0.02:
        return "invalid"
    if slow:
        return "slow"
    if rng.random() < args.constrained_fraction:
        return rng.choice(CONSTRAINED_KINDS)
    if rng.random() < args.api_fraction:
        return rng.choice(API_KINDS)
    return "plain"


async def _read_slowly(resp: aiohttp.ClientResponse, args: argparse.Namespace) -> str:
    got = bytearray()
    while chunk := await resp.content.read(args.slow_read_bytes):
        got += chunk
        await asyncio.sleep(args.slow_read_pause)
    if b'data: {"error"' in got:
        return "error-event"
    # Every frame read, ending with [DONE]: else the server cut the stream (a failure).
    return "200" if got.rstrip().endswith(b"data: [DONE]") else "cut-stream"


async def one_request(session: aiohttp.ClientSession, args: argparse.Namespace, rng: random.Random,
                      counts: Counts, slow: bool = False, chains: ResponseChains | None = None) -> None:
    kind = _kind(rng, args, slow)
    constrained, api = kind in CONSTRAINED_KINDS, kind in API_KINDS
    chains = chains if chains is not None else ResponseChains()
    chat = constrained or (args.chat and rng.random() < 0.5)
    streaming = slow or rng.random() < 0.7
    cancel = not slow and rng.random() < args.cancel_fraction
    prompt = rng.choice(PROMPTS) + ("" if rng.random() < 0.5 else f" (variant {rng.randrange(10**6)})")
    body: dict = {"model": args.model, "max_tokens": rng.choice([8, 16, 32, 64, 128]), "stream": streaming,
                  "temperature": rng.choice([0.0, 0.7]), "n": 2 if rng.random() < 0.1 else 1}
    if constrained:
        body.update(constrained_body(kind, rng), n=1, max_tokens=args.constrained_max_tokens)
    elif chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if slow:
        body.update(max_tokens=args.slow_max_tokens, n=1)
    if kind == "invalid":
        body["temperature"] = -1  # a 400, on purpose
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if api:
        path, body = api_request(kind, rng, args.model, prompt, body["max_tokens"], streaming, chains)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    # What completed, to check: a constrained answer's (content, tool calls, finish_reason); an API
    # kind's whole answer, or its stream's (event name, payload) pairs.
    answer: list = []

    async def run() -> str:
        async with session.post(args.url.rstrip("/") + path, json=body, headers=headers) as resp:
            if resp.status != 200:
                await resp.read()
                return str(resp.status)
            if slow:
                return await _read_slowly(resp, args)
            if not streaming:
                data = await resp.read()
                if constrained:
                    answer.append(message_of(json.loads(data)))
                elif api:
                    answer.append(json.loads(data))
                return "200"
            # Cancel inside the expected output, so the 10% really are cut short.
            frames, stop_after = 0, rng.randint(1, max(1, token_limit(body) // 2)) if cancel else None
            join = StreamJoin() if constrained else None
            events = EventStream() if api else None
            async for line in resp.content:
                if events is not None:  # typed events: `event: NAME` then `data: {...}`
                    name = events.add_line(line)
                    if name == "error":
                        return "error-event"
                    frames += name is not None
                    if name is not None and stop_after is not None and frames >= stop_after:
                        return "cancelled"
                    continue
                if line.startswith(b"data: {\"error\""):
                    return "error-event"
                if line.startswith(b"data: "):
                    frames += 1
                    if join is not None and not line.startswith(b"data: [DONE]"):
                        join.add(json.loads(line[6:]))
                    if stop_after is not None and frames >= stop_after:
                        return "cancelled"  # leaving the block drops the connection
            if join is not None:
                answer.append(join.joined())
            if events is not None:
                answer.append(events.events)
            return "200"

    try:
        if cancel and not streaming:
            outcome = await asyncio.wait_for(run(), rng.uniform(0.005, 0.2))
        else:
            outcome = await asyncio.wait_for(run(), 600 if slow else 120)
    except asyncio.TimeoutError:
        outcome = "cancelled" if cancel else "timeout"
    except aiohttp.ClientError:
        outcome = "transport"
    except ValueError:  # a frame or a body that is not JSON: the server's fault
        outcome = "malformed"
    counts.by_status[outcome] = counts.by_status.get(outcome, 0) + 1
    per_kind = counts.kinds.setdefault(kind, {})
    per_kind[outcome] = per_kind.get(outcome, 0) + 1
    if outcome == "200" and answer and api:
        verdict = (check_stream if streaming else check_whole)(kind, answer[0], token_limit(body))
        counts.check(kind, verdict)
        if kind == "responses" and verdict == "valid":
            final = answer[0][-1][1]["response"] if streaming else answer[0]
            chains.answered(final, "previous_response_id" in body, body.get("store", True))
            if rng.random() < 0.2:
                try:
                    counts.check("responses_store", await read_back(session, args.url, headers, chains, rng))
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                    counts.check("responses_store", f"invalid: reading back failed ({type(exc).__name__})")
    elif outcome == "200" and answer:
        counts.check(kind, check_answer(kind, body, *answer[0]))
    if outcome == "200":
        counts.ok += 1
    elif outcome == "cancelled":
        counts.cancelled += 1
    elif outcome.startswith("4"):
        counts.client_errors += 1
        counts.unexpected_4xx += kind != "invalid"
    elif outcome == "transport":
        counts.transport_errors += 1
    else:
        counts.server_errors += 1


def slow_reader_session() -> aiohttp.ClientSession:
    """A session whose sockets take little before the server's side must hold the rest: a 4 KiB
    receive buffer (where aiohttp lets a socket be made) and a 1 KiB read buffer."""
    def small_receive_buffer(addr_info) -> socket.socket:
        family, type_, proto, _, _ = addr_info
        sock = socket.socket(family, type_, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        return sock

    try:
        connector = aiohttp.TCPConnector(limit=0, socket_factory=small_receive_buffer)
    except TypeError:  # aiohttp before 3.12
        connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=1024)


async def drive(args: argparse.Namespace, deadline: float, counts: Counts) -> None:
    rng = random.Random(args.seed)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=120)
    slow_workers = slow_reader_count(args.concurrency, args.slow_fraction)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session, \
            slow_reader_session() as slow_session:
        async def worker(seed: int, slow: bool) -> None:
            local, chains = random.Random(seed), ResponseChains()
            while time.monotonic() < deadline:
                await one_request(slow_session if slow else session, args, local, counts, slow=slow, chains=chains)

        await asyncio.gather(*(worker(rng.randrange(2**32), i < slow_workers) for i in range(args.concurrency)))


def slow_reader_count(concurrency: int, fraction: float) -> int:
    """round(fraction x clients), at least one when the fraction is not 0."""
    return 0 if fraction <= 0 else max(1, round(concurrency * fraction))


# ---- analysis -------------------------------------------------------------------------------------
def verdict(series: list[float], tolerance: float) -> tuple[bool, float]:
    """Growth from the first to the last quarter of the window (medians, so one spike does not count)."""
    if len(series) < 8:
        return True, 0.0
    q = len(series) // 4
    growth = statistics.median(series[-q:]) - statistics.median(series[:q])
    return growth <= tolerance, growth


def kv_touched_bytes(url: str, previous: int) -> int:
    """The engine's `kvserve:kv_cache_touched_bytes` (0 where the server does not export it)."""
    try:
        return int(metric_sums(url.rstrip("/") + "/metrics", ("kvserve:kv_cache_touched_bytes",)).get(
            "kvserve:kv_cache_touched_bytes", 0))
    except Exception:  # a slow or failed scrape: the gauge never falls, so the last value stands
        return previous


def engine_process(samples: list[dict]) -> str | None:
    """The pid whose RSS holds the KV cache: the largest process at the first sample.

    On the CPU the cache's pages are committed as its blocks are first used, and every block is
    used before a freed one is reused (freed blocks keep their prefixes), so that process's RSS
    grows until the whole cache is resident. That growth is the cache filling, not a leak: its
    series is judged less the engine's kvserve:kv_cache_touched_bytes at each sample."""
    if not samples or not samples[0]["procs"]:
        return None
    procs = samples[0]["procs"]
    return max(procs, key=lambda pid: procs[pid]["rss"])


def engine_gauges(url: str) -> dict[str, float]:
    wanted = ("kvserve:num_requests_running", "kvserve:num_requests_waiting", "kvserve:kv_cache_usage_perc")
    return metric_sums(url.rstrip("/") + "/metrics", wanted)


async def main_async(args: argparse.Namespace) -> int:
    port = urlparse(args.url).port or 80
    root = args.pid or find_server_pid(port)
    if root is None:
        print("soak: cannot find the server's pid (install psutil or pass --pid)", file=sys.stderr)
        return 2
    counts = Counts()
    start = time.monotonic()
    deadline = start + args.minutes * 60
    samples: list[dict] = []
    load = asyncio.create_task(drive(args, deadline, counts))
    touched = 0
    while not load.done():
        touched = await asyncio.to_thread(kv_touched_bytes, args.url, touched)
        samples.append({"t": round(time.monotonic() - start, 1), "procs": sample(root), "kv_touched": touched})
        await asyncio.wait({load}, timeout=args.sample_every)
    await load
    await asyncio.sleep(2.0)  # let the last cancellations land
    gauges = engine_gauges(args.url)
    idle = all(v == 0 for v in gauges.values())
    warm = [s for s in samples if s["t"] >= args.warmup_minutes * 60]
    report: dict = {"minutes": args.minutes, "counts": asdict(counts), "engine_after": gauges, "idle_after": idle,
                    "processes": {}, "samples": samples}
    flat = True
    engine_pid = engine_process(warm)
    for pid in sorted({p for s in warm for p in s["procs"]}):
        rss = [s["procs"][pid]["rss"] - (s["kv_touched"] if pid == engine_pid else 0)
               for s in warm if pid in s["procs"]]
        fds = [s["procs"][pid]["fds"] for s in warm if pid in s["procs"]]
        rss_ok, rss_growth = verdict(rss, max(args.rss_tolerance * (rss[0] if rss else 0), 16 * 2**20))
        fds_ok, fds_growth = verdict(fds, args.fd_tolerance)
        flat &= rss_ok and fds_ok
        report["processes"][pid] = {
            "kv_cache_touched_excluded": pid == engine_pid,
            "rss_mib_first": round(rss[0] / 2**20, 1) if rss else None,
            "rss_mib_last": round(rss[-1] / 2**20, 1) if rss else None,
            "rss_growth_mib": round(rss_growth / 2**20, 2), "fds_first": fds[0] if fds else None,
            "fds_last": fds[-1] if fds else None, "fds_growth": fds_growth,
            "verdict": "FLAT" if rss_ok and fds_ok else "GROWING"}
    report["slow_readers"] = slow_reader_count(args.concurrency, args.slow_fraction)
    ok = (flat and idle and counts.server_errors == 0 and counts.transport_errors == 0
          and counts.unexpected_4xx == 0 and counts.bad_answers() == 0)
    report["verdict"] = "PASS" if ok else "FAIL"
    print(f"soak: {args.minutes} min, {sum(counts.by_status.values())} requests {counts.by_status}")
    for kind, outcomes in sorted(counts.kinds.items()):
        checked = f", answers {counts.checks[kind]}" if kind in counts.checks else ""
        print(f"  {kind}: {outcomes}{checked}")
    if "responses_store" in counts.checks:
        print(f"  stored Responses read back or deleted: {counts.checks['responses_store']}")
    for why in counts.invalid_answers:
        print(f"  INVALID {why}")
    if counts.unexpected_4xx:
        print(f"  UNEXPECTED 4xx: {counts.unexpected_4xx} answers to requests that were not invalid")
    for pid, p in report["processes"].items():
        less_kv = " less the KV cache's touched bytes" if p["kv_cache_touched_excluded"] else ""
        print(f"  pid {pid}: RSS{less_kv} {p['rss_mib_first']} -> {p['rss_mib_last']} MiB "
              f"(growth {p['rss_growth_mib']} MiB), fds {p['fds_first']} -> {p['fds_last']}: {p['verdict']}")
    print(f"  engine after the load: {gauges} ({'idle' if idle else 'NOT idle'})")
    print(f"soak: {report['verdict']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvserve soak", description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="served model name (default: the first of /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("KVSERVE_API_KEY"))
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--warmup-minutes", type=float, default=None, help="default: a fifth of the run, at most 2")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--cancel-fraction", type=float, default=0.10)
    p.add_argument("--constrained-fraction", type=float, default=0.15,
                   help="share of requests constrained (JSON schema, json_object, forced tool call)")
    p.add_argument("--constrained-max-tokens", type=int, default=160)
    p.add_argument("--api-fraction", type=float, default=0.15,
                   help="share of the other requests sent as OpenAI Responses or Anthropic Messages")
    p.add_argument("--slow-fraction", type=float, default=0.10, help="share of the clients that read slowly")
    p.add_argument("--slow-max-tokens", type=int, default=256)
    p.add_argument("--slow-read-bytes", type=int, default=256, help="a slow reader reads this much at a time")
    p.add_argument("--slow-read-pause", type=float, default=0.05, help="seconds between a slow reader's reads")
    p.add_argument("--sample-every", type=float, default=5.0, help="seconds between process samples")
    p.add_argument("--rss-tolerance", type=float, default=0.05, help="allowed RSS growth, fraction of the first value")
    p.add_argument("--fd-tolerance", type=int, default=8)
    p.add_argument("--pid", type=int, default=None, help="the server process (default: found from --url's port)")
    p.add_argument("--no-chat", dest="chat", action="store_false",
                   help="completions only, for a model without a chat template (constrained, Responses and "
                        "Messages requests are chat: none are sent)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the JSON report here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.warmup_minutes is None:
        args.warmup_minutes = min(args.minutes / 5, 2.0)
    if not args.chat:
        args.constrained_fraction = args.api_fraction = 0.0
    if args.model is None:
        req = urllib.request.Request(args.url.rstrip("/") + "/v1/models",
                                     headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {})
        with urllib.request.urlopen(req, timeout=10) as resp:
            args.model = json.loads(resp.read())["data"][0]["id"]
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
