"""`orrery`: the server, the agent, the demo and the client CLI over the REST API (SPEC section 3)."""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console

from device_agent.cli import agent as agent_command
from device_agent.cli import parse_labels
from device_agent.logs import setup_logging
from orchestrator.client import Client, ClientError
from orchestrator.config import Settings

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Orrery: one task across many devices.")
devices_app = typer.Typer(no_args_is_help=True, help="Enroll and manage devices.")
tasks_app = typer.Typer(no_args_is_help=True, help="List, inspect, watch and cancel tasks.")
keys_app = typer.Typer(no_args_is_help=True, help="Create and revoke API keys.")
app.add_typer(devices_app, name="devices")
app.add_typer(tasks_app, name="tasks")
app.add_typer(keys_app, name="api-keys")
app.command("agent")(agent_command)

console = Console()
err = Console(stderr=True)

ServerOpt = Annotated[str | None, typer.Option("--server", help="orchestrator URL (ORRERY_URL)")]
KeyOpt = Annotated[str | None, typer.Option("--api-key", help="API key (ORRERY_API_KEY, else <data-dir>/admin.key)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]


@contextlib.contextmanager
def _api(server: str | None, api_key: str | None) -> Iterator[Client]:
    """A client for one command; an API problem becomes a readable message and exit code 1."""
    try:
        with Client(server, api_key) as client:
            yield client
    except ClientError as exc:
        err.print(f"[red]error[/red] {exc.code}: {exc.detail}")
        for p in exc.body.get("problems", [])[1:]:
            err.print(f"  - {p.get('code')}: {p.get('message')}")
        raise typer.Exit(1) from None


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")


# ---------------------------------------------------------------- serve


def _settings_options() -> list[inspect.Parameter]:
    """One `--flag` per Settings field (SPEC section 8: every setting has a flag on serve)."""
    params = []
    for name, field in Settings.model_fields.items():
        annotation = field.annotation
        base = str if annotation is None else annotation
        option = typer.Option(None, f"--{name.replace('_', '-')}", help=field.description or f"ORRERY_{name.upper()}")
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
    uvicorn.run(
        create_app(settings, migrate=not no_migrate),
        host=settings.host,
        port=settings.port,
        ws="websockets-sansio",
        ws_max_size=settings.max_frame_bytes * 2,
        ws_per_message_deflate=False,
        log_config=None,
        access_log=False,
        ssl_certfile=str(settings.tls_cert) if settings.tls_cert else None,
        ssl_keyfile=str(settings.tls_key) if settings.tls_key else None,
        timeout_graceful_shutdown=5,
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


@devices_app.command("enroll")
def devices_enroll(
    name: str,
    label: Annotated[list[str] | None, typer.Option(help="KEY=VALUE, repeatable")] = None,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """Enroll a device; prints its id and token (shown once)."""
    with _api(server, api_key) as c:
        result = c.enroll(name, parse_labels(label))
    if json_out:
        _print_json(result)
    else:
        console.print(f"device id: {result['id']}\ntoken:     {result['token']}")
        console.print(
            f"[dim]the token is shown once; start the agent with[/dim] orrery agent --server {c.server} --token <token>"
        )


@devices_app.command("list")
def devices_list(json_out: JsonOpt = False, server: ServerOpt = None, api_key: KeyOpt = None) -> None:
    """List devices with their state, labels, current batch and queue."""
    with _api(server, api_key) as c:
        items = c.devices()
    if json_out:
        _print_json(items)
    else:
        from orchestrator.console import devices_table

        console.print(devices_table(items))


@devices_app.command("show")
def devices_show(device_id: str, server: ServerOpt = None, api_key: KeyOpt = None) -> None:
    """One device as JSON."""
    with _api(server, api_key) as c:
        _print_json(c.device(device_id))


def _device_action(action: str) -> Any:
    def command(device_id: str, server: ServerOpt = None, api_key: KeyOpt = None) -> None:
        with _api(server, api_key) as c:
            result = c.device_action(device_id, action)
        console.print(f"{device_id}: {result.get('state')}")

    command.__doc__ = {
        "drain": "Finish current work, take no new work.",
        "cordon": "Take no new work.",
        "uncordon": "Back to service.",
        "revoke": "Revoke the device's token and close its connection.",
    }[action]
    return command


for _action in ("drain", "cordon", "uncordon", "revoke"):
    devices_app.command(_action)(_device_action(_action))


# ---------------------------------------------------------------- tasks


def load_dag_file(path: Path) -> dict[str, Any]:
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(data, dict) or "nodes" not in data:
        raise typer.BadParameter(f"{path} must hold an object with 'nodes' (and optionally 'edges', 'name')")
    return data


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
    if (file is None) == (request is None):
        raise typer.BadParameter("give a DAG FILE or --request, not both")
    body: dict[str, Any] = {"priority": priority}
    if file is not None:
        data = load_dag_file(file)
        body["dag"] = {"nodes": data["nodes"], "edges": data.get("edges", [])}
        body["name"] = name or data.get("name")
    else:
        body["request"] = request
        body["name"] = name
    body = {k: v for k, v in body.items() if v is not None}
    with _api(server, api_key) as c:
        task = c.submit(body, idempotency_key)
        if watch:
            from orchestrator.console import watch as watch_task

            task = watch_task(c, task["id"], console)
    if json_out:
        _print_json(task)
    elif not watch:
        console.print(f"task {task['id']} is {task['state']}")
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
        page = c.tasks(state, limit)
    if json_out:
        _print_json(page["items"])
    else:
        from orchestrator.console import tasks_table

        console.print(tasks_table(page["items"]))


@tasks_app.command("show")
def tasks_show(
    task_id: str,
    llm: Annotated[bool, typer.Option("--llm", help="the model calls made for this task")] = False,
    json_out: JsonOpt = False,
    server: ServerOpt = None,
    api_key: KeyOpt = None,
) -> None:
    """A task with its nodes, attempts and outputs (or, with --llm, its LLM transcript)."""
    with _api(server, api_key) as c:
        data: Any = c.request("GET", f"/v1/tasks/{task_id}/llm")["items"] if llm else c.task(task_id)
    if json_out:
        _print_json(data)
    elif llm:
        from orchestrator.console import llm_view

        console.print(llm_view(data))
    else:
        from orchestrator.console import task_view

        console.print(task_view(data, show_outputs=True))


@tasks_app.command("watch")
def tasks_watch(task_id: str, server: ServerOpt = None, api_key: KeyOpt = None) -> None:
    """Follow a task live until it ends."""
    from orchestrator.console import watch as watch_task

    with _api(server, api_key) as c:
        task = watch_task(c, task_id, console)
    if task["state"] != "succeeded":
        raise typer.Exit(1)


@tasks_app.command("cancel")
def tasks_cancel(task_id: str, server: ServerOpt = None, api_key: KeyOpt = None) -> None:
    """Cancel a task: queued nodes are cancelled, running batches are stopped on their devices."""
    with _api(server, api_key) as c:
        c.cancel(task_id)
    console.print(f"task {task_id} is being cancelled")


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
        result = c.create_api_key(role, name)
    if json_out:
        _print_json(result)
    else:
        console.print(f"id:   {result['id']}\nrole: {result['role']}\nkey:  {result['key']}")


@keys_app.command("revoke")
def keys_revoke(key_id: str, server: ServerOpt = None, api_key: KeyOpt = None) -> None:
    """Revoke an API key."""
    with _api(server, api_key) as c:
        c.revoke_api_key(key_id)
    console.print(f"revoked {key_id}")


# ---------------------------------------------------------------- demo


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


def main(argv: list[str] | None = None) -> None:
    app(args=argv)


if __name__ == "__main__":
    main()
