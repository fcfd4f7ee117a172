"""The orchestrator's commands: the server, the demo and the client CLI over the REST API (SPEC section 3).

`orrery` (orrery/cli.py) adds the device agent's `orrery agent`; `python -m orchestrator.cli` runs these alone."""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.text import Text

from orchestrator.config import Settings
from orchestrator.dagfile import DagFileError, load_dag_file, locate
from orchestrator.domain.model import DEVICE_NAME_WORDS
from orrery.exits import guarded
from orrery.logs import setup_logging
from orrery.options import parse_labels
from orrery.sdk import calls
from orrery.sdk.client import Client
from orrery.sdk.errors import OrreryError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Orrery: one task across many devices.",
    pretty_exceptions_enable=False,
)
devices_app = typer.Typer(no_args_is_help=True, help="Enroll and manage devices.")
tasks_app = typer.Typer(no_args_is_help=True, help="List, inspect, watch and cancel tasks.")
keys_app = typer.Typer(no_args_is_help=True, help="Create, list and revoke API keys.")
approvals_app = typer.Typer(no_args_is_help=True, help="Commands waiting for a person's approval: list, approve, deny.")
schedules_app = typer.Typer(no_args_is_help=True, help="Cron schedules that submit a task at every tick.")
artifacts_app = typer.Typer(no_args_is_help=True, help="Files a task's commands published: list, get.")
app.add_typer(devices_app, name="devices")
app.add_typer(tasks_app, name="tasks")
app.add_typer(keys_app, name="api-keys")
app.add_typer(approvals_app, name="approvals")
app.add_typer(artifacts_app, name="artifacts")
app.add_typer(schedules_app, name="schedules")

console = Console()
err = Console(stderr=True)

ServerOpt = Annotated[str | None, typer.Option("--server", help="orchestrator URL (ORRERY_URL)")]
KeyOpt = Annotated[str | None, typer.Option("--api-key", help="API key (ORRERY_API_KEY, else <data-dir>/admin.key)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]


def _fail(message: str, code: int = 1) -> NoReturn:
    """One error line on stderr (printed literally, never as Rich markup), then exit `code`."""
    err.print(Text.assemble(("error", "red"), ": ", message), soft_wrap=True)
    raise typer.Exit(code)


# The SDK's words for a missing key name its argument; the CLI's name its option.
NO_KEY = (
    "no API key: pass --api-key, set ORRERY_API_KEY, "
    "or set ORRERY_DATA_DIR to the server's data directory (it holds admin.key)"
)


def problem_lines(exc: OrreryError) -> list[str]:
    """An API problem as short lines: `code: detail`, then its further problems and candidates."""
    lines = [f"{exc.code}: {NO_KEY if exc.detail == calls.NO_KEY else exc.detail}"]
    problems = exc.body.get("problems") or []
    for p in problems[1:] if len(problems) > 1 else []:
        if isinstance(p, dict):
            lines.append(f"  - {p.get('code')}: {p.get('message')}")
    for cand in exc.body.get("candidates") or []:
        if isinstance(cand, dict):
            lines.append(f"  - {cand.get('id')}  {cand.get('name', '')}".rstrip())
    return lines


@contextlib.contextmanager
def _api(server: str | None, api_key: str | None) -> Iterator[Client]:
    """A client for one command; an API problem becomes a readable message and exit code 1."""
    try:
        with Client(server, api_key) as client:
            yield client
    except OrreryError as exc:
        first, *rest = problem_lines(exc)
        err.print(Text.assemble(("error", "red"), " ", first), soft_wrap=True)
        for line in rest:
            err.print(Text(line), soft_wrap=True)
        raise typer.Exit(1) from None


def _json(c: Client, call: calls.Call[Any]) -> Any:
    """The server's JSON answer to a request the SDK builds, as it was sent: what `--json` prints
    and the terminal views read."""
    return c.request(call.method, call.path, params=call.params, json=call.json, headers=call.headers)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            number = version("orrery")
        except PackageNotFoundError:
            number = "unknown"
        sys.stdout.write(f"orrery {number}\n")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    pass


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


# ---------------------------------------------------------------- serve


def _settings_options() -> list[inspect.Parameter]:
    """One `--flag` per Settings field (SPEC section 8: every setting has a flag on serve)."""
    params = []
    for name, field in Settings.model_fields.items():
        annotation = field.annotation
        base = str if annotation is None else annotation
        variable = f"ORRERY_{name.upper()}"
        option = typer.Option(
            None,
            f"--{name.replace('_', '-')}",
            help=f"{field.description} ({variable})" if field.description else variable,
        )
        params.append(
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=_optional(base))
        )
    params.append(
        inspect.Parameter(
            "no_migrate",
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(False, "--no-migrate", help="do not apply the schema at start-up"),
            annotation=bool,
        )
    )
    return params


def _optional(annotation: Any) -> Any:
    text = str(annotation)
    if "Path" in text:
        return Path | None
    if annotation in (int, float, str, bool):
        return annotation | None
    if "float" in text:
        return float | None
    if "int" in text:
        return int | None
    return str | None


def serve(**options: Any) -> None:
    """Run the orchestrator: REST API and device WebSocket on one port."""
    import uvicorn

    from orchestrator.app import create_app
    from orchestrator.gateway.websocket import websocket_options
    from orchestrator.server import StartRefused, check_port, claim_store, server_options

    no_migrate = bool(options.pop("no_migrate", False))
    try:
        settings = Settings(**{k: v for k, v in options.items() if v is not None})
    except ValidationError as exc:
        err.print(f"[red]invalid setting[/red]: {exc}")
        raise typer.Exit(2) from None
    setup_logging(settings.log_format, settings.log_level)
    if settings.host not in ("127.0.0.1", "localhost", "::1") and not settings.tls_cert:
        logging.getLogger("orrery").warning(
            "serving on %s without TLS: API keys and device tokens cross the network in clear", settings.host
        )
    try:  # before anything starts: the engine must not run on a store another server is using
        claim_store(settings)
        check_port(settings.host, settings.port)
    except StartRefused as exc:
        _fail(str(exc))
    uvicorn.run(
        create_app(settings, migrate=not no_migrate),
        host=settings.host,
        port=settings.port,
        **websocket_options(settings),
        log_config=None,
        access_log=False,
        ssl_certfile=str(settings.tls_cert) if settings.tls_cert else None,
        ssl_keyfile=str(settings.tls_key) if settings.tls_key else None,
        timeout_graceful_shutdown=5,
        **server_options(settings),
    )


serve.__signature__ = inspect.Signature(_settings_options())  # type: ignore[attr-defined]
app.command("serve")(serve)


@app.command()
def migrate(
    database_url: Annotated[str | None, typer.Option(help="ORRERY_DATABASE_URL")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="ORRERY_DATA_DIR")] = None,
) -> None:
    """Apply the database schema (Alembic upgrade to head)."""
    from orchestrator.store.migrate import upgrade

    values: dict[str, Any] = {k: v for k, v in {"database_url": database_url, "data_dir": data_dir}.items() if v}
    settings = Settings(**values)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url)
    console.print("schema is up to date")


# ---------------------------------------------------------------- devices


DEVICE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")  # as the server's enrollment checks it


@devices_app.command("enroll")
def devices_enroll(
    name: str,
    label: Annotated[list[str] | None, typer.Option(help="KEY=VALUE, repeatable")] = None,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Enroll a device; prints its id and token (shown once)."""
    if not DEVICE_NAME.fullmatch(name):
        _fail(
            f"a device name may hold only {DEVICE_NAME_WORDS} (at most 100 characters); got {name!r}",
            2,
        )
    with _api(server, api_key) as c:
        result = _json(c, calls.enroll(name, parse_labels(label)))
    if json_out:
        _print_json(result)
    else:
        # soft_wrap: the token and the command stay whole on one line at any width, to copy and paste
        console.print(
            f"device id: {result['id']}\ntoken:     {result['token']}", markup=False, highlight=False, soft_wrap=True
        )
        console.print("[dim]the token is shown once; start the agent with:[/dim]")
        console.print(
            f"  orrery agent --server {c.server} --token <token>", markup=False, highlight=False, soft_wrap=True
        )


@devices_app.command("list")
def devices_list(json_out: JsonOpt = False, server: ServerOpt = None, api_key: KeyOpt = None) -> None:
    """List devices with their state, labels, current batch and queue."""
    with _api(server, api_key) as c:
        items = _json(c, calls.devices())["items"]
    if json_out:
        _print_json(items)
    else:
        from orchestrator.console import devices_table, print_table

        print_table(console, devices_table(items))


@devices_app.command("show")
def devices_show(device_id: str, server: ServerOpt = None, api_key: KeyOpt = None) -> None:
    """One device as JSON."""
    with _api(server, api_key) as c:
        _print_json(_json(c, calls.device(device_id)))


CONFIRM_WAIT_S = 3.0  # how long `stop`, `resume` and `uncordon` wait to see the agent apply them


def _applied(c: Client, result: dict[str, Any]) -> str:
    """For a control the agent must apply (a stop, a resume, a budget reset): whether it has, after
    waiting a little for it. The orchestrator sends it until the agent reports it applied."""
    if result.get("control_applied", 0) >= result.get("control_generation", 0):
        return "; applied by its agent" if result.get("control_generation") else ""
    if not result.get("connected"):
        return "; its agent is not connected: it gets it when it connects (it is sent until it applies it)"
    deadline = time.monotonic() + CONFIRM_WAIT_S
    while result.get("control_applied", 0) < result.get("control_generation", 0):
        if time.monotonic() >= deadline:
            return (
                "; its agent has not confirmed it yet (offline?): it is sent until the agent applies it, "
                "see 'orrery devices show'"
            )
        time.sleep(0.1)
        result = _json(c, calls.device(result["id"]))
    return "; applied by its agent" if result.get("control_generation") else ""


def _device_action(action: str) -> Any:
    def command(device_id: str, server: ServerOpt = None, api_key: KeyOpt = None) -> None:
        with _api(server, api_key) as c:
            if action == "revoke":
                result = c.request("DELETE", f"/v1/devices/{device_id}")
            else:
                result = c.request("POST", f"/v1/devices/{device_id}/{action}")
            applied = _applied(c, result) if action in ("resume", "uncordon") else ""
        console.print(f"{device_id}: {result.get('state')}{applied}", markup=False, highlight=False)

    command.__doc__ = {
        "drain": "Finish current work, take no new work.",
        "cordon": "Take no new work.",
        "uncordon": "Back to service (the agent's safety budgets reset after a breach).",
        "resume": "Lift an emergency stop: the device takes work and runs action tools again.",
        "revoke": "Revoke the device's token and close its connection.",
    }[action]
    return command


for _action in ("drain", "cordon", "uncordon", "resume", "revoke"):
    devices_app.command(_action)(_device_action(_action))


@devices_app.command("stop")
def devices_stop(
    device_id: str,
    reason: Annotated[
        str, typer.Option("--reason", help="why (recorded in the device's history, shown to its agent)")
    ] = "",
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Emergency stop: cancel the running batch now (processes killed, held GUI keys released),
    take no work, and refuse every action tool on the device until `orrery devices resume`."""
    with _api(server, api_key) as c:
        result = c.request("POST", f"/v1/devices/{device_id}/stop", json={"reason": reason})
        applied = _applied(c, result)
    state, why = str(result.get("state")), str(result.get("stop_reason") or "")
    # The reason reads "stopped by an operator (key ...): ..."; say "stopped" once.
    said = why if why.startswith(state) else f"{state} ({why})" if why else state
    console.print(f"{device_id}: {said}{applied}", markup=False, highlight=False)


@devices_app.command("takeover")
def devices_takeover(
    device_id: str,
    reason: Annotated[str, typer.Option("--reason", help="why (shown with the device and in its history)")] = "",
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Take a GUI or browser device over: its agent nodes pause before their next action (not
    counting against their timeouts), it takes no new work, and its agent refuses the model's
    input; act through the dashboard's live view or at the device, then `orrery devices handback`."""
    with _api(server, api_key) as c:
        result = c.request("POST", f"/v1/devices/{device_id}/takeover", json={"reason": reason})
        applied = _applied(c, result)
    held = result.get("takeover") or {}
    console.print(f"{device_id}: taken over by {held.get('by', '?')}{applied}", markup=False, highlight=False)


@devices_app.command("handback")
def devices_handback(
    device_id: str,
    note: Annotated[str, typer.Option("--note", help="what you did and what the model should know")] = "",
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Hand a device back to its tasks, with a note the model reads (it observes the screen again
    before it acts)."""
    with _api(server, api_key) as c:
        result = c.request("POST", f"/v1/devices/{device_id}/handback", json={"note": note})
    held = result.get("takeover")
    said = "handed back" if not held else f"still taken over by {held.get('by')} ({held.get('source')})"
    console.print(f"{device_id}: {said}", markup=False, highlight=False)


@devices_app.command("label")
def devices_label(
    device_id: str,
    changes: Annotated[list[str], typer.Argument(help="KEY=VALUE sets a label, KEY- removes it")],
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Set or remove a device's labels (placement uses them at once)."""
    labels: dict[str, str | None] = {}
    for change in changes:
        if "=" in change and change.split("=", 1)[0]:
            key, value = change.split("=", 1)
            labels[key] = value
        elif change.endswith("-") and len(change) > 1 and "=" not in change:
            labels[change[:-1]] = None
        else:
            _fail(f"{change!r}: give KEY=VALUE to set a label or KEY- to remove one", 2)
    with _api(server, api_key) as c:
        result = c.request("PATCH", f"/v1/devices/{device_id}", json={"labels": labels})
    if json_out:
        _print_json(result)
    else:
        shown = ", ".join(f"{k}={v}" for k, v in sorted((result.get("labels") or {}).items())) or "(none)"
        console.print(f"{result['name']} {result['id']}: {shown}", markup=False, highlight=False)


@devices_app.command("rotate-token")
def devices_rotate_token(
    device_id: str, json_out: JsonOpt = False, server: ServerOpt = None, api_key: KeyOpt = None
) -> None:
    """Give a device a new token (shown once); the old one stops working and its connection closes."""
    with _api(server, api_key) as c:
        result = c.request("POST", f"/v1/devices/{device_id}/token")
    if json_out:
        _print_json(result)
    else:
        console.print(
            f"device id: {result['id']}\nname:      {result['name']}\ntoken:     {result['token']}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        console.print("[dim]the token is shown once; restart the agent with it (the old token no longer works)[/dim]")


@devices_app.command("history")
def devices_history(
    device_id: str,
    limit: Annotated[int, typer.Option(help="at most this many")] = 50,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """A device's state changes (liveness and admin), newest first."""
    from orchestrator.console import history_table, print_table

    with _api(server, api_key) as c:
        page = c.request("GET", f"/v1/devices/{device_id}/history", params={"limit": limit})
    if json_out:
        _print_json(page["items"])
    else:
        print_table(console, history_table(page["items"]))


# ---------------------------------------------------------------- tasks


def _dag_body(file: Path, name: str | None) -> dict[str, Any]:
    try:
        data = load_dag_file(file)
    except DagFileError as exc:
        _fail(str(exc) + _schedule_hint(file), 2)
    body: dict[str, Any] = {"dag": {"nodes": data["nodes"], "edges": data.get("edges", [])}}
    if name or data.get("name"):
        body["name"] = name or data.get("name")
    return body


def _schedule_hint(file: Path) -> str:
    """For a schedule file given where a DAG is wanted: the command that takes it."""
    from orchestrator.dagfile import parse_dag_text

    try:
        data = parse_dag_text(file.read_text(encoding="utf-8"), str(file), as_json=file.suffix.lower() == ".json")
    except (OSError, UnicodeDecodeError, DagFileError):
        return ""
    if isinstance(data, dict) and ("cron" in data or "task" in data):
        return f"; it looks like a schedule (it has cron/task): create it with 'orrery schedules create {file}'"
    return ""


def _print_warnings(answer: dict[str, Any]) -> None:
    """The submission's warnings (e.g. retry_not_safe), one line each on stderr."""
    for w in answer.get("warnings") or []:
        node = f" node {w['node_id']}" if w.get("node_id") else ""
        err.print(
            Text.assemble(("warning", "yellow"), f" {w.get('code', 'warning')}{node}: {w.get('message', '')}"),
            soft_wrap=True,
        )


@app.command()
def submit(
    file: Annotated[Path | None, typer.Argument(help="JSON or YAML file with {nodes, edges}")] = None,
    request: Annotated[str | None, typer.Option(help="plain-language request (needs an LLM)")] = None,
    name: Annotated[str | None, typer.Option(help="task name")] = None,
    priority: Annotated[int, typer.Option(help="higher runs first")] = 0,
    idempotency_key: Annotated[str | None, typer.Option(help="same key and body return the same task")] = None,
    watch: Annotated[bool, typer.Option("--watch", help="follow the task live")] = False,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Submit a task: a DAG file, or a plain request for the planner."""
    if file is None and request is None:
        _fail("give a DAG FILE (JSON or YAML) or --request TEXT: orrery submit dag.yaml [--watch]", 2)
    if file is not None and request is not None:
        _fail("give a DAG FILE or --request, not both", 2)
    body: dict[str, Any] = {"priority": priority}
    if file is not None:
        body.update(_dag_body(file, name))
    else:
        body["request"] = request
        if name:
            body["name"] = name
    with _api(server, api_key) as c:
        try:
            task = _json(c, calls.submit(body, idempotency_key))
        except OrreryError as exc:
            raise _in_file(file, exc) from None
        _print_warnings(task)
        if watch:
            task = _watch(c, task["id"])
    if json_out:
        _print_json(task)
    elif not watch:
        console.print(f"task {task['id']} is {task['state']}", markup=False, highlight=False)
    if watch and task["state"] != "succeeded":
        raise typer.Exit(1)


@tasks_app.command("list")
def tasks_list(
    state: Annotated[str | None, typer.Option(help="only tasks in this state")] = None,
    limit: Annotated[int, typer.Option(help="at most this many")] = 50,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """List tasks, newest first."""
    with _api(server, api_key) as c:
        page = _json(c, calls.tasks_page(state, limit))
    if json_out:
        _print_json(page["items"])
    else:
        from orchestrator.console import print_table, tasks_table

        print_table(console, tasks_table(page["items"]))


@tasks_app.command("show")
def tasks_show(
    task_id: str,
    llm: Annotated[bool, typer.Option("--llm", help="the model calls made for this task")] = False,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """A task with its nodes, attempts and outputs (or, with --llm, its LLM transcript)."""
    from orchestrator.console import device_names, llm_view, task_view

    with _api(server, api_key) as c:
        data: Any = c.request("GET", f"/v1/tasks/{task_id}/llm")["items"] if llm else _json(c, calls.task(task_id))
        names = {} if json_out or llm else device_names(c)
    if json_out:
        _print_json(data)
    elif llm:
        console.print(llm_view(data))
    else:
        console.print(task_view(data, show_outputs=True, names=names))


@tasks_app.command("watch")
def tasks_watch(task_id: str, server: ServerOpt = None, api_key: KeyOpt = None) -> None:
    """Follow a task until it ends (line by line when stdout is not a terminal); exit 1 unless it succeeded."""
    with _api(server, api_key) as c:
        task = _watch(c, task_id)
    if task["state"] != "succeeded":
        raise typer.Exit(1)


def _watch(c: Client, task_id: str) -> dict[str, Any]:
    from orchestrator.console import watch as watch_task

    return watch_task(c, task_id, console)


@tasks_app.command("rerun")
def tasks_rerun(
    task_id: str,
    from_node: Annotated[
        str | None, typer.Option("--from", help="re-run this node and its descendants; keep the rest's outputs")
    ] = None,
    watch: Annotated[bool, typer.Option("--watch", help="follow the new task")] = False,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Run a finished task again as a new task (whole, or from one node on)."""
    with _api(server, api_key) as c:
        task = _json(c, calls.rerun(task_id, from_node))
        if watch:
            task = _watch(c, task["id"])
    if json_out:
        _print_json(task)
    elif not watch:
        console.print(
            f"task {task['id']} is {task['state']} (re-run of {task.get('rerun_of') or task_id})",
            markup=False,
            highlight=False,
        )
    if watch and task["state"] != "succeeded":
        raise typer.Exit(1)


@tasks_app.command("cancel")
def tasks_cancel(task_id: str, server: ServerOpt = None, api_key: KeyOpt = None) -> None:
    """Cancel a task: queued nodes are cancelled, running batches are stopped on their devices."""
    with _api(server, api_key) as c:
        c.cancel(task_id)
    console.print(f"task {task_id} is being cancelled")


@app.command()
def validate(
    file: Annotated[Path, typer.Argument(help="JSON or YAML file with {nodes, edges}")],
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Check a DAG without running it: placement per node, argument errors, warnings, policy refusals.

    Exit 0 when the server would accept it, 1 otherwise."""
    body = _dag_body(file, None)
    with _api(server, api_key) as c:
        try:
            answer = _json(c, calls.validate(body))
        except OrreryError as exc:
            if exc.status != 422:
                raise
            answer = {
                "valid": False,
                "problems": _placed(file, exc.body.get("problems") or [{"code": exc.code, "message": exc.detail}]),
            }
            answer.update(warnings=[], nodes=[])
    if not isinstance(answer, dict) or "valid" not in answer:
        _fail("this server does not support validation (POST /v1/tasks?dry_run=true); upgrade it")
    if json_out:
        _print_json(answer)
    else:
        _print_validation(answer)
    if not answer["valid"]:
        raise typer.Exit(1)


def _placed(file: Path, problems: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Problems whose `loc` is in the DAG body, with the file:line:column it came from first."""
    for p in problems:
        loc = p.get("loc") if isinstance(p, dict) else None
        if isinstance(loc, list) and loc[:2] == ["body", "dag"] and (at := locate(file, loc[2:])):
            p.update(position=at, message=f"{at}: {p.get('message')}")
    return problems


def _in_file(file: Path | None, exc: OrreryError) -> OrreryError:
    """A refused DAG read from `file`: its problems at the file:line:column they came from, as
    `orrery validate` shows them."""
    problems = exc.body.get("problems") if exc.status == 422 and file is not None else None
    if file is None or not isinstance(problems, list) or not problems:
        return exc
    _placed(file, problems)
    at = problems[0].get("position") if isinstance(problems[0], dict) else None
    return type(exc)(exc.status, exc.code, f"{at}: {exc.detail}" if at else exc.detail, exc.body)


def _print_validation(answer: dict[str, Any]) -> None:
    def out(*parts: str | tuple[str, str]) -> None:
        console.print(Text.assemble(*parts), soft_wrap=True)

    for node in answer.get("nodes") or []:
        devices = node.get("devices") or []
        chosen = node.get("would_run_on")
        if chosen:
            placed: str | tuple[str, str] = f"would run on {chosen}"
        elif devices:
            placed = "no device free now"
        else:
            placed = ("no device can run it", "red")
        may = f" (may run on: {', '.join(devices)})" if devices else ""
        fans = node.get("fans_out_to")
        if fans is not None:  # a fan-out node, with the devices it would run on now
            shown = ", ".join(fans[:10]) + (f" and {len(fans) - 10} more" if len(fans) > 10 else "")
            placed = f"would fan out to {len(fans)} devices: {shown}" if fans else ("no device matches now", "red")
            may = "".join(f"; leaves out {x['device']} ({x['reason']})" for x in (node.get("left_out") or [])[:10])
        out(f"node {node.get('id')}: ", placed, may)
        for r in node.get("refusals") or []:
            out(
                ("  refused", "red"),
                f" command {r.get('command')} {r.get('tool')} on {r.get('device')}:",
                f" {r.get('code')}: {r.get('message')}",
            )
    for p in answer.get("problems") or []:
        where = "".join(
            f" {label} {p[key]}"
            for key, label in (
                ("node_id", "node"),
                ("command", "command"),
                ("verify", "verify command"),
                ("field", "field"),
            )
            if p.get(key) is not None
        )
        out(("error", "red"), f" {p.get('code')}{where}: {p.get('message')}")
    for w in answer.get("warnings") or []:
        node = f" node {w['node_id']}" if w.get("node_id") else ""
        out(("warning", "yellow"), f" {w.get('code')}{node}: {w.get('message')}")
    out(("valid", "green") if answer["valid"] else ("not valid", "red"))


@app.command()
def tools(
    device: Annotated[str | None, typer.Argument(help="a device id, id prefix or name (default: every device)")] = None,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """List tools with their description, arguments and whether a retry is safe.

    Arguments marked `?` are optional; a tool is retry-safe when it is read-only or idempotent.
    Without DEVICE: every tool of the fleet and which devices have it."""
    from orchestrator.console import tool_rows, tools_view

    with _api(server, api_key) as c:  # the server resolves an id, a unique id prefix or a name
        devices = _json(c, calls.devices())["items"] if device is None else [_json(c, calls.device(device))]
    rows = tool_rows(devices)
    if json_out:
        _print_json(
            [
                {k: r[k] for k in ("name", "description", "input_schema", "read_only", "idempotent", "retry_safe")}
                | ({} if device else {"devices": r["devices"]})
                for r in rows
            ]
        )
    elif not rows:
        console.print("no tools: " + ("this device has not reported any" if device else "no device has reported any"))
    else:
        console.print(tools_view(rows, per_device=device is not None))


# ---------------------------------------------------------------- api keys


@keys_app.command("create")
def keys_create(
    role: Annotated[str, typer.Option(help="admin, operator or viewer")],
    name: Annotated[str, typer.Option(help="what the key is for")] = "",
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Create an API key (shown once)."""
    with _api(server, api_key) as c:
        result = c.request("POST", "/v1/api-keys", json={"role": role, "name": name})
    if json_out:
        _print_json(result)
    else:
        console.print(f"id:   {result['id']}\nrole: {result['role']}\nkey:  {result['key']}")


@keys_app.command("list")
def keys_list(
    revoked: Annotated[bool, typer.Option("--revoked", help="include revoked keys")] = False,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """List API keys: id, role, name, created (never the key itself; it is shown once). Admin only."""
    with _api(server, api_key) as c:
        items = _api_keys(c, revoked)
    if json_out:
        _print_json(items)
        return
    if not items:
        console.print("no API keys")
        return
    for k in items:
        gone = f"  revoked {k['revoked_at'][:19]}" if k.get("revoked_at") else ""
        line = f"{k['id']}  {k['role']:8} {k['created_at'][:19]}  {k['name'] or '-'}{gone}"
        console.print(line, markup=False, highlight=False)


def _api_keys(c: Client, revoked: bool) -> list[dict[str, Any]]:
    """Every API key (never its secret), page after page."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, str | int] = {
            "limit": 500,
            "revoked": str(revoked).lower(),
            **({"cursor": cursor} if cursor else {}),
        }
        page = c.request("GET", "/v1/api-keys", params=params)
        items += page["items"]
        cursor = page.get("next_cursor")
        if not cursor:
            return items


@keys_app.command("revoke")
def keys_revoke(key_id: str, server: ServerOpt = None, api_key: KeyOpt = None) -> None:
    """Revoke an API key."""
    with _api(server, api_key) as c:
        c.request("DELETE", f"/v1/api-keys/{key_id}")
    console.print(f"revoked {key_id}")


# ---------------------------------------------------------------- demo


# ---------------------------------------------------------------- approvals


@approvals_app.command("list")
def approvals_list(
    state: Annotated[str, typer.Option(help="pending, approved, denied, expired, cancelled, or all")] = "pending",
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Approvals, oldest first: by default the ones waiting for a decision."""
    with _api(server, api_key) as c:
        page = _json(c, calls.approvals_page(None if state == "all" else state))
        names = {} if json_out else _device_names(c, {a["device_id"] for a in page["items"]})
    if json_out:
        _print_json(page)
        return
    if not page["items"]:
        console.print("no approvals" + ("" if state == "all" else f" {state}"))
        return
    for a in page["items"]:
        args = json.dumps(a["arguments"], ensure_ascii=False)
        device = f"{names[a['device_id']]} ({a['device_id']})" if names.get(a["device_id"]) else a["device_id"]
        where = f"task {a['task_id']} node {a['node_id']} device {device}"
        local = " (decided only at the device)" if a["local_only"] else ""
        line = f"{a['id']}  {a['state']:9} {a['tool']} {args[:160]}\n    {where}{local}: {a['reason']}"
        console.print(line, markup=False, highlight=False)


def _device_names(c: Client, device_ids: set[str]) -> dict[str, str]:
    """Each device's name, for a listing that holds ids (a device that cannot be read keeps its id)."""
    names: dict[str, str] = {}
    for device_id in sorted(device_ids):
        with contextlib.suppress(OrreryError):
            names[device_id] = c.device(device_id).name
    return names


def _decide_cli(
    approval_id: str, decision: calls.Decision, reason: str, json_out: bool, server: str | None, key: str | None
) -> None:
    with _api(server, key) as c:
        result = _json(c, calls.decide(approval_id, decision, reason))
    if json_out:
        _print_json(result)
    elif result["state"] == "pending" and result.get("requested_state"):
        console.print(
            f"{result['id']} {result['requested_state']} asked of device {result['device_id']}, which has not "
            "confirmed it yet (offline?): it takes effect when the device gets it, unless its owner decides there "
            f"first; see 'orrery approvals list --state all'",
            markup=False,
            highlight=False,
        )
    else:
        console.print(f"{result['id']} {result['state']} ({result['tool']})", markup=False, highlight=False)


ReasonOpt = Annotated[str, typer.Option(help="why (recorded with the decision)")]


ApprovalArg = Annotated[str, typer.Argument(help="an approval id or a unique id prefix (see 'orrery approvals list')")]


@approvals_app.command("approve")
def approvals_approve(
    approval_id: ApprovalArg,
    reason: ReasonOpt = "",
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Approve a waiting command: it runs and its node goes on."""
    _decide_cli(approval_id, "approve", reason, json_out, server, api_key)


@approvals_app.command("deny")
def approvals_deny(
    approval_id: ApprovalArg,
    reason: ReasonOpt = "",
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Deny a waiting command: it never runs, and its node fails with approval_denied."""
    _decide_cli(approval_id, "deny", reason, json_out, server, api_key)


# ---------------------------------------------------------------- schedules


@schedules_app.command("create")
def schedules_create(
    file: Annotated[
        Path | None, typer.Argument(help="a schedule (YAML/JSON: name, cron, task, ...) or a DAG file")
    ] = None,
    name: Annotated[str | None, typer.Option(help="the schedule's name (unique)")] = None,
    cron: Annotated[str | None, typer.Option(help="e.g. '0 2 * * *' (02:00 daily), '@hourly'")] = None,
    timezone: Annotated[str | None, typer.Option(help="IANA time zone of the cron fields (default UTC)")] = None,
    overlap: Annotated[str | None, typer.Option(help="while the previous task runs: skip (default) or queue")] = None,
    request: Annotated[str | None, typer.Option(help="a plain-language task instead of FILE (needs an LLM)")] = None,
    paused: Annotated[bool | None, typer.Option("--paused", help="create it paused")] = None,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Create a schedule: from a schedule file, or a DAG file (or --request) with --name and --cron."""
    from orchestrator.schedule_console import schedule_body

    if file is not None and request is not None:
        _fail("give a FILE or --request, not both", 2)
    try:
        body = schedule_body(file, request, name=name, cron=cron, timezone=timezone, overlap=overlap, paused=paused)
    except DagFileError as exc:
        _fail(str(exc), 2)
    with _api(server, api_key) as c:
        made = c.request("POST", "/v1/schedules", json=body)
    _print_warnings(made)
    if json_out:
        _print_json(made)
    else:
        first = (made.get("next_runs") or ["none (paused)"])[0]
        console.print(f"schedule {made['name']} {made['id']}: next run {first}", markup=False, highlight=False)


@schedules_app.command("list")
def schedules_list(json_out: JsonOpt = False, server: ServerOpt = None, api_key: KeyOpt = None) -> None:
    """List schedules with their next run and their last run's task."""
    from orchestrator.schedule_console import schedules_table

    with _api(server, api_key) as c:
        items = _schedules(c)
    if json_out:
        _print_json(items)
    elif not items:
        console.print("no schedules")
    else:
        from orchestrator.console import print_table

        print_table(console, schedules_table(items))


def _schedules(c: Client) -> list[dict[str, Any]]:
    """Every schedule, by name (page after page)."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, str | int] = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        page = c.request("GET", "/v1/schedules", params=params)
        items += page["items"]
        cursor = page.get("next_cursor")
        if not cursor:
            return items


def _schedule_ticks(c: Client, ref: str, limit: int, outcome: str | None = None) -> list[dict[str, Any]]:
    params: dict[str, str | int] = {"limit": limit, **({"outcome": outcome} if outcome else {})}
    items: list[dict[str, Any]] = c.request("GET", f"/v1/schedules/{ref}/ticks", params=params)["items"]
    return items


@schedules_app.command("show")
def schedules_show(
    schedule_id: str, json_out: JsonOpt = False, server: ServerOpt = None, api_key: KeyOpt = None
) -> None:
    """A schedule: its cron in words, next runs, last run, queued ticks and newest ticks."""
    from orchestrator.schedule_console import schedule_view

    with _api(server, api_key) as c:
        found = c.request("GET", f"/v1/schedules/{schedule_id}", params={"next": 5})
        ticks = _schedule_ticks(c, found["id"], limit=10)
    if json_out:
        _print_json({**found, "ticks": ticks})
    else:
        console.print(schedule_view(found, ticks))


@schedules_app.command("ticks")
def schedules_ticks(
    schedule_id: str,
    limit: Annotated[int, typer.Option(help="at most this many")] = 50,
    outcome: Annotated[str | None, typer.Option(help="created, queued, skipped, missed or failed")] = None,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """What happened at each tick, newest first (its task, or why none was made)."""
    from orchestrator.console import print_table
    from orchestrator.schedule_console import ticks_table

    with _api(server, api_key) as c:
        items = _schedule_ticks(c, schedule_id, limit, outcome)
    if json_out:
        _print_json(items)
    elif not items:
        console.print(f"no ticks yet{f' with outcome {outcome}' if outcome else ''}", markup=False, highlight=False)
    else:
        print_table(console, ticks_table(items))


def _schedule_action(action: str) -> Any:
    def command(schedule_id: str, server: ServerOpt = None, api_key: KeyOpt = None) -> None:
        with _api(server, api_key) as c:
            if action == "delete":
                result = c.request("DELETE", f"/v1/schedules/{schedule_id}")
            else:
                result = c.request("POST", f"/v1/schedules/{schedule_id}/{action}")
        if action == "delete":
            console.print(f"schedule {result['name']} {result['id']} deleted (its tasks stay)", markup=False)
        else:
            first = (result.get("next_runs") or ["none"])[0]
            state = "paused" if result["paused"] else f"active, next run {first}"
            console.print(f"schedule {result['name']} {result['id']}: {state}", markup=False, highlight=False)

    command.__doc__ = {
        "pause": "No more ticks until resumed (ticks waiting in its queue are skipped).",
        "resume": "Tick again from the next future tick (the paused time is not caught up).",
        "delete": "Delete a schedule and its tick history; the tasks it made stay.",
    }[action]
    return command


for _action in ("pause", "resume", "delete"):
    schedules_app.command(_action)(_schedule_action(_action))


# ---------------------------------------------------------------- artifacts


@artifacts_app.command("list")
def artifacts_list(
    task_id: str,
    history: Annotated[bool, typer.Option("--history", help="every version, not only each name's newest")] = False,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """A task's artifacts, newest first: name, version, size, sha256, node and device."""
    from orchestrator.console import artifacts_table, device_names, print_table

    with _api(server, api_key) as c:
        page = _json(c, calls.artifacts_page(task_id, history, limit=500))
        names = device_names(c) if page["items"] and not json_out else {}
    if json_out:
        _print_json(page["items"])
    elif not page["items"]:
        console.print(f"task {task_id} has no artifacts", markup=False, highlight=False)
    else:
        print_table(console, artifacts_table(page["items"], names))


@artifacts_app.command("get")
def artifacts_get(
    task_id: str,
    name: str,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="file to write (default: ./NAME)")] = None,
    version: Annotated[int | None, typer.Option(help="this version (default: the newest)")] = None,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Download an artifact, checked against its sha256 before it is saved (resumes a dropped download)."""
    dest = output or Path(name)
    if dest.is_dir():
        dest = dest / name
    with _api(server, api_key) as c:
        artifact = _json(c, calls.artifact(task_id, name, version))
        c.download(task_id, name, dest, version=int(artifact["version"]))  # that version, checked by sha256
    if json_out:
        _print_json({**artifact, "path": str(dest)})
    else:
        what = f"{artifact['name']} v{artifact['version']} ({artifact['size']:,} bytes, sha256 {artifact['sha256']})"
        line = f"saved {what} to {dest}"
        console.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command()
def demo(
    data_dir: Annotated[Path | None, typer.Option(help="keep the demo's files here (default: a temp dir)")] = None,
    keep: Annotated[
        bool, typer.Option("--keep", help="leave the server and agents running (dashboard, viewer key) until Ctrl-C")
    ] = False,
) -> None:
    """Start an orchestrator and 3 device agents, run a multi-device DAG, print the results."""
    from orchestrator.demo import run_demo

    raise typer.Exit(run_demo(console, data_dir, keep))


@app.command("mcp")
def mcp_stdio(server: ServerOpt = None, api_key: KeyOpt = None) -> None:
    """Serve Orrery's MCP tools on stdin/stdout, for an AI assistant (an MCP host) that starts it."""
    from orchestrator import __version__
    from orrery.mcp_server import run_stdio

    run_stdio(server, api_key, __version__)


def main(argv: list[str] | None = None) -> None:
    """`python -m orchestrator.cli`: no Python traceback reaches the user (one line, exit 1)."""
    guarded(lambda: app(args=argv), needs_server=True)


if __name__ == "__main__":
    main()
