"""The `browser` profile: what `toolsets = [..., "browser"]` expands into."""

from __future__ import annotations

import asyncio
import re
import sys
import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError

from device_agent import browser_net
from device_agent.config import BROWSER_PACKAGE, BROWSER_READ_ONLY_TOOLS, AgentConfig
from device_agent.runner import check
from tests.integration.test_third_party_mcp import NPM_PREFIX
from tests.support import ROOT

NPM_BIN = NPM_PREFIX / "node_modules" / ".bin"


def config(tmp_path: Path, **values: object) -> AgentConfig:
    return AgentConfig(token="orrd_dev_b.secret", data_dir=tmp_path / "data", **values)


def test_the_profile_is_one_pinned_playwright_server_with_the_system_chromium(tmp_path: Path) -> None:
    cfg = config(tmp_path, toolsets=["system", "browser"])
    assert cfg.builtin_toolsets() == ["system"]
    [server] = cfg.all_mcp_servers()
    assert server.namespace == "browser"
    # The server runs behind the proxy that keeps the browser off private addresses.
    assert [server.command, *server.args[:2]] == [sys.executable, "-I", browser_net.__file__]
    args = server.args[server.args.index("--") + 1 :]
    assert args[:3] == ["npx", "--yes", BROWSER_PACKAGE]
    assert args[args.index("--executable-path") + 1] == "/usr/bin/chromium"
    assert "--headless" in args
    # A browser profile of its own under the data dir; the files it names itself there too,
    # outside the workspace.
    assert args[args.index("--user-data-dir") + 1] == str(tmp_path / "data" / "browser" / "profile")
    assert args[args.index("--output-dir") + 1] == str(tmp_path / "data" / "browser" / "output")
    assert cfg.policy().browser_private_origins == frozenset()
    assert set(server.read_only_tools) == set(BROWSER_READ_ONLY_TOOLS)
    assert "browser_click" not in server.read_only_tools
    # Code that reaches past the page waits for a person; clicks and typing do not.
    approval = cfg.effective_approval_required()
    assert "browser.browser_run_code_unsafe" in approval and "browser.browser_evaluate" in approval
    assert "browser.browser_click" not in approval and "gui.click" in approval
    assert cfg.policy_report()["approval_required"] == approval


def test_without_the_profile_nothing_is_added(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert cfg.all_mcp_servers() == [] and cfg.builtin_toolsets() == cfg.toolsets
    assert not any(p.startswith("browser.") for p in cfg.effective_approval_required())


def test_the_profile_settings_are_checked(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        toolsets=["browser"],
        browser={"command": ["/opt/mcp/playwright-mcp"], "headless": False, "chromium_sandbox": False, "args": ["--x"]},
    )
    [server] = cfg.all_mcp_servers()
    assert server.args[server.args.index("--") + 1] == "/opt/mcp/playwright-mcp"
    assert "--headless" not in server.args and "--no-sandbox" in server.args and server.args[-1] == "--x"
    cfg = config(
        tmp_path,
        toolsets=["browser"],
        browser={"allowed_private_origins": ["http://127.0.0.1:8080", "https://printer.lan"]},
    )
    assert cfg.policy().browser_private_origins == {("http", "127.0.0.1", 8080), ("https", "printer.lan", 443)}
    [server] = cfg.all_mcp_servers()
    proxy_flags = server.args[: server.args.index("--")]
    assert proxy_flags[2:] == ["--allow", "http://127.0.0.1:8080", "--allow", "https://printer.lan"]
    for origin in ("file:///etc", "http://127.0.0.1:8080/path", "127.0.0.1:8080", "http://u@127.0.0.1"):
        with pytest.raises(ValidationError, match="origin"):
            config(tmp_path, toolsets=["browser"], browser={"allowed_private_origins": [origin]})
    with pytest.raises(ValidationError, match="executable"):
        config(tmp_path, toolsets=["browser"], browser={"executable": "/usr/bin/chromium"})
    with pytest.raises(ValidationError, match="command"):
        config(tmp_path, toolsets=["browser"], browser={"command": []})


def test_check_names_a_missing_browser(tmp_path: Path) -> None:
    server = NPM_BIN / "playwright-mcp"  # .ci/run installs it; the server starts without a browser
    if not server.exists():
        pytest.skip("@playwright/mcp is not installed in .ci/npm")
    cfg = config(tmp_path, toolsets=["browser"], browser={"command": [str(server)], "executable_path": "/nowhere/x"})
    report = asyncio.run(check(cfg))
    assert report["ready"] is False
    assert "/nowhere/x" in report["toolsets"]["browser"]["reason"]
    assert "executable_path" in report["reason"]
    assert "browser_snapshot" in report["toolsets"]["browser"]["tools"]


def test_ci_installs_the_pinned_server() -> None:
    assert BROWSER_PACKAGE in (ROOT / ".ci" / "run").read_text()


def doc_pages() -> list[Path]:
    """README.md and the docs site's pages (the browser and other-platform guides live there)."""
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)]


def docs_toml(*markers: str) -> list[dict[str, object]]:
    """The TOML blocks of the docs holding every one of `markers`, parsed."""
    blocks = [b for p in doc_pages() for b in re.findall(r"^```toml\n(.*?)^```", p.read_text(), re.M | re.S)]
    return [tomllib.loads(block) for block in blocks if all(m in block for m in markers)]


def test_the_readme_configs_are_valid_agent_settings(tmp_path: Path) -> None:
    [browser] = docs_toml("[agent.browser]", "defaults shown")
    cfg = config(tmp_path, **browser["agent"])  # type: ignore[arg-type]
    assert cfg.browser == config(tmp_path).browser  # "defaults shown" is true
    assert any(BROWSER_PACKAGE in p.read_text() for p in doc_pages())
    [android] = docs_toml('namespace = "android"')
    cfg = config(tmp_path, **android["agent"])  # type: ignore[arg-type]
    [server] = cfg.all_mcp_servers()
    assert server.namespace == "android" and server.command == "npx" and server.roots == []
