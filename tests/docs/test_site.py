"""The documentation site: `mkdocs build --strict` passes, strict really refuses a broken site,
the generated reference pages document everything the code has (so a new command, route,
setting or field without documentation fails here), and `mkdocs serve` serves it."""

from __future__ import annotations

import html
import importlib.util
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import ROOT, TLS, child_env, free_port, wait_until

MKDOCS = [sys.executable, "-m", "mkdocs"]
# mkdocs-material prints a notice about MkDocs 2 on every run; it is not a warning of this site.
ENV = {"NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}


def build(config_dir: Path, site: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*MKDOCS, "build", "--strict", *flags, "-d", str(site)],
        cwd=config_dir,
        env=child_env(**ENV),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    done = build(ROOT, out)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def test_the_site_builds_strictly(site: Path) -> None:
    for page in ("index.html", "tutorial/index.html", "reference/cli/index.html", "reference/rest/index.html"):
        assert (site / page).is_file(), page
    assert not (site / "hooks").exists(), "the build hook is code, not a page of the site"


def test_a_broken_link_or_nav_entry_fails_the_strict_build(tmp_path: Path) -> None:
    """The site's own configuration (mkdocs.yml) makes a missing page, a missing anchor and a nav
    entry to nothing fatal: a copy with those three defects does not build."""
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](no-such-page.md) and [nowhere](reference/cli.md#no-such-anchor)\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        config.read_text().replace("  - Tutorial: tutorial.md\n", "  - Tutorial: tutorial.md\n  - Lost: lost.md\n")
    )
    assert "lost.md" in config.read_text()
    done = build(tmp_path, tmp_path / "site")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Aborted with" in output and "in strict mode" in output, output
    for defect in ("no-such-page.md", "no-such-anchor", "lost.md"):  # each a warning, so each fatal
        assert re.search(rf"^WARNING .*{re.escape(defect)}", output, flags=re.M), f"{defect} not a warning:\n{output}"


# ---------------------------------------------------------------- the generated pages


@dataclass
class Page:
    sections: dict[str, str]  # heading text -> the page's text up to the next heading
    tables: dict[str, list[list[str]]]  # heading text -> the rows (cell texts) of its tables
    rows: list[list[str]]  # every table row of the page

    def section(self, heading: str) -> str:
        assert heading in self.sections, f"no section '{heading}' (have: {sorted(self.sections)[:20]} ...)"
        return self.sections[heading]

    def row(self, first: str, heading: str | None = None) -> list[str]:
        rows = self.rows if heading is None else self.tables.get(heading, [])
        found = [r for r in rows if r and r[0].split()[:1] == [first]]  # a first cell may stack names
        assert found, f"no table row for {first}" + (f" under '{heading}'" if heading else "")
        return found[0]


def _text(fragment: str) -> str:
    """What a reader sees of an HTML fragment: no tags, entities decoded, whitespace collapsed."""
    inline = re.sub(r"</?(?:code|a|strong|em|span)\b[^>]*>", "", fragment)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", inline)).split())


def _plain(text: str) -> str:
    """Plain text (a help string, a description) as it reads on the page: Markdown's code marks
    and Rich's escapes (`\\[agent]` in a typer help) do not show."""
    return " ".join(text.replace("`", "").replace("\\[", "[").split())


def _rows(fragment: str) -> list[list[str]]:
    return [
        [_text(c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, flags=re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", fragment, flags=re.S)
    ]


def read_page(site: Path, name: str) -> Page:
    raw = (site / "reference" / name / "index.html").read_text()
    body = raw[raw.index("<article") : raw.index("</article>")]
    body = re.sub(r'<a class="headerlink"[^>]*>.*?</a>', "", body)
    parts = re.split(r"<h[1-6][^>]*>(.*?)</h[1-6]>", body, flags=re.S)
    headings = [(_text(parts[i]), parts[i + 1]) for i in range(1, len(parts) - 1, 2)]
    return Page(
        sections={h: _text(f) for h, f in headings},
        tables={h: _rows(f) for h, f in headings},
        rows=_rows(body),
    )


def cli_commands() -> Iterator[tuple[str, Any]]:
    """Every `orrery` command line and its click command, as a user can run them."""
    import typer

    from device_agent import cli as agent_cli
    from device_agent import owner
    from orrery.cli import command

    def walk(cmd: Any, path: str) -> Iterator[tuple[str, Any]]:
        yield path, cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, f"{path} {name}")

    yield from walk(command(), "orrery")
    for word, app in agent_cli.SUBCOMMANDS.items():
        yield from walk(typer.main.get_command(app), f"orrery agent {word}")
    for word, sub in typer.main.get_command(owner.app).commands.items():  # type: ignore[attr-defined]
        yield from walk(sub, f"orrery agent {word}")


def test_the_cli_page_has_every_command_and_option(site: Path) -> None:
    page = read_page(site, "cli")
    commands = list(cli_commands())
    assert len(commands) > 40  # the walk itself sees the whole tree
    for path, cmd in commands:
        text = page.section(path)
        if cmd.help:
            assert _plain(cmd.help.split("\n")[0]) in text, path
        for param in cmd.params:
            names = [*param.opts, *param.secondary_opts] if param.param_type_name == "option" else [param.name.upper()]
            for name in names:
                assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), f"{path}: {name}"
            if param.help:
                assert _plain(param.help) in text, f"{path}: help of {param.name}"


def test_the_rest_page_has_every_route_parameter_response_and_schema(site: Path) -> None:
    from orchestrator.app import create_app
    from orchestrator.config import Settings

    document = create_app(Settings.model_construct(), migrate=False).openapi()
    page = read_page(site, "rest")
    operations = [(m.upper(), p, op) for p, ops in document["paths"].items() for m, op in ops.items()]
    assert len(operations) > 30
    for method, path, op in operations:
        text = page.section(f"{method} {path}")
        for parameter in op.get("parameters", []):
            assert parameter["name"] in text, f"{method} {path}: {parameter['name']}"
        for status in op["responses"]:
            assert re.search(rf"\b{status}\b", text), f"{method} {path}: {status}"
        if path.startswith("/v1/"):  # every /v1 route needs an API key: the page names its role
            assert re.search(r"Role: (viewer|operator|admin)\b", text), f"{method} {path}: {text[:200]}"
    for name, schema in document["components"]["schemas"].items():
        text = page.section(name)
        for prop in schema.get("properties", {}):
            assert re.search(rf"(?<!\w){re.escape(prop)}(?!\w)", text), f"schema {name}: {prop}"


def test_the_server_settings_page_has_every_setting_with_its_description(site: Path) -> None:
    from orchestrator.config import Settings

    page = read_page(site, "server-settings")
    for name, field in Settings.model_fields.items():
        assert field.description, f"setting {name} has no description (Field(description=...))"
        row = page.row(f"ORRERY_{name.upper()}")
        assert row[0].split()[1:] == [f"--{name.replace('_', '-')}"], row
        assert row[-1] == _plain(field.description), row


def test_the_agent_config_page_has_every_setting_flag_and_mcp_server_field(site: Path) -> None:
    import typer

    from device_agent import cli as agent_cli
    from device_agent.config import AgentConfig, BrowserProfile, McpServerConfig, RecordingSettings, ViewSettings

    page = read_page(site, "agent-config")
    for name, field in AgentConfig.model_fields.items():
        assert field.description, f"agent setting {name} has no description"
        row = page.row(name, "[agent]")
        assert row[0].split()[-1] == f"ORRERY_AGENT_{name.upper()}", row
        assert row[-1] == _plain(field.description), row
    # every flag of `orrery agent` that sets a setting is in the flag column
    flags = {word for row in page.tables["[agent]"] for word in row[0].split() if word.startswith("--")}
    command = typer.main.get_command(agent_cli.app)
    for param in command.params:
        if param.param_type_name == "option" and param.name not in ("config", "check"):
            assert param.opts[0] in flags, f"{param.opts[0]} is not in the agent settings table"
    for model, heading in (
        (McpServerConfig, "[[agent.mcp_servers]]"),
        (BrowserProfile, "[agent.browser]"),
        (ViewSettings, "[agent.view]"),
        (RecordingSettings, "[agent.recording]"),
    ):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
            assert page.row(name, heading)[-1] == _plain(field.description), f"{heading}: {name}"


def _submission_models() -> list[Any]:
    from pydantic import BaseModel

    from orchestrator.api.schemas import TaskCreate

    found: list[Any] = []

    def inner(annotation: Any) -> Iterator[Any]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield annotation
        for arg in getattr(annotation, "__args__", ()) or ():
            yield from inner(arg)

    def visit(model: Any) -> None:
        if model not in found:
            found.append(model)
            for field in model.model_fields.values():
                for sub in inner(field.annotation):
                    visit(sub)

    visit(TaskCreate)
    return found


def test_the_dag_page_has_every_field_of_the_submission(site: Path) -> None:
    hook = _hook()
    page = read_page(site, "dag")
    models = _submission_models()
    assert {"TaskCreate", "DagSpec", "NodeSpec", "EdgeSpec", "Placement", "CommandSpec", "ForEach"} <= {
        m.__name__ for m in models
    }
    for model in models:
        heading = _plain(hook.DAG_TITLES.get(model.__name__, model.__name__).replace("`", ""))
        for name, field in model.model_fields.items():
            key = field.alias or name
            row = page.row(key, heading)
            assert row[-1], f"{model.__name__}.{key} has no meaning (docs/hooks/reference.py DAG_NOTES)"


def test_the_error_codes_page_has_every_code(site: Path) -> None:
    from orrery import error_codes
    from protocol.errors import CloseCode

    page = read_page(site, "error-codes")
    cells = {row[0] for row in page.rows}
    for entry in error_codes.CODES:
        assert entry.code in cells, entry.code
    for close in CloseCode:
        assert str(int(close)) in cells, close


def test_the_agent_config_example_is_a_valid_configuration() -> None:
    from device_agent.config import AgentConfig

    text = (ROOT / "docs" / "reference" / "agent-config.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, flags=re.S)
    assert blocks
    for block in blocks:
        AgentConfig(**tomllib.loads(block)["agent"])


# ---------------------------------------------------------------- the hook itself


def _hook() -> Any:
    spec = importlib.util.spec_from_file_location("docs_reference_hook", ROOT / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_importing_the_hook_does_nothing_and_an_unknown_marker_is_an_error() -> None:
    from mkdocs.exceptions import PluginError

    path = list(sys.path)
    hook = _hook()
    assert sys.path == path
    assert set(hook.GENERATORS) == {"cli", "rest", "server-settings", "agent-config", "dag", "error-codes"}
    for name in hook.GENERATORS:
        page = ROOT / "docs" / "reference" / f"{name}.md"
        assert f"<!-- generated: {name} -->" in page.read_text(), f"{page.name} has no marker for its tables"
    with pytest.raises(PluginError, match="unknown generated section 'nope'"):
        hook.fill("text <!-- generated: nope --> more", "x.md")


# ---------------------------------------------------------------- mkdocs serve


def test_mkdocs_serve_answers_the_home_page_the_tutorial_and_a_reference_page(tmp_path: Path) -> None:
    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [*MKDOCS, "serve", "-a", f"127.0.0.1:{port}", "--no-livereload"],
        cwd=ROOT,
        env=child_env(**ENV),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"

    def home() -> str:
        """The home page's HTML once the server answers it (the first build takes seconds)."""
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        try:
            response = httpx.get(f"{base}/", timeout=5, verify=TLS)
        except httpx.TransportError:
            return ""
        return response.text if response.status_code == 200 else ""

    try:
        assert "<title>Orrery</title>" in wait_until(home, timeout=120, what="mkdocs serve's home page")
        tutorial = httpx.get(f"{base}/tutorial/", timeout=10)
        assert tutorial.status_code == 200 and "Tutorial" in tutorial.text
        cli = httpx.get(f"{base}/reference/cli/", timeout=10)
        assert cli.status_code == 200 and "<code>orrery tasks list</code>" in cli.text
        assert httpx.get(f"{base}/no-such-page/", timeout=10).status_code == 404
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{base}/", timeout=2, verify=TLS)
