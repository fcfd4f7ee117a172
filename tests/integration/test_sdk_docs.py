"""docs/sdk.md's Python examples run as written, in order, as one program (each block sees what
the ones before it defined), against a real server with a real agent (`web-1`, `role=web`); the
client finds them through `ORRERY_URL` and `ORRERY_API_KEY`, as the page says."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_docs_examples import Block, code_blocks
from tests.support import ROOT, Fleet

PAGE = ROOT / "docs" / "sdk.md"


def python_examples() -> list[Block]:
    return [b for b in code_blocks([PAGE]) if b.lang == "python"]


@pytest.fixture(scope="module")
def web_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("sdk-docs"), heartbeat_interval_s="1") as f:
        f.agent("web-1", {"role": "web"})
        yield f


def test_the_page_has_the_examples_this_test_runs() -> None:
    texts = [b.text for b in python_examples()]
    assert len(texts) >= 6
    assert any("orrery.Client()" in t for t in texts) and any("AsyncClient()" in t for t in texts)


def test_the_sdk_pages_python_examples_run_in_order_as_written(
    web_fleet: Fleet, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ORRERY_URL", web_fleet.server.url)
    monkeypatch.setenv("ORRERY_API_KEY", web_fleet.server.api_key)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "sdk_docs"}
    try:
        for block in python_examples():
            exec(compile(block.text, block.where, "exec"), namespace)  # the page's own code, as a reader runs it
    finally:
        client = namespace.get("client")
        if client is not None:
            client.close()  # type: ignore[attr-defined]
    printed = capsys.readouterr().out
    assert "['web-1']" in printed
    assert f"succeeded {os.uname().sysname}" in printed and "skipped" in printed
    assert "404 not_found" in printed and "unknown_tool ['shell.run'" in printed
    assert "ended: succeeded" in printed and printed.rstrip().endswith("succeeded")
    web = next(a for a in web_fleet.agents if a.name == "web-1")
    assert (web.workspace / "uname.txt").read_text().strip() == os.uname().sysname
