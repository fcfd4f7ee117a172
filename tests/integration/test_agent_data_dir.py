"""Every `orrery agent` subcommand that acts on an agent's data dir names it the same way, with
the agent's own precedence: `--data-dir`, then `ORRERY_AGENT_DATA_DIR`, then `data_dir` in the
`--config` file, then `./.orrery-agent/<device id>` of the token. Real CLI processes on real
ledgers (`approve` once read only `--data-dir` and fell back to ./.orrery-agent, so an owner who
had set ORRERY_AGENT_DATA_DIR, as `kill-switch` reads it, was told there was no ledger).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from device_agent.datadir import LEDGER_NAME
from device_agent.ledger import Approval, Ledger
from tests.support import run_cli

DEVICE = "dev_owner1"
TOKEN = f"orrd_{DEVICE}.secret"


def agent_dir(path: Path, *approval_ids: str) -> Path:
    """A data dir whose ledger has these approvals pending."""
    ledger = Ledger(path / LEDGER_NAME, DEVICE)
    try:
        for n, approval_id in enumerate(approval_ids):
            ledger.ask_approval(
                Approval(
                    approval_id, f"b{approval_id}", f"c{n}", "gui.click", {"x": 1}, "on the list", False, time.time()
                )
            )
    finally:
        ledger.close()
    return path


def states(path: Path) -> dict[str, str]:
    ledger = Ledger(path / LEDGER_NAME, DEVICE)
    try:
        return {a.approval_id: a.state for a in ledger.approvals()}
    finally:
        ledger.close()


def agent_cli(cwd: Path, *args: str, **env: str) -> tuple[int, str]:
    done = run_cli(None, "agent", *args, cwd=cwd, **env)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    (tmp_path / "elsewhere").mkdir()
    return tmp_path / "elsewhere"  # no ./.orrery-agent here: only what names the dir finds it


def ways(tmp_path: Path, data_dir: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each way to name `data_dir`: the options to pass and the environment to set."""
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\ndata_dir = "{data_dir}"\n')
    return {
        "flag": (["--data-dir", str(data_dir)], {}),
        "env": ([], {"ORRERY_AGENT_DATA_DIR": str(data_dir)}),
        "config": (["--config", str(config)], {}),
    }


@pytest.mark.parametrize("way", ["flag", "env", "config"])
def test_approvals_approve_deny_and_kill_switch_find_the_agent_however_its_data_dir_is_named(
    tmp_path: Path, cwd: Path, way: str
) -> None:
    data_dir = agent_dir(tmp_path / "agent", "apr_one", "apr_two")
    options, env = ways(tmp_path, data_dir)[way]
    code, out = agent_cli(cwd, "approvals", "--json", *options, **env)
    assert code == 0, out
    assert sorted(a["id"] for a in json.loads(out)) == ["apr_one", "apr_two"]
    code, out = agent_cli(cwd, "approve", "apr_one", *options, **env)
    assert code == 0, out
    code, out = agent_cli(cwd, "deny", "apr_two", "--reason", "no", *options, **env)
    assert code == 0, out
    assert states(data_dir) == {"apr_one": "approved", "apr_two": "denied"}
    code, out = agent_cli(cwd, "kill-switch", "on", *options, **env)
    assert code == 0 and (data_dir / "kill-switch").exists(), out
    code, out = agent_cli(cwd, "--check", "--toolset", "system", *options, **env)
    assert code == 0 and json.loads(out[: out.rindex("}") + 1])["data_dir"] == str(data_dir), out


def test_the_token_names_the_default_data_dir_for_every_subcommand(tmp_path: Path) -> None:
    default = agent_dir(tmp_path / ".orrery-agent" / DEVICE, "apr_one")
    agent_dir(tmp_path / ".orrery-agent" / "dev_other", "apr_other")  # another agent's, beside it
    code, out = agent_cli(tmp_path, "approvals", "--json", ORRERY_AGENT_TOKEN=TOKEN)
    assert code == 0 and [a["id"] for a in json.loads(out)] == ["apr_one"], out
    code, out = agent_cli(tmp_path, "approve", "apr_one", "--token", TOKEN)
    assert code == 0 and states(default) == {"apr_one": "approved"}, out
    code, out = agent_cli(tmp_path, "kill-switch", "on", ORRERY_AGENT_TOKEN=TOKEN)
    assert code == 0 and (default / "kill-switch").exists(), out


def test_the_flag_wins_over_the_environment_which_wins_over_the_config_file(tmp_path: Path, cwd: Path) -> None:
    flagged = agent_dir(tmp_path / "flagged", "apr_f")
    from_env = agent_dir(tmp_path / "env", "apr_e")
    config = ways(tmp_path, agent_dir(tmp_path / "configured", "apr_c"))["config"][0]
    code, out = agent_cli(
        cwd, "approvals", "--json", "--data-dir", str(flagged), *config, ORRERY_AGENT_DATA_DIR=str(from_env)
    )
    assert code == 0 and [a["id"] for a in json.loads(out)] == ["apr_f"], out
    code, out = agent_cli(cwd, "approvals", "--json", *config, ORRERY_AGENT_DATA_DIR=str(from_env))
    assert code == 0 and [a["id"] for a in json.loads(out)] == ["apr_e"], out
    code, out = agent_cli(cwd, "approve", "apr_e", *config, ORRERY_AGENT_DATA_DIR=str(from_env))
    assert code == 0 and states(from_env) == {"apr_e": "approved"}, out


def test_a_named_data_dir_without_a_ledger_or_a_bad_config_is_a_clear_error(tmp_path: Path, cwd: Path) -> None:
    code, out = agent_cli(cwd, "approve", "apr_x", ORRERY_AGENT_DATA_DIR=str(tmp_path / "empty"))
    assert code == 2 and "no agent ledger in" in out and "Traceback" not in out, out
    bad = tmp_path / "bad.toml"
    bad.write_text("[agent\n")
    code, out = agent_cli(cwd, "approvals", "--config", str(bad))
    assert code == 2 and "cannot read the agent's settings" in out and "Traceback" not in out, out
