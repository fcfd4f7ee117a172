"""`orrery.Client`: the REST API from synchronous Python (SPEC section 3). `AsyncClient`
(orrery/sdk/aio.py) has the same methods, each `async`."""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx2
from pydantic import BaseModel

import orrery.sdk.calls as api
from orrery.sdk.calls import Call, DagLike, Decision, InputKind
from orrery.sdk.config import default_api_key, default_server, server_url
from orrery.sdk.download import PIECE, READ_TIMEOUT_S, TRIES, Download
from orrery.sdk.models import (
    Approval,
    Artifact,
    Cancelling,
    Device,
    Enrollment,
    Event,
    Frame,
    InputSent,
    LiveView,
    Page,
    Task,
    Tool,
    Validation,
    ViewEnd,
)
from orrery.sdk.stream import EventFeed, view_item
from orrery.sdk.transport import deadline, headers, past, stream_timeout, timed_out, unreachable

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class Client:
    """A client of one orchestrator. `server` defaults to `ORRERY_URL` (else
    `http://$ORRERY_HOST:$ORRERY_PORT`), `api_key` to `ORRERY_API_KEY` (else the admin key in
    `$ORRERY_DATA_DIR/admin.key`). `transport`: an httpx2 transport to use instead of the
    network (a WSGI app, a mock). Use it as a context manager, or `close()` it.

    Every method raises an `OrreryError` subclass on failure: the server's problem (with its
    stable `code`), or `Unavailable` (code `unreachable`) when the server cannot be reached."""

    def __init__(
        self,
        server: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx2.BaseTransport | None = None,
        verify: ssl.SSLContext | str | bool = True,
    ) -> None:
        self.server = server_url(server or default_server())
        self.api_key = api_key or default_api_key()
        self.timeout = timeout
        self._http = httpx2.Client(
            base_url=self.server, headers=headers(self.api_key), timeout=timeout, transport=transport, verify=verify
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ---------------------------------------------------------------- tasks

    def submit(
        self,
        dag: DagLike | None = None,
        *,
        request: str | None = None,
        name: str | None = None,
        priority: int | None = None,
        labels: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> Task:
        """Submit a task: a DAG (a `Dag`, or a `{nodes, edges, name?}` dict) or a plain-language
        `request` for the planner. The same `idempotency_key` and body return the task made
        before; the same key with another body is a `Conflict`."""
        body = api.submission(dag, request=request, name=name, priority=priority, labels=labels)
        return self._run(api.submit(body, idempotency_key))

    def validate(
        self,
        dag: DagLike | None = None,
        *,
        request: str | None = None,
        name: str | None = None,
        priority: int | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Validation:
        """A dry run of `submit`: whether it is valid, its problems and warnings, and where each
        node would run now. Creates nothing."""
        body = api.submission(dag, request=request, name=name, priority=priority, labels=labels)
        return self._run(api.validate(body))

    def task(self, task_id: str) -> Task:
        """A task (by id, unique id prefix or name) with its nodes and edges."""
        return self._run(api.task(task_id))

    def tasks(self, state: str | None = None, *, page_size: int = 100) -> Iterator[Task]:
        """Every task, newest first (only those in `state`, if given), page after page."""
        return self._pages(lambda cursor: api.tasks_page(state, page_size, cursor))

    def tasks_page(self, state: str | None = None, limit: int = 50, cursor: str | None = None) -> Page[Task]:
        """One page of tasks; pass its `next_cursor` as `cursor` for the next."""
        return self._run(api.tasks_page(state, limit, cursor))

    def cancel(self, task_id: str) -> Cancelling:
        """Cancel a task: its queued and pending nodes are cancelled, running batches stopped."""
        return self._run(api.cancel(task_id))

    def rerun(self, task_id: str, from_node: str | None = None) -> Task:
        """Run an ended task again as a new task: all of it, or `from_node` and what follows it."""
        return self._run(api.rerun(task_id, from_node))

    def events(self, task_id: str, after: int = 0) -> Iterator[Event]:
        """The task's events after event id `after`, as they happen, until its last one. A
        dropped connection is reopened after the last event received: none is lost or repeated."""
        return self._follow(EventFeed(task_id, after), None, None)

    def wait(self, task_id: str, timeout: float | None = None) -> Task:
        """Follow the task's events until it ends; the ended task. `WaitTimeout` after
        `timeout` seconds (the task goes on)."""
        until = deadline(timeout)
        task = self.task(task_id)
        if not task.ended:
            for _ in self._follow(EventFeed(task.id), until, timeout):
                pass
            task = self.task(task.id)
        return task

    # ---------------------------------------------------------------- devices

    def devices(self) -> list[Device]:
        """Every device, with state, labels, info, tools and current work."""
        return self._run(api.devices())

    def device(self, device_id: str) -> Device:
        """A device by id, unique id prefix or name."""
        return self._run(api.device(device_id))

    def device_tools(self, device_id: str) -> list[Tool]:
        """The tool catalogue a device reported."""
        return self.device(device_id).tools

    def takeover(self, device_id: str, reason: str = "") -> Device:
        """Take a device over (operator): its agent nodes pause before their next action, it takes
        no new work and its agent refuses the model's input tools until `handback`."""
        return self._run(api.takeover(device_id, reason))

    def handback(self, device_id: str, note: str = "") -> Device:
        """Hand a device back with a note the model reads (it observes afresh before acting)."""
        return self._run(api.handback(device_id, note))

    def enroll(self, name: str, labels: Mapping[str, str] | None = None) -> Enrollment:
        """Enroll a device (admin): its id and its token, shown this once."""
        return self._run(api.enroll(name, labels))

    def open_view(
        self,
        device_id: str,
        *,
        fps: float | None = None,
        max_side: int | None = None,
        quality: int | None = None,
        marks: bool = False,
    ) -> LiveView:
        """Open a live view of the device's screen (viewer role); read it with `view_frames`.
        `Conflict` `view_unsupported` if its agent cannot stream, `device_offline` if it is away."""
        return self._run(api.open_view(device_id, fps, max_side, quality, marks))

    def view_frames(self, view: LiveView) -> Iterator[Frame | ViewEnd]:
        """The view's frames as the device sends them (a slow reader skips some), until the view
        ends: its last item is then a `ViewEnd` saying why. Leaving the loop stops watching."""
        try:
            with self._http.stream("GET", view.frames_url, timeout=stream_timeout(self.timeout, None)) as resp:
                if resp.status_code >= 400:
                    raise api.problem(resp.status_code, resp.read(), self.api_key is not None)
                for sse in httpx2.EventSource(resp):
                    item = view_item(sse)
                    if item is not None:
                        yield item
                    if isinstance(item, ViewEnd):
                        return
        except (httpx2.HTTPError, httpx2.InvalidURL) as exc:
            raise unreachable(exc, self.server) from None

    def send_input(
        self,
        device_id: str,
        kind: InputKind,
        *,
        x: int | None = None,
        y: int | None = None,
        frame_width: int | None = None,
        frame_height: int | None = None,
        button: str | None = None,
        direction: str | None = None,
        keys: str | None = None,
        text: str | None = None,
    ) -> InputSent:
        """Send a pointer or key input to a device you have taken over (operator role); `x, y`
        are pixels of a frame of `frame_width` x `frame_height`. The device's refusal is a
        `Conflict` with its code (`not_taken_over`, `input_disallowed`, ...); a device that did
        not answer in time is a `ServerError` `device_no_answer` (the input may have been applied)."""
        fields = dict(
            x=x,
            y=y,
            frame_width=frame_width,
            frame_height=frame_height,
            button=button,
            direction=direction,
            keys=keys,
            text=text,
        )
        return self._run(api.send_input(device_id, kind, **fields))

    # ---------------------------------------------------------------- approvals

    def approvals(
        self,
        state: str | None = "pending",
        *,
        task_id: str | None = None,
        order: Literal["oldest", "newest"] = "oldest",
        page_size: int = 100,
    ) -> Iterator[Approval]:
        """Approvals (pending ones by default, oldest first: the order to decide them in)."""
        return self._pages(lambda cursor: api.approvals_page(state, task_id, order, page_size, cursor))

    def approval(self, approval_id: str) -> Approval:
        return self._run(api.approval(approval_id))

    def approval_screenshot(self, approval_id: str) -> bytes:
        """The PNG a GUI action's approval was planned on (`NotFound` for any other approval)."""
        return self._run(api.approval_screenshot(approval_id))

    def decide(self, approval_id: str, decision: Decision, reason: str = "") -> Approval:
        """`approve` or `deny` a pending approval; the approval as it now stands (its
        `requested_state` is set if its device has not confirmed yet)."""
        return self._run(api.decide(approval_id, decision, reason))

    # ---------------------------------------------------------------- artifacts

    def artifacts(self, task_id: str, *, history: bool = False, page_size: int = 100) -> Iterator[Artifact]:
        """A task's artifacts, newest first: each name's newest version, or every version."""
        return self._pages(lambda cursor: api.artifacts_page(task_id, history, page_size, cursor))

    def artifact(self, task_id: str, name: str, version: int | None = None) -> Artifact:
        """One artifact: its newest version, or `version`."""
        return self._run(api.artifact(task_id, name, version))

    def artifact_content(self, task_id: str, name: str, version: int | None = None) -> bytes:
        """An artifact's bytes."""
        return self._run(api.artifact_content(task_id, name, version))

    def download(self, task_id: str, name: str, dest: str | Path, version: int | None = None) -> Artifact:
        """Save an artifact (its newest version, or `version`) to the file `dest`, checked against
        its sha256 before it is put there; a dropped connection resumes where it stopped. The
        artifact; `ServerError` (code `integrity_error`) if the bytes do not match."""
        artifact = self.artifact(task_id, name, version)
        with Download(artifact, Path(dest)) as job:
            for _ in range(TRIES):
                try:
                    with self._http.stream(
                        "GET",
                        job.path,
                        headers=job.headers(),
                        timeout=httpx2.Timeout(self.timeout, read=READ_TIMEOUT_S),
                    ) as resp:
                        if resp.status_code >= 400:
                            raise api.problem(resp.status_code, resp.read(), self.api_key is not None)
                        job.opened(resp.status_code)
                        for piece in resp.iter_bytes(PIECE):
                            job.take(piece)
                except httpx2.TransportError as exc:
                    job.dropped(str(exc))
                except (httpx2.HTTPError, httpx2.InvalidURL) as exc:
                    raise unreachable(exc, self.server) from None
                if job.done:
                    return job.finish()
            raise job.stopped()

    # ---------------------------------------------------------------- any other route

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Any route of the API (`/v1/...`), for what has no method here: its JSON answer
        (None when empty), or the `OrreryError` its problem means."""
        return self._run(Call(method, path, _as_is, dict(params or {}), json, dict(headers or {})))

    # ---------------------------------------------------------------- the wire

    def _run(self, call: Call[T]) -> T:
        try:
            resp = self._http.request(
                call.method, call.path, params=call.params or None, json=call.json, headers=call.headers or None
            )
        except (httpx2.HTTPError, httpx2.InvalidURL) as exc:
            raise unreachable(exc, self.server) from None
        return call.answer(resp.status_code, resp.content, self.api_key is not None)

    def _pages(self, page: Callable[[str | None], Call[Page[M]]]) -> Iterator[M]:
        cursor: str | None = None
        while True:
            got = self._run(page(cursor))
            yield from got.items
            if not got.next_cursor:
                return
            cursor = got.next_cursor

    def _follow(self, feed: EventFeed, until: float | None, timeout: float | None) -> Iterator[Event]:
        """The events of `feed`'s task until its last one; reopens a dropped stream (see
        `EventFeed`); `WaitTimeout` once `until` (a `time.monotonic()`) has passed."""
        while True:
            try:
                with self._http.stream(
                    "GET", feed.path, params=feed.params, timeout=stream_timeout(self.timeout, until)
                ) as resp:
                    if resp.status_code == 204:  # the task has ended and nothing follows `after`
                        return
                    if resp.status_code >= 400:
                        error = api.problem(resp.status_code, resp.read(), self.api_key is not None)
                        if resp.status_code != 503 or not feed.opened:
                            raise error
                        why = error.detail
                    else:
                        feed.opened = True
                        for sse in httpx2.EventSource(resp):
                            event = feed.take(sse)
                            if event is not None:
                                yield event
                            if feed.ended:
                                return
                            if past(until):
                                raise timed_out(feed.task_id, timeout)
                        why = "the stream ended before the task's last event"
            except (httpx2.HTTPError, httpx2.InvalidURL) as exc:
                if past(until):
                    raise timed_out(feed.task_id, timeout) from None
                if not feed.opened:
                    raise unreachable(exc, self.server) from None
                why = str(exc) or type(exc).__name__
            delay = feed.dropped(why)
            if until is not None and time.monotonic() + delay >= until:
                raise timed_out(feed.task_id, timeout)
            time.sleep(delay)


def _as_is(data: Any) -> Any:
    return data
