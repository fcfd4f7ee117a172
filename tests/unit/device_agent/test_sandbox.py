"""The bwrap command line: what is mounted where, in which order, and what is refused up front."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from device_agent.config import AgentConfig, load
from device_agent.sandbox import Limits, Sandbox, SandboxUnavailable, signal_exit

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


def mounts(options: list[str]) -> list[tuple[str, str]]:
    """(kind, target) of every --tmpfs / --bind / --ro-bind, in order."""
    out = []
    for i, option in enumerate(options):
        if option == "--tmpfs":
            out.append((option, options[i + 1]))
        elif option in ("--bind", "--ro-bind"):
            out.append((option, options[i + 2]))
    return out


@needs_bwrap
def test_a_workspace_inside_the_data_dir_is_bound_after_the_data_dir_is_hidden(tmp_path: Path) -> None:
    data = tmp_path / "data"
    box = Sandbox.create(data / "workspace", data, network=False, limits=Limits())
    order = mounts(box.bwrap_options(data / "workspace"))
    assert order.index(("--tmpfs", str(data))) < order.index(("--bind", str(data / "workspace")))
    assert order[0] == ("--ro-bind", "/")


@needs_bwrap
def test_a_data_dir_inside_the_workspace_is_hidden_after_the_workspace_is_bound(tmp_path: Path) -> None:
    box = Sandbox.create(tmp_path, tmp_path / ".orrery-agent", network=False, limits=Limits())
    order = mounts(box.bwrap_options(tmp_path))
    assert order.index(("--bind", str(tmp_path))) < order.index(("--tmpfs", str(tmp_path / ".orrery-agent")))


@needs_bwrap
def test_network_is_unshared_unless_allowed(tmp_path: Path) -> None:
    closed = Sandbox.create(tmp_path / "w", tmp_path / "d", network=False, limits=Limits()).wrap(["true"], tmp_path)
    opened = Sandbox.create(tmp_path / "w", tmp_path / "d", network=True, limits=Limits()).wrap(["true"], tmp_path)
    assert "--unshare-all" in closed and "--share-net" not in closed
    assert "--share-net" in opened


@needs_bwrap
def test_the_command_runs_under_prlimit_after_the_separator(tmp_path: Path) -> None:
    limits = Limits(memory_mb=64, cpu_s=5, max_processes=0, file_size_mb=1)
    argv = Sandbox.create(tmp_path / "w", tmp_path / "d", network=False, limits=limits).wrap(["rm", "-x"], tmp_path)
    inner = argv[argv.index("--") + 1 :]
    assert inner[1:] == [f"--data={64 * 1024 * 1024}", "--cpu=5:6", f"--fsize={1024 * 1024}", "--", "rm", "-x"]
    assert Path(inner[0]).name == "prlimit"


def test_the_workspace_cannot_be_the_data_dir(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailable, match="cannot hide the data dir"):
        Sandbox.create(tmp_path, tmp_path, network=False, limits=Limits())


def test_a_missing_bwrap_is_one_clear_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailable, match="bubblewrap is not installed"):
        Sandbox.create(tmp_path / "w", tmp_path / "d", network=False, limits=Limits())


def test_signal_exit_reads_bwraps_128_plus_n() -> None:
    assert signal_exit(153) == 25  # SIGXFSZ
    assert signal_exit(1) is None and signal_exit(128) is None and signal_exit(255) is None


def test_sandbox_settings_come_from_toml_env_and_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = tmp_path / "agent.toml"
    toml.write_text('[agent]\nsandbox = "bwrap"\nsandbox_memory_mb = 512\nsandbox_file_size_mb = 0\n')
    monkeypatch.setenv("ORRERY_AGENT_SANDBOX_CPU_S", "30")
    cfg = load(toml, {"sandbox_network": True})
    assert cfg.sandbox == "bwrap" and cfg.sandbox_network is True
    assert cfg.sandbox_limits() == Limits(memory_mb=512, cpu_s=30, max_processes=256, file_size_mb=0)
    assert cfg.policy_report()["sandbox"] == {
        "kind": "bwrap",
        "network": True,
        "limits": {"memory_mb": 512, "cpu_s": 30, "max_processes": 256, "file_size_mb": None},
    }
    assert AgentConfig().policy_report()["sandbox"] == {"kind": "none"}


def test_a_server_installed_under_tmp_is_bound_read_only_over_the_private_tmp() -> None:
    """The sandbox's /tmp is private: a server program (or one it wraps after `--`) installed
    there is bound read-only, so it can start; other paths add nothing for the programs."""
    from device_agent.sandbox import _installed_under_tmp

    found = _installed_under_tmp(["/tmp/agent-x/.venv/bin/python", "-I", "w.py", "--", "/tmp/npm-y/bin/mcp", "--flag"])
    assert Path("/tmp/agent-x") in found and Path("/tmp/npm-y") in found
    assert Path("/tmp/w.py") not in found and all(p.parent == Path("/tmp") for p in found)
    assert not {Path("/tmp/agent-x"), Path("/tmp/npm-y")} & set(_installed_under_tmp(["/usr/bin/npx", "--yes"]))
