"""What Orrery adds around one LLM call: `LLM.chat` (openai SDK, retry wrapper, budget check,
redaction, call record) against a raw HTTP POST of the same request to the same fake model.

    python bench/llm_overhead.py [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bench.stores import check_refused, refuse_store
from orchestrator.config import Settings
from orchestrator.planner.llm import LLM, CallRecord
from tests.fakellm import FakeLLM, say

MESSAGES = [
    {"role": "system", "content": "You plan DAGs. " * 200},
    {"role": "user", "content": "Collect the logs of the web servers and count the errors."},
]


async def measure(fake: FakeLLM, calls: int) -> tuple[list[float], list[float]]:
    settings = Settings(llm_base_url=fake.url, llm_model="fake-model", llm_api_key="sk-bench-0123456789abcdef")
    records: list[CallRecord] = []

    async def record(rec: CallRecord) -> None:
        records.append(rec)

    async def budget(_task: str) -> bool:
        return True

    llm = LLM(settings, record, budget)
    raw, wrapped = [], []
    async with httpx.AsyncClient(base_url=fake.url) as client:
        for _ in range(20):  # warm both paths
            fake.add(say("{}"), say("{}"))
            await client.post("/chat/completions", json={"model": "fake-model", "messages": MESSAGES})
            await llm.chat("t", None, "plan", MESSAGES)
        for _ in range(calls):
            fake.add(say("{}"), say("{}"))
            t0 = time.perf_counter()
            await client.post("/chat/completions", json={"model": "fake-model", "messages": MESSAGES})
            raw.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            await llm.chat("t", None, "plan", MESSAGES)
            wrapped.append((time.perf_counter() - t0) * 1000)
    await llm.close()
    return raw, wrapped


WHY_NO_STORE = "it times the LLM client alone against a fake model; there is no store in it"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    refuse_store(parser, WHY_NO_STORE)
    args = parser.parse_args()
    check_refused(parser, args, WHY_NO_STORE)
    fake = FakeLLM()
    try:
        raw, wrapped = asyncio.run(measure(fake, args.calls))
    finally:
        fake.close()
    r50, w50 = statistics.median(raw), statistics.median(wrapped)
    print(f"\none model call to an instant fake model, {args.calls} calls, ms\n")
    print(f"{'path':44} {'p50':>8} {'p90':>8}")
    for name, xs in (("raw httpx POST", raw), ("Orrery LLM.chat (SDK, retries, record)", wrapped)):
        print(f"{name:44} {statistics.median(xs):8.3f} {sorted(xs)[int(0.9 * len(xs))]:8.3f}")
    print(f"\noverhead Orrery adds per call (p50): {w50 - r50:.3f} ms")


if __name__ == "__main__":
    main()
