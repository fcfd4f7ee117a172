"""Talking to an OpenAI-compatible model: retries, timeouts, budgets, and a record of every call.

Every call goes through `LLM.chat`, which counts it against the task's budget, retries rate
limits and server errors with capped backoff (tenacity), and records what the model was shown
(secrets removed), what it answered, the tokens and the latency (SPEC section 6).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import openai
from openai import AsyncOpenAI
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from orchestrator.config import Settings

RETRYABLE = (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError, openai.APITimeoutError)
_SECRETS = [
    re.compile(r"\borr[kd]_[A-Za-z0-9_.\-]{8,}"),  # Orrery API keys and device tokens
    re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"),  # common provider keys
    re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9_.\-=]{12,}"),
    re.compile(r"(?i)(\"?(?:password|passwd|secret|token|api_key|apikey)\"?\s*[:=]\s*\"?)[^\s\",}]{4,}"),
]


class LlmError(Exception):
    """The model could not be used; `code` says why (stable, for problems and node errors)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class Reply:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0


@dataclass
class CallRecord:
    task_id: str
    node_id: str | None
    purpose: str
    model: str
    messages: list[Any]
    reply: Any
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    error: str | None


Recorder = Callable[[CallRecord], Awaitable[None]]
Budget = Callable[[str], Awaitable[bool]]  # True while the task may make another call


def redact(value: Any) -> Any:
    """A copy with anything that looks like a secret replaced by «redacted»."""
    if isinstance(value, str):
        for pattern in _SECRETS:
            value = pattern.sub(lambda m: (m.group(1) + " " if m.lastindex else "") + "«redacted»", value)
        return value
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    return value


class LLM:
    def __init__(self, settings: Settings, record: Recorder, budget: Budget) -> None:
        if not settings.llm_configured:
            raise LlmError("planner_unavailable", "no LLM is configured (ORRERY_LLM_BASE_URL, ORRERY_LLM_MODEL)")
        self.settings = settings
        self.model = settings.llm_model or ""
        self.vision = settings.llm_vision
        self._record = record
        self._budget = budget
        self._client = AsyncOpenAI(
            base_url=settings.llm_base_url,
            api_key=settings.llm_api_key or "not-needed",
            max_retries=0,  # tenacity below owns retries, so they are counted and capped in one place
            timeout=settings.llm_timeout_s,
        )

    async def close(self) -> None:
        await self._client.close()

    async def chat(
        self,
        task_id: str,
        node_id: str | None,
        purpose: str,
        messages: list[dict[str, Any]],
        *,
        schema: tuple[str, dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> Reply:
        """One model turn. `schema` asks for JSON-schema structured output; `tools` offers calls."""
        if not await self._budget(task_id):
            raise LlmError(
                "llm_budget_exceeded", f"task {task_id} used its budget of {self.settings.llm_calls_per_task} LLM calls"
            )
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages}
        if schema is not None:
            name, body = schema
            kwargs["response_format"] = {"type": "json_schema", "json_schema": {"name": name, "schema": body}}
        if tools:
            kwargs["tools"] = tools
        started = time.perf_counter()
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(RETRYABLE),
                wait=wait_random_exponential(multiplier=0.5, max=8),
                stop=stop_after_attempt(self.settings.llm_max_retries + 1),
                reraise=True,
            ):
                with attempt:
                    response = await self._client.chat.completions.create(**kwargs)
        except openai.OpenAIError as exc:
            latency = (time.perf_counter() - started) * 1000
            await self._record(
                CallRecord(
                    task_id,
                    node_id,
                    purpose,
                    self.model,
                    redact(messages),
                    None,
                    0,
                    0,
                    latency,
                    f"{type(exc).__name__}: {exc}"[:2000],
                )
            )
            raise LlmError("llm_error", f"the model call failed: {type(exc).__name__}: {exc}"[:500]) from exc
        latency = (time.perf_counter() - started) * 1000
        choice = response.choices[0].message if response.choices else None
        calls = [
            {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in (choice.tool_calls or [] if choice else [])
            if getattr(c, "function", None) is not None
        ]
        reply = Reply(
            content=choice.content if choice else None,
            tool_calls=calls,
            prompt_tokens=response.usage.prompt_tokens if response.usage else 0,
            completion_tokens=response.usage.completion_tokens if response.usage else 0,
            latency_ms=latency,
        )
        await self._record(
            CallRecord(
                task_id,
                node_id,
                purpose,
                self.model,
                redact(messages),
                redact({"content": reply.content, "tool_calls": calls}),
                reply.prompt_tokens,
                reply.completion_tokens,
                latency,
                None,
            )
        )
        return reply


def parse_json(content: str | None) -> Any:
    """JSON from a reply, tolerating a fenced code block around it."""
    if not content:
        raise ValueError("the reply was empty; answer with the JSON object only")
    text = content.strip()
    fence = re.match(r"^```(?:json)?\s*(.*?)\s*```$", text, re.S)
    if fence:
        text = fence.group(1)
    return json.loads(text)
