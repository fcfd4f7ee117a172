"""Device policy: program lists, workspace containment, env scrubbing, kill switch (SPEC section 5)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from device_agent.policy import Policy, PolicyDenied, check_action, check_program, child_env, contain


def test_policy_denied_carries_the_wire_error_code() -> None:
    assert PolicyDenied("x").code == "policy_denied"


def test_default_policy_allows_any_program() -> None:
    check_program(Policy(), "anything-at-all")
    check_program(Policy(), "/usr/bin/env")


@pytest.mark.parametrize("argv0", ["rm", "/bin/rm", "./rm", "/usr/bin/rm"])
def test_deny_list_refuses_a_program_in_any_spelling(argv0: str) -> None:
    with pytest.raises(PolicyDenied, match="deny list"):
        check_program(Policy(shell_deny=("rm",)), argv0)


def test_deny_list_is_checked_before_the_allow_list() -> None:
    with pytest.raises(PolicyDenied, match="deny list"):
        check_program(Policy(shell_allow=("rm",), shell_deny=("rm",)), "rm")


def test_allow_list_admits_listed_names_and_names_the_list_when_refusing() -> None:
    policy = Policy(shell_allow=("echo", "git"))
    check_program(policy, "echo")
    with pytest.raises(PolicyDenied, match="allowed programs: echo, git"):
        check_program(policy, "ls")


def test_allow_list_basename_does_not_admit_a_same_named_script_by_path() -> None:
    with pytest.raises(PolicyDenied):
        check_program(Policy(shell_allow=("echo",)), "./echo")


def test_allow_list_absolute_entry_admits_that_path_and_the_bare_name_resolving_to_it() -> None:
    echo = shutil.which("echo")
    assert echo is not None
    policy = Policy(shell_allow=(echo,))
    check_program(policy, echo)
    check_program(policy, "echo")
    with pytest.raises(PolicyDenied):
        check_program(policy, "/nonexistent/dir/echo")


def test_empty_allow_list_refuses_everything() -> None:
    with pytest.raises(PolicyDenied, match=r"\(nothing\)"):
        check_program(Policy(shell_allow=()), "echo")


def test_contain_resolves_relative_paths_inside_the_workspace(tmp_path: Path) -> None:
    assert contain(tmp_path, "a/b.txt") == tmp_path.resolve() / "a" / "b.txt"
    assert contain(tmp_path, "a/../b.txt") == tmp_path.resolve() / "b.txt"
    assert contain(tmp_path, ".") == tmp_path.resolve()


@pytest.mark.parametrize("escape", ["..", "../x", "a/../../x", "/etc/passwd", "a\x00b"])
def test_contain_refuses_paths_leaving_the_workspace(tmp_path: Path, escape: str) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with pytest.raises(PolicyDenied, match="relative to the workspace"):
        contain(workspace, escape)


def test_contain_refuses_a_symlink_that_points_outside(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (tmp_path / "outside").mkdir()
    (workspace / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(PolicyDenied):
        contain(workspace, "link")
    with pytest.raises(PolicyDenied):
        contain(workspace, "link/file.txt")


def test_contain_follows_a_symlink_that_stays_inside(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert contain(tmp_path, "alias/f") == tmp_path.resolve() / "real" / "f"


def test_contain_without_following_names_the_link_itself(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "link").symlink_to(tmp_path)
    assert contain(workspace, "link", follow_symlinks=False) == workspace.resolve() / "link"
    with pytest.raises(PolicyDenied):
        contain(workspace, "link/x", follow_symlinks=False)


def test_contain_refuses_a_symlink_loop(tmp_path: Path) -> None:
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(PolicyDenied):
        contain(tmp_path, "loop/x")


def test_child_env_drops_variables_that_look_like_secrets() -> None:
    base = {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "FOO_TOKEN": "t",
        "ORRERY_AGENT_TOKEN": "t",
        "AWS_SECRET_ACCESS_KEY": "s",
        "AWS_ACCESS_KEY_ID": "k",
        "db_password": "p",
        "OPENAI_API_KEY": "k",
        "GOOGLE_APPLICATION_CREDENTIALS": "/c.json",
    }
    assert child_env(Policy(), base) == {"PATH": "/usr/bin", "HOME": "/home/u"}


def test_child_env_uses_the_policy_list() -> None:
    assert child_env(Policy(scrub_env=("FOO",)), {"FOO_X": "1", "X_TOKEN": "2"}) == {"X_TOKEN": "2"}


def test_kill_switch_refuses_actions_but_not_read_only_tools() -> None:
    check_action(Policy(kill_switch=True), tool_is_read_only=True)
    check_action(Policy(), tool_is_read_only=False)
    with pytest.raises(PolicyDenied, match="kill switch"):
        check_action(Policy(kill_switch=True), tool_is_read_only=False)
