"""A fake OpenAI-compatible model: a real HTTP server on loopback with scripted replies.

The only fake in the test suite (DESIGN: the LLM is not something CI can call). Each request
pops the next scripted step: a reply (content and/or tool calls), an HTTP error, or a function
of the request body that returns one of those. Every request body is kept for assertions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tests.support import free_port, wait_until

Step = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


def say(content: str) -> dict[str, Any]:
    return {"content": content}


def plan(dag: dict[str, Any]) -> dict[str, Any]:
    return {"content": json.dumps(dag)}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    """One tool call (use several in `calls` for a multi-call step)."""
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def calls(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": [tc for s in steps for tc in s["tool_calls"]]}


def status(code: int) -> dict[str, Any]:
    return {"status": code}


def raw(body: Any) -> dict[str, Any]:
    """A 200 whose body is exactly `body` (a misbehaving "compatible" server)."""
    return {"raw": body}


class FakeLLM:
    def __init__(self) -> None:
        self.script: deque[Step] = deque()
        self.requests: list[dict[str, Any]] = []
        self.port = free_port()
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append(body)
            if not self.script:
                return JSONResponse({"error": {"message": "the fake model's script ran out"}}, 500)
            step = self.script.popleft()
            if callable(step):
                step = step(body)
            if "status" in step:
                return JSONResponse({"error": {"message": "scripted error", "type": "scripted"}}, step["status"])
            if "raw" in step:
                return JSONResponse(step["raw"])
            return JSONResponse(_completion(body, step))

        self._server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        wait_until(lambda: self._server.started, 20, "the fake LLM to start")

    def _run(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.run(self._server.serve())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def env(self, **extra: str) -> dict[str, str]:
        """Server settings pointing at this model (as `Fleet(**server_env)` keyword arguments)."""
        return {
            "llm_base_url": self.url,
            "llm_model": "fake-model",
            "llm_api_key": "sk-test-not-a-real-key-12345",
            "llm_max_retries": "3",
            **extra,
        }

    def add(self, *steps: Step) -> None:
        self.script.extend(steps)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)


def _completion(body: dict[str, Any], step: dict[str, Any]) -> dict[str, Any]:
    tool_calls = [
        {
            "id": f"call_{i}_{int(time.time() * 1000) % 100000}",
            "type": "function",
            "function": {"name": tc["name"], "arguments": json.dumps(tc["arguments"])},
        }
        for i, tc in enumerate(step.get("tool_calls", []))
    ]
    message: dict[str, Any] = {"role": "assistant", "content": step.get("content")}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "fake-model"),
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {
            "prompt_tokens": len(json.dumps(body)) // 4,
            "completion_tokens": 20,
            "total_tokens": len(json.dumps(body)) // 4 + 20,
        },
    }
