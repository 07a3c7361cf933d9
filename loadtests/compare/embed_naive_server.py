"""The naive embedding server kvserve is measured against: sentence-transformers'
`encode()` behind /v1/embeddings in one process, one request at a time (what a
few lines of FastAPI or aiohttp around the library give). Not installed for
serving; used by loadtests/compare/embed_bench.py.

    python -m kvserve.loadtests.compare.embed_naive_server --model DIR --port 8100
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures

from aiohttp import web


def build_app(model_dir: str, max_seq_length: int) -> web.Application:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")
    model.max_seq_length = max_seq_length
    # One worker: encode() already uses every core through torch; requests wait their turn.
    worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="encode")

    async def embeddings(request: web.Request) -> web.Response:
        body = await request.json()
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        vectors = await asyncio.get_running_loop().run_in_executor(
            worker, lambda: model.encode(inputs, convert_to_numpy=True))
        return web.json_response({"object": "list", "model": body.get("model", model_dir),
                                  "data": [{"object": "embedding", "index": i, "embedding": v.tolist()}
                                           for i, v in enumerate(vectors)],
                                  "usage": {"prompt_tokens": 0, "total_tokens": 0}})

    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/health", health)
    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="embed_naive_server")
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--max-seq-length", type=int, default=512)
    args = p.parse_args(argv)
    app = build_app(args.model, args.max_seq_length)
    print(f"naive embedding server ready http://127.0.0.1:{args.port}", flush=True)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
