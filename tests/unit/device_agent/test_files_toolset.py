"""The `files` toolset over real MCP: read, write, list, delete, all inside the workspace (SPEC section 5)."""

from __future__ import annotations

import base64
import functools
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from device_agent.toolsets.base import ToolsetContext
from device_agent.toolsets.files import build
from tests.unit.device_agent import toolkit
from tests.unit.device_agent.toolkit import make_ctx

call = functools.partial(toolkit.call, build)
ok = functools.partial(toolkit.ok, build)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


async def refused(ctx: ToolsetContext, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await call(ctx, tool, **arguments)
    assert result.is_error
    assert result.structured_content is not None, result.content
    return dict(result.structured_content)


async def test_text_written_is_read_back_with_size_and_digest(workspace: Path) -> None:
    ctx = make_ctx(workspace)
    written = await ok(ctx, "write", path="notes/a.txt", content="héllo\n")
    raw = "héllo\n".encode()
    assert written == {"path": "notes/a.txt", "size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    read = await ok(ctx, "read", path="notes/a.txt")
    assert read == {"path": "notes/a.txt", "content": "héllo\n", "size": len(raw), "encoding": "utf-8"}


async def test_binary_content_round_trips_as_base64(workspace: Path) -> None:
    ctx = make_ctx(workspace)
    blob = bytes([0, 255, 16, 200])
    await ok(ctx, "write", path="b.bin", content=base64.b64encode(blob).decode(), encoding="base64")
    assert (workspace / "b.bin").read_bytes() == blob
    read = await ok(ctx, "read", path="b.bin")
    assert (read["encoding"], base64.b64decode(read["content"])) == ("base64", blob)


async def test_invalid_base64_is_invalid_arguments(workspace: Path) -> None:
    err = await refused(make_ctx(workspace), "write", path="x", content="not base64!", encoding="base64")
    assert err["code"] == "invalid_arguments"
    assert not (workspace / "x").exists()


async def test_append_adds_to_the_file_and_reports_the_whole_file(workspace: Path) -> None:
    ctx = make_ctx(workspace)
    await ok(ctx, "write", path="log.txt", content="a")
    appended = await ok(ctx, "append", path="log.txt", content="b")
    assert (workspace / "log.txt").read_text() == "ab"
    assert (appended["size"], appended["sha256"]) == (2, hashlib.sha256(b"ab").hexdigest())


async def test_append_creates_a_missing_file_and_takes_base64(workspace: Path) -> None:
    appended = await ok(make_ctx(workspace), "append", path="new/log.bin", content="AAE=", encoding="base64")
    assert (workspace / "new" / "log.bin").read_bytes() == b"\x00\x01"
    assert appended["size"] == 2


async def test_replacing_a_file_keeps_its_mode_and_leaves_no_temp_file(workspace: Path) -> None:
    target = workspace / "conf"
    target.write_text("old")
    target.chmod(0o640)
    await ok(make_ctx(workspace), "write", path="conf", content="new")
    assert target.read_text() == "new"
    assert target.stat().st_mode & 0o777 == 0o640
    assert os.listdir(workspace) == ["conf"]


async def test_size_limits_refuse_large_reads_and_writes(workspace: Path) -> None:
    ctx = make_ctx(workspace, max_file_bytes=10)
    (workspace / "big").write_bytes(b"x" * 11)
    err = await refused(ctx, "read", path="big")
    assert err["code"] == "invalid_arguments"
    assert "shell.run" in err["message"]
    assert (await refused(ctx, "write", path="w", content="y" * 11))["code"] == "invalid_arguments"
    assert (await refused(ctx, "append", path="w", content="y" * 11))["code"] == "invalid_arguments"
    assert not (workspace / "w").exists()


async def test_reading_a_missing_file_suggests_listing(workspace: Path) -> None:
    err = await refused(make_ctx(workspace), "read", path="nope/missing.txt")
    assert err["code"] == "tool_error"
    assert "does not exist" in err["message"] and "files.list" in err["message"]


async def test_reading_a_directory_is_a_tool_error(workspace: Path) -> None:
    (workspace / "d").mkdir()
    assert (await refused(make_ctx(workspace), "read", path="d"))["code"] == "tool_error"


@pytest.mark.parametrize("tool", ["write", "append"])
async def test_writing_over_a_directory_is_a_tool_error(workspace: Path, tool: str) -> None:
    (workspace / "d").mkdir()
    assert (await refused(make_ctx(workspace), tool, path="d", content="x"))["code"] == "tool_error"


async def test_list_gives_sorted_entries_with_types_and_sizes(workspace: Path) -> None:
    (workspace / "b.txt").write_text("12345")
    (workspace / "a-dir").mkdir()
    (workspace / "c-link").symlink_to(workspace / "b.txt")
    listed = await ok(make_ctx(workspace), "list")
    assert listed == {
        "path": ".",
        "entries": [
            {"name": "a-dir", "type": "dir", "size": None},
            {"name": "b.txt", "type": "file", "size": 5},
            {"name": "c-link", "type": "symlink", "size": None},
        ],
        "truncated": False,
    }


async def test_list_limit_truncates(workspace: Path) -> None:
    for name in "abc":
        (workspace / name).write_text("")
    listed = await ok(make_ctx(workspace), "list", path=".", limit=2)
    assert [e["name"] for e in listed["entries"]] == ["a", "b"]
    assert listed["truncated"] is True


async def test_listing_a_missing_directory_or_a_file_is_a_tool_error(workspace: Path) -> None:
    (workspace / "f").write_text("")
    ctx = make_ctx(workspace)
    assert (await refused(ctx, "list", path="missing"))["code"] == "tool_error"
    assert (await refused(ctx, "list", path="f"))["code"] == "tool_error"


async def test_delete_is_idempotent(workspace: Path) -> None:
    (workspace / "f").write_text("x")
    ctx = make_ctx(workspace)
    assert await ok(ctx, "delete", path="f") == {"path": "f", "deleted": True}
    assert not (workspace / "f").exists()
    assert await ok(ctx, "delete", path="f") == {"path": "f", "deleted": False}


async def test_delete_needs_recursive_for_a_directory(workspace: Path) -> None:
    (workspace / "d" / "e").mkdir(parents=True)
    (workspace / "d" / "e" / "f").write_text("x")
    ctx = make_ctx(workspace)
    assert (await refused(ctx, "delete", path="d"))["code"] == "invalid_arguments"
    assert (workspace / "d" / "e" / "f").exists()
    assert (await ok(ctx, "delete", path="d", recursive=True))["deleted"] is True
    assert not (workspace / "d").exists()


@pytest.mark.parametrize("path", [".", "", "d/..", "./"])
async def test_the_workspace_itself_cannot_be_deleted(workspace: Path, path: str) -> None:
    (workspace / "d").mkdir()
    err = await refused(make_ctx(workspace), "delete", path=path, recursive=True)
    assert err["code"] == "policy_denied"
    assert (workspace / "d").is_dir()


async def test_deleting_a_symlink_removes_the_link_not_its_outside_target(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    (workspace / "link").symlink_to(outside)
    assert (await ok(make_ctx(workspace), "delete", path="link"))["deleted"] is True
    assert not (workspace / "link").is_symlink()
    assert outside.read_text() == "precious"


ESCAPES = ["../outside.txt", "ABSOLUTE", "out-dir/outside.txt", "out-link"]
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("read", {}),
    ("write", {"content": "pwned"}),
    ("append", {"content": "pwned"}),
    ("list", {}),
    ("delete", {"recursive": True}),
]


# Deleting `out-link` removes the link itself, which is allowed (see the symlink delete test).
CASES = [
    pytest.param(escape, tool, extra, id=f"{tool}-{escape}")
    for escape in ESCAPES
    for tool, extra in CALLS
    if not (tool == "delete" and escape == "out-link")
]


@pytest.mark.parametrize(("escape", "tool", "extra"), CASES)
async def test_paths_leading_outside_the_workspace_are_denied(
    workspace: Path, tmp_path: Path, escape: str, tool: str, extra: dict[str, Any]
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    (workspace / "out-dir").symlink_to(tmp_path)
    (workspace / "out-link").symlink_to(outside)
    path = str(outside) if escape == "ABSOLUTE" else escape
    err = await refused(make_ctx(workspace), tool, path=path, **extra)
    assert err["code"] == "policy_denied"
    assert "relative to the workspace" in err["message"]
    assert outside.read_text() == "precious"


async def test_kill_switch_refuses_write_and_delete_but_not_read_or_list(workspace: Path) -> None:
    (workspace / "f").write_text("x")
    ctx = make_ctx(workspace, kill_switch=True)
    assert (await refused(ctx, "write", path="f", content="y"))["code"] == "policy_denied"
    assert (await refused(ctx, "append", path="f", content="y"))["code"] == "policy_denied"
    assert (await refused(ctx, "delete", path="f"))["code"] == "policy_denied"
    assert (await ok(ctx, "read", path="f"))["content"] == "x"
    assert [e["name"] for e in (await ok(ctx, "list"))["entries"]] == ["f"]


async def test_tools_carry_documented_annotations(workspace: Path) -> None:
    async with Client(build(make_ctx(workspace))) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    hints = {
        name: (t.annotations.read_only_hint, t.annotations.idempotent_hint, t.annotations.destructive_hint)
        for name, t in tools.items()
        if t.annotations is not None
    }
    assert hints == {
        "read": (True, True, False),
        "list": (True, True, False),
        "write": (False, True, True),
        "append": (False, False, True),  # appending twice adds twice: never retried automatically
        "delete": (False, True, True),
        # issue 20: publishing changes nothing here, and the same content is the same artifact
        "publish_artifact": (False, True, False),
        "fetch_artifact": (False, True, True),  # it writes (or replaces) a file, the same one each time
    }
    assert "append" not in tools["write"].input_schema["properties"]
    assert all(t.description for t in tools.values())
    assert tools["read"].output_schema is not None
