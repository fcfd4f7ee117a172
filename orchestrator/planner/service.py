"""The planner service: runs planning, agent loops and re-planning in background tasks and hands
their decisions to the engine as inputs. It also records every model call and keeps the budget."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select

from orchestrator.config import Settings
from orchestrator.domain.model import DagSpec
from orchestrator.domain.problems import Problem
from orchestrator.engine.core import Engine
from orchestrator.engine.records import AgentDone, AgentStep, Input, PlanFailed, PlanReady, ReplanDone, ToolCall
from orchestrator.engine.times import utc
from orchestrator.planner import agent_loop, planning
from orchestrator.planner.catalogue import inventory
from orchestrator.planner.llm import LLM, CallRecord, LlmError
from orchestrator.planner.prompts import PromptError, configure
from orchestrator.store.models import LlmCall
from orchestrator.store.repo import ChangeSet, Store

log = logging.getLogger("orrery.planner")


class PlannerService:
    def __init__(self, settings: Settings, store: Store, engine: Engine) -> None:
        self.settings = settings
        self.store = store
        self.engine = engine
        configure(settings.prompts_dir)  # checked again here: a broken directory fails start-up
        self.llm = LLM(settings, record=self._record, budget=self._budget)
        self._jobs: set[asyncio.Task[None]] = set()
        self._agents: dict[str, asyncio.Task[None]] = {}
        self._calls: dict[str, int] = {}

    async def close(self) -> None:
        for job in list(self._jobs):
            job.cancel()
        for job in list(self._jobs):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await job
        await self.llm.close()

    # ------------------------------------------------------------------ entry points (engine-facing)

    def start_planning(self, task_id: str, request: str) -> None:
        self._spawn(
            self._plan(task_id, request),
            f"plan-{task_id}",
            lambda why: PlanFailed(task_id, "planning_failed", f"the planner failed unexpectedly: {why}"),
        )

    def start_agent(
        self, attempt_id: str, task_id: str, node_id: str, instruction: str, max_steps: int, device: dict[str, Any]
    ) -> None:
        node = agent_loop.AgentNode(task_id, node_id, instruction, max_steps, device)
        self._agents[attempt_id] = self._spawn(
            self._agent(attempt_id, node),
            f"agent-{attempt_id}",
            lambda why: AgentDone(
                attempt_id, False, error_code="internal_error", error_message=f"the agent loop failed: {why}"
            ),
        )

    def cancel_agent(self, attempt_id: str) -> None:
        job = self._agents.pop(attempt_id, None)
        if job is not None and not job.done() and job is not asyncio.current_task():
            job.cancel()

    def replan(self, task_id: str, node_id: str, context: dict[str, Any]) -> None:
        self._spawn(
            self._replan(task_id, node_id, context),
            f"replan-{task_id}",
            lambda why: ReplanDone(task_id, node_id, None, f"internal_error: the re-planner failed: {why}"),
        )

    # ------------------------------------------------------------------ the jobs

    async def _plan(self, task_id: str, request: str) -> None:
        def validate(spec: DagSpec) -> list[Problem]:  # the same rules as an explicit DAG
            return self.engine.validate(spec)

        text = inventory(self.engine.inventory(), self.settings.llm_context_tokens)
        try:
            name, spec = await planning.plan(self.llm, task_id, request, text, validate)
        except planning.PlanningFailed as exc:
            self.engine.notify(PlanFailed(task_id, "planning_failed", exc.message))
        except (LlmError, PromptError) as exc:
            code = exc.code if exc.code == "llm_budget_exceeded" else "planning_failed"
            self.engine.notify(PlanFailed(task_id, code, exc.message))
        else:
            self.engine.notify(PlanReady(task_id, name, spec, request))

    async def _agent(self, attempt_id: str, node: agent_loop.AgentNode) -> None:
        async def run_batch(commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
            calls = [ToolCall(c["tool"], c["arguments"], float(c.get("timeout_s", 60.0))) for c in commands]
            waiter: asyncio.Future[list[dict[str, Any]]] = await self.engine.submit(AgentStep(attempt_id, calls))
            return await waiter

        try:
            outcome = await agent_loop.run(self.llm, node, run_batch)
        except (LlmError, PromptError) as exc:
            outcome = agent_loop.AgentOutcome(False, error_code=exc.code, error_message=exc.message)
        self._agents.pop(attempt_id, None)
        self.engine.notify(
            AgentDone(
                attempt_id,
                outcome.succeeded,
                outcome.output,
                outcome.error_code,
                outcome.error_message,
                outcome.tools_used,
            )
        )

    async def _replan(self, task_id: str, node_id: str, context: dict[str, Any]) -> None:
        context = {
            **context,
            "inventory": inventory(context.pop("inventory_devices"), self.settings.llm_context_tokens),
        }
        try:
            edits = await planning.replan(self.llm, task_id, context)
        except (LlmError, PromptError) as exc:
            self.engine.notify(ReplanDone(task_id, node_id, None, f"{exc.code}: {exc.message}"))
        else:
            self.engine.notify(ReplanDone(task_id, node_id, edits))

    def _spawn(self, coro: Any, name: str, on_error: Callable[[str], Input]) -> asyncio.Task[None]:
        job: asyncio.Task[None] = asyncio.get_running_loop().create_task(self._guard(coro, name, on_error), name=name)
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)
        return job

    async def _guard(self, coro: Any, name: str, on_error: Callable[[str], Input]) -> None:
        """Run a job; if it fails in a way it did not handle itself, the engine still hears that
        it ended (else a task would stay `planning`, or an agent node hold its device, forever)."""
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("planner job %s failed", name)
            self.engine.notify(on_error(f"{type(exc).__name__}: {exc}"[:500]))

    # ------------------------------------------------------------------ records and budget

    async def _budget(self, task_id: str) -> bool:
        if task_id not in self._calls:
            async with self.store.sessions() as s:  # calls before a restart count too
                used = await s.scalar(select(func.count()).select_from(LlmCall).where(LlmCall.task_id == task_id))
            self._calls[task_id] = int(used or 0)
        return self._calls[task_id] < self.settings.llm_calls_per_task

    async def _record(self, rec: CallRecord) -> None:
        self._calls[rec.task_id] = self._calls.get(rec.task_id, 0) + 1
        metrics = self.engine.metrics
        metrics.llm_calls.labels(rec.purpose, "error" if rec.error else "ok").inc()
        metrics.llm_tokens.labels(rec.purpose, "prompt").inc(rec.prompt_tokens)
        metrics.llm_tokens.labels(rec.purpose, "completion").inc(rec.completion_tokens)
        changes = ChangeSet()
        changes.insert(
            LlmCall,
            {
                "task_id": rec.task_id,
                "node_id": rec.node_id,
                "purpose": rec.purpose,
                "model": rec.model,
                "messages": rec.messages,
                "reply": rec.reply,
                "prompt_tokens": rec.prompt_tokens,
                "completion_tokens": rec.completion_tokens,
                "latency_ms": round(rec.latency_ms, 3),
                "error": rec.error,
                "at": utc(time.time()),
            },
        )
        await self.store.write(changes)
