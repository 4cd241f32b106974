"""A stand-in for one `vllm serve` (a test double for an engine): OpenAI completions and chat completions,
streamed or not, that records every request it receives and answers like vLLM's disaggregation API.

    python -m tests.programs.openai_standin --port PORT --name NAME [--api-key KEY]

A request whose `kv_transfer_params` has `do_remote_decode` (a prefill request) is answered with
`kv_transfer_params` {"from": NAME, "request": N}. A streamed answer is `max_tokens` SSE events, then
`data: [DONE]`. Controls for tests (never auth-checked):

    POST /control/set     {"hold": bool, "fail": bool, "healthy": bool}: hold requests whose prompt is
                          "hold" until /control/release; answer 500 to every request; /health 200 or 503
    POST /control/release free the held requests
    POST /control/reset   forget what was received and restore the defaults
    GET  /control/received  [{"path", "body", "authorization", "request_id"}, ...] in arrival order
    GET  /control/held    how many requests are held now
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse


class Standin:
    def __init__(self, name: str, api_key: str | None) -> None:
        self.name = name
        self.api_key = api_key
        self.received: list[dict[str, Any]] = []
        self.settings = {"hold": False, "fail": False, "healthy": True}
        self.release = asyncio.Event()
        self.num_held = 0

    def reset(self) -> None:
        self.received.clear()
        self.settings = {"hold": False, "fail": False, "healthy": True}
        self.release.set()
        self.release = asyncio.Event()

    async def generate(self, request: Request, path: str) -> Response:
        body = await request.json()
        self.received.append({"path": path, "body": body, "authorization": request.headers.get("authorization"),
                              "request_id": request.headers.get("x-request-id")})
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return JSONResponse({"error": "Unauthorized"}, status_code=401)
        if self.settings["fail"]:
            return JSONResponse({"error": f"{self.name} fails on purpose"}, status_code=500)
        if self.settings["hold"] and body.get("prompt") == "hold":
            self.num_held += 1
            try:
                await self.release.wait()
            finally:
                self.num_held -= 1
        num_tokens = int(body.get("max_tokens") or 4)
        if body.get("stream"):
            return StreamingResponse(self._events(num_tokens), media_type="text/event-stream")
        answer: dict[str, Any] = {"id": f"cmpl-{len(self.received)}", "object": "text_completion", "from": self.name,
                                  "choices": [{"index": 0, "text": self._text(num_tokens), "finish_reason": "length"}]}
        if (body.get("kv_transfer_params") or {}).get("do_remote_decode"):
            answer["kv_transfer_params"] = {"from": self.name, "request": len(self.received)}
        return JSONResponse(answer)

    def _text(self, num_tokens: int) -> str:
        return "".join(f"{self.name}-{k} " for k in range(num_tokens))

    async def _events(self, num_tokens: int) -> AsyncIterator[bytes]:
        for k in range(num_tokens):
            event = {"object": "text_completion", "from": self.name, "choices": [{"index": 0, "text": f"{self.name}-{k} "}]}
            yield f"data: {json.dumps(event)}\n\n".encode()
            await asyncio.sleep(0)
        yield b"data: [DONE]\n\n"


def make_app(standin: Standin) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await standin.generate(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await standin.generate(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": f"standin-{standin.name}", "object": "model"}]}

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if standin.settings["healthy"] else 503)

    @app.post("/control/set")
    async def set_controls(request: Request) -> dict[str, Any]:
        standin.settings.update(await request.json())
        return standin.settings

    @app.post("/control/release")
    async def release() -> dict[str, int]:
        standin.release.set()
        standin.release = asyncio.Event()
        return {"released": standin.num_held}

    @app.post("/control/reset")
    async def reset() -> dict[str, bool]:
        standin.reset()
        return {"reset": True}

    @app.get("/control/received")
    async def received() -> list[dict[str, Any]]:
        return standin.received

    @app.get("/control/held")
    async def held() -> dict[str, int]:
        return {"held": standin.num_held}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--api-key")
    args = parser.parse_args()
    uvicorn.run(make_app(Standin(args.name, args.api_key)), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
