"""SPEC section 5 output caps: a result whose JSON (`json.dumps`) is over the device's
`max_result_bytes` is replaced by a truncation marker; one at or under it is kept as it is.
The router tells most small results from their compact JSON without measuring them
(`router._certainly_fits`); the bound it relies on is checked here."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from device_agent.audit import AuditLog
from device_agent.policy import Policy
from device_agent.router import _COMPACT_JSON, Router, _certainly_fits
from device_agent.runner import BUILTIN
from device_agent.toolset_host import ToolsetHost
from device_agent.toolsets.base import ToolsetContext
from protocol.messages import Command

CAP = 1024
TEXT = st.text(alphabet=st.one_of(st.characters(), st.sampled_from('\x7f\x00"\\,:é😀\u2028')))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner) | st.dictionaries(TEXT, inner),
    max_leaves=40,
)


@settings(max_examples=500, deadline=None)
@given(value=JSON_VALUES)
def test_json_dumps_writes_at_most_six_characters_per_byte_of_the_compact_json(value: Any) -> None:
    try:
        compact = _COMPACT_JSON(value)
    except ValueError:  # a lone surrogate: such a value is measured the long way
        assert not _certainly_fits(value, 10**9)
        return
    assert len(json.dumps(value, default=str)) <= 6 * len(compact)


@pytest.mark.parametrize("value", ["\x7f" * 100, [0] * 100, {"a": [{}] * 50}, ["é😀"] * 30, [float("inf")] * 9])
def test_the_bound_holds_where_json_dumps_writes_the_most(value: Any) -> None:
    assert len(json.dumps(value, default=str)) <= 6 * len(_COMPACT_JSON(value))


@asynccontextmanager
async def router(tmp_path: Path) -> AsyncIterator[Router]:
    ctx = ToolsetContext(workspace=tmp_path, policy=Policy())
    audit = AuditLog(tmp_path / "audit.jsonl")
    r = Router(ctx.policy, audit, [], CAP)
    r.add(ToolsetHost("system", BUILTIN["system"](ctx), strict_arguments=True, in_process=True))
    await r.start()
    try:
        yield r
    finally:
        await r.stop()
        audit.close()


@pytest.mark.parametrize(
    ("text", "fits"),
    [
        ("short", True),
        ("a" * (CAP - 12), True),  # `{"text": "..."}`: the text and 12 characters, exactly the cap
        ("a" * (CAP - 11), False),
        ("\x7f" * 168, True),  # 6 characters each in json.dumps, 1 byte in the compact JSON
        ("\x7f" * 170, False),
        ("é" * 168, True),
        ("é" * 170, False),
    ],
)
async def test_a_result_over_the_cap_is_truncated_with_a_marker_and_one_at_it_is_kept(
    tmp_path: Path, text: str, fits: bool
) -> None:
    async with router(tmp_path) as r:
        result = await r.call(Command(call_id="c1", tool="system.echo", arguments={"text": text}), "b1", 5.0)
    size = len(json.dumps({"text": text}))
    assert result.status == "success"
    if fits:
        assert size <= CAP and result.result == {"text": text}
    else:
        preview = json.dumps({"text": text})[: CAP // 2]
        assert result.result == {"truncated": True, "original_bytes": size, "preview": preview}
