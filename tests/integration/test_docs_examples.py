"""Every example in README.md and docs/**/*.md runs, as written, against a real server and real agents.

DAG examples (``yaml``/``yml``/``json`` blocks holding a ``nodes`` key) are written to a file
exactly as they stand and submitted with ``orrery submit FILE --watch`` in a subprocess; the task
must succeed (exit 0). The server has three enrolled, connected agents (``web-1`` and ``web-2``
with ``role=web``, ``analysis`` with ``role=analysis``, as in the demo) and an LLM: the fake
OpenAI-compatible model of tests/fakellm.py, which answers every ``kind: agent`` step with a
``finish`` call, so agent nodes really run their step loop (no dry run).

Schedule examples (blocks with a top-level ``cron`` key) are created as written with
``orrery schedules create FILE`` (no warning against that fleet), and the task each tick would
submit is submitted once with ``orrery submit``; it must succeed.

Shell examples (``sh`` blocks) run line by line in a fresh directory, with the venv's ``orrery``
first on PATH: a page's blocks in order, as one session (a reader's shell; a block that starts a
second ``orrery serve`` begins a new session, in a fresh directory). Lines starting with
``orrery`` (after ``VAR=value`` prefixes) run for real: ``orrery serve`` and ``orrery agent`` stay
in the background (waited on until the server answers ``/readyz`` and the device is ``idle``),
every other command must exit 0;
``kill %N`` stops the N-th background job (a line ending in ``&``) and waits for it to exit 0.
The only changes the test makes, all deliberate and minimal:

- the session serves on a free port (``ORRERY_PORT``): ``127.0.0.1:8765`` in a line becomes
  ``127.0.0.1:<port>``, and the CLI finds the server through ``ORRERY_URL``;
- a session whose blocks name ``https://`` or ``--ca-file`` gets HTTPS with a throwaway CA
  (``ORRERY_TLS_CERT``/``ORRERY_TLS_KEY``); that CA is written to ``ca.pem`` in the directory, so
  ``--ca-file ca.pem`` is used as written, and the CLI trusts it through ``SSL_CERT_FILE``;
  ``https://orchestrator:8765`` becomes ``https://localhost:<port>`` (no DNS name here);
- the n-th ``orrd_...`` of a session becomes the token printed by its n-th
  ``orrery devices enroll``, and ``apr_...`` the id of the oldest pending approval (waited for,
  as a person would wait for it to show in ``orrery approvals list``);
- a code block whose first line is a comment naming a file (``# dag.yaml — ...``) is written to
  that file in the session's directory first.

docs/tutorial.md is not run block by block here: tests/integration/test_tutorial.py runs it as
one session, in order, with this module's ``Session``.

Lines that cannot run here are listed in ``NOT_RUN`` with the reason; any other line fails.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme

from tests.fakellm import FakeLLM, call
from tests.support import ROOT, TLS, Fleet, child_env, free_port, wait_until


def doc_pages() -> list[Path]:
    """README.md and every page of the docs site (docs/**/*.md; docs/hooks is the site's code)."""
    docs = ROOT / "docs"
    pages = sorted(p for p in docs.rglob("*.md") if p.relative_to(docs).parts[0] != "hooks")
    return [ROOT / "README.md", *pages]


DOCS = doc_pages()
# Run in order as one session by tests/integration/test_tutorial.py, not block by block.
TUTORIAL = ROOT / "docs" / "tutorial.md"

# Lines of sh blocks the test does not run, with the reason (exact text, comments removed).
NOT_RUN = {
    "python3 -m venv .venv && . .venv/bin/activate && pip install -q -e '.[server]' && orrery demo": (
        "quick start: creating a venv and installing needs the network; tests/test_readme.py pins the "
        "line and test_the_demo_* below run `orrery demo` itself"
    ),
    "python3 -m venv .venv && . .venv/bin/activate && pip install -q -e '.[test]' && scripts/check": (
        "quick start: this is the whole test suite, this test among it; .ci/run runs it"
    ),
    'orrery approvals approve apr_1f3c... --reason "checked the arguments"': (
        "approvals: the id is a placeholder for one a device asked for; tests/integration/test_approvals.py "
        "approves and denies real ones with these commands"
    ),
    'orrery approvals deny apr_1f3c... --reason "not on production"': (
        "approvals: a placeholder id, as above (test_cli_lists_and_decides runs the command)"
    ),
    "orrery approvals list": (
        "approvals: this block shows the commands in the order a person uses them, beside a running "
        "fleet whose devices asked; test_cli_lists_and_decides runs them against one"
    ),
    "orrery agent approvals": (
        "approvals: runs on the device beside its agent (its data dir); "
        "test_local_only_approvals_are_decided_at_the_device runs it"
    ),
    "orrery agent approve apr_1f3c...": "approvals: a placeholder id, run at the device (as above)",
}
# The tutorial's own (tests/integration/test_tutorial.py); NOT_RUN above does not apply to it.
TUTORIAL_NOT_RUN = {
    "python3 -m venv .venv && . .venv/bin/activate && pip install -q -e '.[server]'": (
        "tutorial: creating a venv and installing needs the network; the test's venv is installed so"
    ),
}
SERVER_PLACEHOLDER = "https://orchestrator:8765"
LOCAL_SERVER = "127.0.0.1:8765"
TOKEN_PLACEHOLDER = "orrd_..."
APPROVAL_PLACEHOLDER = "apr_..."
SHELL = ("sh", "bash", "shell", "console")
DEVICES = {"web-1": {"role": "web"}, "web-2": {"role": "web"}, "analysis": {"role": "analysis"}}


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def file_name(self) -> str | None:
        """`dag.yaml` for a block opening with `# dag.yaml — ...`."""
        first = self.text.splitlines()[0] if self.text else ""
        m = re.match(r"#\s*([\w.-]+\.(?:ya?ml|json|toml))\b", first)
        return m.group(1) if m else None


def code_blocks(paths: list[Path] | None = None) -> list[Block]:
    """The fenced blocks of `paths` (default: every page but the tutorial, which runs as a whole)."""
    blocks = []
    for path in [p for p in DOCS if p != TUTORIAL] if paths is None else paths:
        text = path.read_text()
        for m in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, re.M | re.S):
            blocks.append(Block(path, text.count("\n", 0, m.start()) + 1, m.group(1).lower(), m.group(2)))
    return blocks


def dag_examples() -> list[Block]:
    return [
        b
        for b in code_blocks()
        if b.lang in ("yaml", "yml", "json")
        and re.search(r'^\s*"?nodes"?\s*:', b.text, re.M)
        and b not in schedule_examples()
    ]


def schedule_examples() -> list[Block]:
    """Schedule files: a top-level `cron:` key, their task's DAG inside."""
    return [b for b in code_blocks() if b.lang in ("yaml", "yml", "json") and re.search(r'^"?cron"?\s*:', b.text, re.M)]


def shell_examples() -> list[Block]:
    return [b for b in code_blocks() if b.lang in SHELL]


def test_the_docs_have_the_examples_this_test_expects() -> None:
    """The extraction itself: the README's DAG and its tour's block are found."""
    assert any(b.file_name == "dag.yaml" for b in dag_examples())
    assert any(b.file_name == "nightly.yaml" for b in schedule_examples())
    commands = [line for b in shell_examples() for line in b.text.splitlines()]
    assert any(line.startswith("orrery serve") for line in commands)
    assert any("orrery submit dag.yaml --watch" in line for line in commands)


# ---------------------------------------------------------------- the fake model and the fleet


def finish_steps(n: int = 200) -> list[dict[str, Any]]:
    return [call("finish", answer="done: nothing needed doing")] * n


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeLLM]:
    model = FakeLLM()
    model.add(*finish_steps())
    yield model
    model.close()


@pytest.fixture(scope="module")
def docs_fleet(tmp_path_factory: pytest.TempPathFactory, llm: FakeLLM) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("docs-fleet"), **llm.env()) as f:
        for name, labels in DEVICES.items():
            f.agent(name, labels)
        yield f


def orrery_env(**extra: str) -> dict[str, str]:
    env = child_env(**extra)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("COLUMNS", "160")
    return env


# ---------------------------------------------------------------- DAG examples


@pytest.mark.parametrize("block", dag_examples(), ids=lambda b: b.where)
def test_a_dag_example_is_accepted_and_runs_to_success(block: Block, docs_fleet: Fleet, tmp_path: Path) -> None:
    suffix = ".json" if block.lang == "json" else ".yaml"
    path = tmp_path / (block.file_name or f"example{suffix}")
    path.write_text(block.text)
    with docs_fleet.server.client() as c:
        before = {t["id"] for t in c.get("/v1/tasks", params={"limit": 200}).json()["items"]}
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "submit", str(path), "--watch"],
        capture_output=True,
        text=True,
        env=orrery_env(ORRERY_URL=docs_fleet.server.url, ORRERY_API_KEY=docs_fleet.server.api_key),
        cwd=tmp_path,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, f"{block.where}: `orrery submit --watch` failed:\n{result.stdout}\n{result.stderr}"
    with docs_fleet.server.client() as c:
        (task,) = [t for t in c.get("/v1/tasks", params={"limit": 200}).json()["items"] if t["id"] not in before]
        task = c.get(f"/v1/tasks/{task['id']}").json()
    assert task["state"] == "succeeded", task
    if block.file_name == "dag.yaml":
        # The README's example: `save` writes what `web` printed to uname.txt on the analysis box.
        nodes = {n["id"]: n for n in task["nodes"]}
        stdout = nodes["web"]["output"]["stdout"]
        assert stdout.startswith(os.uname().sysname), stdout
        analysis = next(a for a in docs_fleet.agents if a.name == "analysis")
        assert (analysis.workspace / "uname.txt").read_text() == stdout
        assert nodes["save"]["output"]["path"] == "uname.txt"
        assert nodes["save"]["output"]["size"] == len(stdout.encode())
        assert nodes["check"]["state"] == "succeeded"
        assert "uname.txt" in json.dumps(nodes["check"]["output"]), nodes["check"]["output"]


@pytest.mark.parametrize("block", schedule_examples(), ids=lambda b: b.where)
def test_a_schedule_example_is_created_and_its_task_runs_to_success(
    block: Block, docs_fleet: Fleet, tmp_path: Path
) -> None:
    """Created as written with `orrery schedules create FILE` (no warning against the docs' fleet),
    and the task it would submit at each tick submitted once now, with `orrery submit`: it succeeds."""
    import yaml

    path = tmp_path / (block.file_name or "schedule.yaml")
    path.write_text(block.text)
    env = orrery_env(ORRERY_URL=docs_fleet.server.url, ORRERY_API_KEY=docs_fleet.server.api_key)

    def orrery(*args: str) -> subprocess.CompletedProcess[str]:
        cli = [sys.executable, "-m", "orchestrator.cli", *args]
        return subprocess.run(cli, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180, check=False)

    made = orrery("schedules", "create", str(path), "--json")
    assert made.returncode == 0, f"{block.where}: `orrery schedules create` failed:\n{made.stdout}\n{made.stderr}"
    schedule = json.loads(made.stdout)
    assert schedule["warnings"] == [], schedule["warnings"]
    try:
        task = yaml.safe_load(block.text)["task"]
        dag = tmp_path / "task.yaml"
        dag.write_text(json.dumps({**task["dag"], "name": task.get("name", schedule["name"])}))
        ran = orrery("submit", str(dag), "--watch")
        assert ran.returncode == 0, f"{block.where}: its task failed:\n{ran.stdout}\n{ran.stderr}"
    finally:
        assert orrery("schedules", "delete", schedule["id"]).returncode == 0


def test_the_readme_dag_reads_on_as_an_edge_condition(tmp_path: Path) -> None:
    """The YAML reading the CLI must do: `on:` unquoted is the key "on", not the boolean True."""
    from orchestrator.dagfile import load_dag_file

    (block,) = [b for b in dag_examples() if b.file_name == "dag.yaml"]
    path = tmp_path / "dag.yaml"
    path.write_text(block.text)
    edges = load_dag_file(path)["edges"]
    assert any(e.get("on") == "always" for e in edges), edges


# ---------------------------------------------------------------- shell examples


class Session:
    """A user's shell in an empty directory: one sh block (or the whole tutorial), run line by line;
    background processes stopped at the end."""

    def __init__(self, cwd: Path, llm: FakeLLM, *, tls: bool, where: str = "") -> None:
        self.where = where  # the block being run, for messages
        self.cwd = cwd
        self.port = free_port()
        self.url = f"https://localhost:{self.port}" if tls else f"http://127.0.0.1:{self.port}"
        env = {f"ORRERY_{k.upper()}": v for k, v in llm.env().items()}
        self.tls: ssl.SSLContext = TLS
        if tls:
            ca = trustme.CA()
            cert = ca.issue_cert("localhost", "127.0.0.1")
            cert.cert_chain_pems[0].write_to_path(str(cwd / "server-cert.pem"))
            cert.private_key_pem.write_to_path(str(cwd / "server-key.pem"))
            ca.cert_pem.write_to_path(str(cwd / "ca.pem"))
            env |= {
                "ORRERY_TLS_CERT": str(cwd / "server-cert.pem"),
                "ORRERY_TLS_KEY": str(cwd / "server-key.pem"),
                "SSL_CERT_FILE": str(cwd / "ca.pem"),
            }
            self.tls = ssl.create_default_context(cafile=str(cwd / "ca.pem"))
        self.env = orrery_env(ORRERY_PORT=str(self.port), ORRERY_URL=self.url, **env)
        self.tokens: list[str] = []
        self.used_tokens = 0
        self.background: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.jobs: list[subprocess.Popen[bytes]] = []  # started with a trailing `&`, as `kill %N` counts
        self.transcript: list[str] = []

    def http(self) -> httpx.Client:
        key = (self.cwd / ".orrery" / "admin.key").read_text().strip()
        return httpx.Client(base_url=self.url, verify=self.tls, headers={"Authorization": f"Bearer {key}"}, timeout=10)

    def substitute(self, line: str) -> str:
        line = line.replace(SERVER_PLACEHOLDER, self.url).replace(LOCAL_SERVER, f"127.0.0.1:{self.port}")
        while TOKEN_PLACEHOLDER in line:
            assert self.used_tokens < len(self.tokens), f"{self.where}: `{TOKEN_PLACEHOLDER}` before an enroll"
            line = line.replace(TOKEN_PLACEHOLDER, self.tokens[self.used_tokens], 1)
            self.used_tokens += 1
        if APPROVAL_PLACEHOLDER in line:
            line = line.replace(APPROVAL_PLACEHOLDER, self.pending_approval())
        return line

    def pending_approval(self) -> str:
        def oldest() -> str | None:
            with self.http() as c:
                items = c.get("/v1/approvals", params={"state": "pending"}).json()["items"]
            return str(items[0]["id"]) if items else None

        return wait_until(oldest, 60, f"{self.where}: an approval to be pending for `{APPROVAL_PLACEHOLDER}`")

    def run(self, line: str) -> None:
        words = shlex.split(self.substitute(line), comments=True)
        env = dict(self.env)
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        job = bool(words) and words[-1] == "&"
        if job:
            words.pop()
        if words and words[0] == "kill" and all(re.fullmatch(r"%\d+", w) for w in words[1:]):
            self.kill([int(w[1:]) for w in words[1:]])
            return
        assert words and words[0] == "orrery", f"{self.where}: not an orrery command: {line!r}"
        if words[1:2] in (["serve"], ["agent"]):
            self.start(words, env, job)
        else:
            self.call(words, env)

    def start(self, words: list[str], env: dict[str, str], job: bool) -> None:
        log = self.cwd / f"{words[1]}-{len(self.background)}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                words, cwd=self.cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.background.append((" ".join(words), proc, log))
        if job:
            self.jobs.append(proc)

        def alive() -> None:
            if proc.poll() is not None:
                raise AssertionError(f"{self.where}: `{' '.join(words)}` exited {proc.returncode}:\n{log.read_text()}")

        if words[1] == "serve":

            def ready() -> bool:
                alive()
                try:
                    return httpx.get(f"{self.url}/readyz", verify=self.tls, timeout=1).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(ready, 60, f"`{' '.join(words)}` to be ready")
            self.transcript.append(f"$ {' '.join(words)}  (background)\n{log.read_text()}")
            return
        token = env.get("ORRERY_AGENT_TOKEN") or words[words.index("--token") + 1]
        device_id = token.removeprefix("orrd_").split(".", 1)[0]

        def idle() -> bool:
            alive()
            with self.http() as c:
                return bool(c.get(f"/v1/devices/{device_id}").json()["state"] == "idle")

        wait_until(idle, 60, f"device {device_id} of `{' '.join(words)}` to be idle")
        self.transcript.append(f"$ {' '.join(words)}  (background, device {device_id} idle)")

    def kill(self, numbers: list[int]) -> None:
        """`kill %N ...`: SIGTERM to those jobs; each must end cleanly (exit 0) within a bound."""
        for n in numbers:
            assert 1 <= n <= len(self.jobs), f"{self.where}: `kill %{n}` with {len(self.jobs)} background jobs"
            os.killpg(self.jobs[n - 1].pid, signal.SIGTERM)
        for n in numbers:
            proc = self.jobs[n - 1]
            code = proc.wait(timeout=30)
            assert code == 0, f"{self.where}: job %{n} (`{proc.args}`) exited {code} on SIGTERM"
        self.transcript.append(f"$ kill {' '.join(f'%{n}' for n in numbers)}")

    def call(self, words: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(words, cwd=self.cwd, env=env, capture_output=True, text=True, timeout=180, check=False)
        self.transcript.append(f"$ {' '.join(words)}\n{result.stdout}{result.stderr}")
        if result.returncode != 0:
            raise AssertionError(f"exited {result.returncode}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
        if words[1:3] == ["devices", "enroll"]:
            tokens = re.findall(r"orrd_[\w-]+\.[\w-]+", result.stdout)
            assert tokens, f"{self.where}: no token in the output of `{' '.join(words)}`:\n{result.stdout}"
            self.tokens.append(tokens[0])
        return result

    def logs(self) -> str:
        return "\n".join(f"--- {cmd}\n{log.read_text()[-2000:]}" for cmd, _p, log in self.background)

    def stop(self) -> None:
        for _cmd, proc, _log in reversed(self.background):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)


def runnable_lines(block: Block, not_run: dict[str, str] = NOT_RUN) -> list[str]:
    lines = []
    for raw in block.text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if re.sub(r"(^|\s)#.*$", "", line).strip() in not_run:
            continue
        lines.append(line)
    return lines


def write_named_files(blocks: list[Block], directory: Path) -> None:
    """Blocks opening with `# NAME.yaml — ...` are files the reader saves before using them."""
    for block in blocks:
        if block.file_name:
            (directory / block.file_name).write_text(block.text)


def uses_tls(block: Block) -> bool:
    return "https://" in block.text or "--ca-file" in block.text


def starts_a_server(block: Block) -> bool:
    return any(re.search(r"(^|\s)orrery serve\b", line.split("#", 1)[0]) for line in runnable_lines(block))


def shell_sessions(blocks: list[Block]) -> list[list[Block]]:
    """A page's sh blocks, in order, grouped into sessions: a block that starts `orrery serve` while
    its session already has one begins a new session; any other block goes on in the current one
    (it may use the server, devices and files the blocks above it left, as a reader's shell would)."""
    sessions: list[list[Block]] = []
    for block in [b for b in blocks if runnable_lines(b)]:
        if not sessions or (starts_a_server(block) and any(starts_a_server(b) for b in sessions[-1])):
            sessions.append([])
        sessions[-1].append(block)
    return sessions


def test_a_pages_blocks_share_a_session_until_one_starts_a_second_server() -> None:
    page = ROOT / "docs" / "page.md"
    serve, use, again = (
        Block(page, 1, "sh", "orrery serve &\norrery devices enroll web-1\n"),
        Block(page, 5, "sh", "orrery devices list\n"),
        Block(page, 9, "sh", "# a second server\norrery serve --port 9000 &\n"),
    )
    quiet = Block(page, 12, "sh", "# nothing to run\n")
    assert shell_sessions([use, serve, quiet, use, again, use]) == [[use, serve, use], [again, use]]
    assert shell_sessions([quiet]) == []


def pages_with_shell_examples() -> list[Path]:
    return sorted({b.path for b in shell_examples()}, key=DOCS.index)


@pytest.mark.parametrize("page", pages_with_shell_examples(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_pages_shell_examples_run_as_written(page: Path, tmp_path: Path, llm: FakeLLM) -> None:
    """One session per page (a new one only where a block starts a second server), so a page pays
    for the servers its blocks start and no more."""
    sessions = shell_sessions([b for b in shell_examples() if b.path == page])
    if not sessions:
        pytest.skip(f"{page.name}: every line is in NOT_RUN ({'; '.join(sorted(set(NOT_RUN.values())))})")
    failures = []
    for n, blocks in enumerate(sessions):
        cwd = tmp_path / f"session-{n}"
        cwd.mkdir()
        write_named_files(code_blocks(), cwd)
        session = Session(cwd, llm, tls=any(uses_tls(b) for b in blocks))
        try:
            for block in blocks:
                session.where = block.where
                for line in runnable_lines(block):  # every line is tried, so one run names every broken one
                    try:
                        session.run(line)
                    except AssertionError as exc:
                        failures.append(f"{block.where}: {line}\n    {str(exc).strip()}")
        finally:
            session.stop()
        if failures:
            break  # a later session would only repeat the setup that failed here
    assert not failures, "\n\n".join(failures) + "\n\nbackground logs:\n" + session.logs()


def test_every_line_not_run_is_still_in_the_docs() -> None:
    """The allowlists cannot keep excusing a line that was edited or removed."""
    text = "\n".join(p.read_text() for p in DOCS if p != TUTORIAL)
    for line in NOT_RUN:
        assert line in text, line
    for line in TUTORIAL_NOT_RUN:
        assert line in TUTORIAL.read_text(), line


def test_the_docs_pages_are_read_recursively_but_not_the_sites_hooks() -> None:
    pages = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert {"README.md", "docs/index.md", "docs/tutorial.md", "docs/how-to/fan-out.md"} <= pages, pages
    assert not any(p.startswith("docs/hooks/") for p in pages), pages


# ---------------------------------------------------------------- orrery demo


def test_the_demo_prints_no_path_that_vanishes(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "demo"],
        capture_output=True,
        text=True,
        env=orrery_env(),
        cwd=tmp_path,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    printed = re.findall(r"(/[\w./-]+)", result.stdout + result.stderr)
    paths = [p for p in printed if p.startswith(("/tmp", "/var", str(tmp_path))) or "admin.key" in p]
    assert all(Path(p).exists() for p in paths), paths


def test_the_demo_with_a_data_dir_prints_the_admin_key_path_and_keeps_it(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "demo", "--data-dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        env=orrery_env(),
        cwd=tmp_path,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    key_path = tmp_path / "demo" / "server" / "admin.key"
    assert str(key_path) in result.stdout + result.stderr
    assert key_path.read_text().startswith("orrk_")


def test_demo_keep_leaves_a_dashboard_and_a_viewer_key_then_stops_on_ctrl_c(tmp_path: Path) -> None:
    out = tmp_path / "demo.out"
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "demo", "--keep"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=orrery_env(),
            cwd=tmp_path,
        )
    try:

        def printed() -> re.Match[str] | None:
            assert proc.poll() is None, out.read_text()
            return re.search(r"dashboard:\s+(\S+)\s*\n\s*viewer key:\s+(orrk_\S+)", out.read_text())

        url, key = wait_until(printed, 180, "the dashboard URL and viewer key").groups()
        assert "Ctrl-C" in out.read_text()
        agents = [
            int(p)
            for p in subprocess.run(
                ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, check=False
            ).stdout.split()
        ]
        assert len(agents) == 3, agents
        page = httpx.get(url, timeout=10)
        assert page.status_code == 200 and "<html" in page.text.lower()
        tasks = httpx.get(f"{url.rstrip('/')}/v1/tasks", headers={"Authorization": f"Bearer {key}"}, timeout=10)
        assert tasks.status_code == 200, tasks.text
        (task,) = tasks.json()["items"]
        assert task["state"] == "succeeded"
        me = httpx.get(f"{url.rstrip('/')}/v1/api-keys/me", headers={"Authorization": f"Bearer {key}"}, timeout=10)
        assert me.json()["role"] == "viewer"
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, out.read_text()
        assert time.monotonic() - started < 30
        for pid in agents:
            wait_until(lambda pid=pid: not _alive(pid), 10, f"agent {pid} to be gone")
        with pytest.raises(httpx.HTTPError):
            httpx.get(url, timeout=2, verify=TLS)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (reaped later by nobody) counts as gone
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()
