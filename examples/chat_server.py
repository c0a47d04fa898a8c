"""An OpenAI-style streaming chat server on the in-process AsyncEngine (aiohttp), with
disconnect handling: a client that goes away cancels its request, which frees its slot and any
parked state. Run it, then point any OpenAI client at it:

    python examples/chat_server.py MODEL.gguf --port 8000
    curl -N localhost:8000/v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}],"stream":true}'
"""
from __future__ import annotations

import argparse
import json

from aiohttp import web

from llama_preempt import AsyncEngine, RequestError

ENGINE = web.AppKey("engine", AsyncEngine)


async def chat(request: web.Request) -> web.StreamResponse:
    eng = request.app[ENGINE]
    body = await request.json()
    messages = body.pop("messages", None)
    if not isinstance(messages, list):
        return web.json_response({"error": {"message": "messages: expected a list", "code": 400}}, status=400)
    # as llama-server, a field it does not know (OpenAI's "store", "user", ...) is ignored: the library
    # would call it a mistake in a Python call, but this is an HTTP API
    known = eng.engine.request_rules().names()
    body = {k: v for k, v in body.items() if k in known}
    if not body.pop("stream", False):
        try:
            done = await eng.chat(messages, **body)
        except RequestError as e:
            return web.json_response(e.body, status=e.status)
        return web.json_response(done.response)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    try:
        # when the client disconnects, aiohttp cancels this handler: the stream's request is cancelled
        async for chunk in eng.stream(messages=messages, **body):
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
    except RequestError as e:
        await resp.write(f"data: {json.dumps(e.body)}\n\n".encode())
    return resp


async def stats(request: web.Request) -> web.Response:
    st = request.app[ENGINE].stats()  # never waits for the loop
    return web.json_response({"busy_slots": sum(s.is_processing for s in st.slots), "parks": st.n_preempt_total,
                              "age_ms": st.age_ms})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--parallel", type=int, default=4)
    args = ap.parse_args()

    async def start(app: web.Application) -> None:
        app[ENGINE] = await AsyncEngine.create(args.model, n_ctx=args.ctx, n_parallel=args.parallel)

    async def stop(app: web.Application) -> None:
        await app[ENGINE].aclose()

    app = web.Application()
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/stats", stats)
    web.run_app(app, host=args.host, port=args.port, print=lambda *a: print(*a, flush=True))


if __name__ == "__main__":
    main()
