"""Every stable error code Orrery answers with, in one place: the REST problems' `code`, the
problems and warnings of a submission, the error codes of results, attempts, nodes and tasks, the
device protocol's `error` frames, the agent's own refusals and the WebSocket close codes.

Pure data, imported by nothing at run time: the reference page (docs/reference/error-codes.md)
is generated from it, and tests/docs/test_error_codes.py checks that every code the code passes
to an error is listed here, so a new code without documentation fails the suite.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    code: str
    kind: str  # a key of KINDS
    meaning: str
    status: int | None = None  # the HTTP status a REST problem with this code has


KINDS = {
    "rest": "REST API problems",
    "submission": "Submission problems and warnings",
    "result": "Result, attempt, node and task errors",
    "protocol": "Device protocol error frames",
    "agent": "Agent refusals",
    "view": "Live view and forwarded input",
    "cli": "CLI",
}

KIND_NOTES = {
    "view": (
        "Why a device ended or refused a live view stream (`view_ended`), and why it did not take a "
        "person's forwarded input (`view_input_result`); `invalid_arguments` and `device_stopped` "
        "(above) answer forwarded input too."
    ),
    "rest": (
        "Every error of the REST API is `application/problem+json` (RFC 9457): "
        '`{"type", "title", "status", "detail", "code"}`, with the stable `code` below; `detail` is '
        "written for the reader who acts next. A 422 `validation_error` lists each problem in `problems` "
        "(with `loc`); a refused submission names its first problem's code (next section) as `code`."
    ),
    "submission": (
        "A DAG or schedule the server refuses answers 422 with these codes, one entry per problem in "
        "`problems` (`node_id`, `field`, `command` where they apply); the first names the answer's "
        "`code`. Warnings (marked so) do not refuse the task: they come back in the task's `warnings`."
    ),
    "result": (
        "The `error.code` of a command's result, a node attempt, a node or a task (`orrery tasks show`, "
        "`GET /v1/tasks/{id}`). Codes a device reports that are not in this list are recorded as "
        "`device_error`. Whether a failed attempt is retried depends on the code and on the tools "
        "(only retry-safe failures are)."
    ),
    "protocol": (
        "`error` frames on the device WebSocket (`/v1/agent`): `{code, message}`; a fatal one is "
        "followed by a close with the close code in the last section."
    ),
    "agent": (
        "Refusals the agent reports inside a command's error message or its audit log: the safety "
        "budget that was breached, and why the browser profile's network proxy refused a URL "
        "(the browser tool's call then fails with `tool_error`)."
    ),
    "cli": (
        "Errors the `orrery` client commands and the Python SDK (`orrery.Client`) report themselves (the "
        "server's own codes pass through)."
    ),
    "close": "WebSocket close codes of the device connection (SPEC section 4).",
}

_REST = [
    (
        "bad_request",
        400,
        "a malformed request: a list `cursor` this server did not issue, a bad event id, "
        "an artifact request that makes no sense",
    ),
    ("unauthorized", 401, "no API key (or device token), or an unknown or revoked one (`WWW-Authenticate: Bearer`)"),
    (
        "forbidden",
        403,
        "the key's role may not do this, or a device token was sent where an API key is needed "
        "(or the other way round)",
    ),
    ("not_found", 404, "nothing with that id, unique id prefix or name"),
    ("method_not_allowed", 405, "the path exists but not with this method"),
    (
        "request_timeout",
        408,
        "the request head or body did not arrive in time (`ORRERY_HEADER_TIMEOUT_S`, "
        "`ORRERY_BODY_TIMEOUT_S`); the connection is closed",
    ),
    (
        "conflict",
        409,
        "the resource's state does not allow it (a task that already ended, a decided approval, "
        "a revoked device, an Idempotency-Key reused with another body)",
    ),
    ("ambiguous_id", 409, "an id prefix or name matches more than one thing; `candidates` lists them"),
    ("link_expired", 410, "an artifact download link is past its expiry"),
    ("payload_too_large", 413, "the request body is over `ORRERY_MAX_REQUEST_BYTES`, chunked or not"),
    ("unsupported_media_type", 415, "the body's content type is not one the route takes"),
    ("range_not_satisfiable", 416, "a `Range` outside the artifact"),
    ("validation_error", 422, "the body, a parameter or a header is not valid; `problems` lists each (with `loc`)"),
    (
        "rate_limited",
        429,
        "too many failed authentications from this address (or handshakes of this device); wait a minute",
    ),
    ("headers_too_large", 431, "the request head is over `ORRERY_MAX_HEADER_BYTES`; the connection is closed"),
    ("internal_error", 500, "the server failed to handle the request (a bug: see its log); never for bad input"),
    ("unavailable", 503, "the server cannot take the request now; retry shortly"),
    (
        "cluster_unavailable",
        503,
        "no engine replica answered within `ORRERY_CLUSTER_REQUEST_TIMEOUT_S` (`Retry-After`)",
    ),
    ("store_unavailable", 503, "the database cannot be reached now, e.g. during its restart (`Retry-After`)"),
    (
        "approval_local_only",
        403,
        "the device decides its approvals only on itself (`approvals_local_only`): `orrery agent approve ID` there",
    ),
    (
        "takeover_unsupported",
        409,
        "the device cannot be taken over: its agent announced no live view (no screen, an older version, "
        "or it never connected)",
    ),
    ("batch_not_yours", 403, "an artifact upload for a batch that was not sent to this device"),
    ("batch_closed", 409, "an artifact upload for a batch that has already ended"),
    (
        "offset_mismatch",
        409,
        "an artifact chunk at another offset than the upload has reached; resume from the offset given",
    ),
    ("upload_incomplete", 409, "an artifact upload was finished before all its bytes arrived"),
    ("upload_failed", 409, "the artifact upload cannot be completed; start it again"),
    (
        "view_scope",
        403,
        "a live view id used under another device, or with another API key than the one that opened it",
    ),
    ("view_expired", 410, "a live view id past its `expires_at`; open a new view"),
    ("device_offline", 409, "the device is not connected: its screen cannot be watched nor driven now"),
    (
        "view_unsupported",
        409,
        "the device's agent did not announce live views (`view`) in its hello: an older agent, or one without a screen",
    ),
    (
        "device_no_answer",
        504,
        "the device did not answer a forwarded input in time: it may or may not have been applied; look before "
        "sending it again",
    ),
    ("input_refused", 409, "the device refused a forwarded input without a code of its own"),
    (
        "watch_disallowed",
        None,
        "a live view's `ended` event: the device's owner does not allow watching its screen",
    ),
    ("no_screen", None, "a live view's `ended` event: the device has no screen to show"),
    (
        "lease_expired",
        None,
        "a live view's `ended` event: the device stopped streaming because no renewal of its lease reached it",
    ),
    (
        "key_revoked",
        None,
        "sent as the last event of a task's event stream (SSE) when the stream's API key is revoked; the stream ends",
    ),
]

_SUBMISSION = [
    ("dag_cycle", "the edges form a cycle; the problem names it"),
    ("duplicate_node", "two nodes share an id"),
    ("duplicate_edge", "the same edge is given twice"),
    ("unknown_node", "an edge, a reference or `--from` names a node the task does not have"),
    ("unknown_edge", "a re-plan edit removes an edge that does not exist"),
    ("edit_refused", "a re-plan edit changes a node that has already run (only pending nodes may change)"),
    ("invalid_reference", "a `${nodes...}` reference is malformed or names a node that is not an ancestor"),
    ("unknown_tool", "no enrolled device offers this tool; the problem names the nearest existing tools"),
    (
        "invalid_arguments",
        "a command's arguments do not fit its tool's input schema on the devices the node "
        "may run on; the problem names node, command index and field",
    ),
    ("no_capable_device", "no enrolled device matches the placement and has every tool the node uses"),
    ("unknown_device", "`for_each.devices` names a device that is not enrolled; the problem names the nearest"),
    (
        "limit_exceeded",
        "too many nodes or an argument too large (`ORRERY_MAX_NODES_PER_TASK`, `ORRERY_MAX_ARGUMENT_BYTES`)",
    ),
    ("verify_not_read_only", "a `verify` command uses a tool that may change the device"),
    ("verify_needs_approval", "a `verify` command uses a tool that waits for a person's approval"),
    ("planner_unavailable", "a `request` (or an `agent` node) needs an LLM and this server has none configured"),
    ("invalid_cron", "a schedule's `cron` expression is not valid"),
    ("cron_too_rare", "a schedule's `cron` fires less often than once every 8 years"),
    ("unknown_timezone", "a schedule's `timezone` is not an IANA zone"),
    ("invalid_json", "the planner's reply was not one JSON object with `nodes` and `edges`"),
    (
        "retry_not_safe",
        "warning: a node retries, but a failure after its commands started will not be retried "
        "(no tool is read-only or idempotent)",
    ),
    (
        "no_device_available",
        "warning: every device the node may run on takes no work now (offline, cordoned, "
        "draining, stopped); it waits up to its queue timeout",
    ),
]

_RESULT = [
    ("tool_error", "the tool ran and failed (a non-zero exit, an MCP error); the message says why"),
    ("unknown_tool", "the device has no such tool (any more)"),
    (
        "invalid_arguments",
        "the arguments do not fit the tool's input schema (or hold a NUL byte where it "
        "would reach the OS); nothing ran",
    ),
    ("timeout", "the command ran past its `timeout_s` and was stopped"),
    ("cancelled", "the task was cancelled, or the batch was cancelled on its device"),
    ("skipped", "the command did not run: an earlier command of its batch failed, or the batch was cancelled first"),
    ("device_lost", "the device went offline while the batch was in flight"),
    (
        "policy_denied",
        "the device owner's policy refused the tool (shell allow/deny lists, the kill switch, a stopped device)",
    ),
    ("queue_timeout", "no device took the node within its queue timeout"),
    ("no_capable_device", "no device matches the node's placement and tools (any more)"),
    ("template_error", "a `${nodes...}` reference could not be resolved at run time"),
    (
        "uncertain",
        "the device cannot tell whether the command ran (it restarted mid-command); `verify` "
        "commands decide, else the node fails",
    ),
    ("internal_error", "the orchestrator or the agent failed (a bug: see the logs)"),
    ("device_error", "the device reported an error code Orrery does not know (quoted in the message)"),
    ("input_refused", "the store refused what the device reported (e.g. text it cannot hold); the work ends here"),
    ("approval_denied", "a person denied the command's approval"),
    ("approval_timeout", "nobody decided the approval within `ORRERY_APPROVAL_TIMEOUT_S`"),
    ("budget_exceeded", "the device's safety budget was breached; the device is cordoned"),
    ("audit_unavailable", "the agent could not write the audit line, so the action did not run"),
    ("device_stopped", "an operator stopped the device (emergency stop); only `orrery devices resume` lifts it"),
    (
        "taken_over",
        "a person has the device taken over (an operator, or its owner at the device): the model's input is "
        "refused, and a step asked for meanwhile did not run; the handback's note says what they did: observe "
        "the screen again before acting",
    ),
    ("stale_observation", "GUI: the screen changed since the observation the call refers to; observe again"),
    ("id_conflict", "GUI: an `action_id` reused for a different call"),
    ("busy", "GUI: another input is in progress on this display"),
    ("stopped", "GUI: input is latched off by `gui.stop` until an operator's resume"),
    ("action_limit", "GUI: too many action receipts held; retry after `retry_after_s`"),
    ("element_mismatch", "GUI: the element does not carry the name the caller gave; nothing was done"),
    ("element_not_actionable", "GUI: the element is disabled or not visible now; nothing was done"),
    ("artifact_too_large", "artifacts: over the device's or the orchestrator's size limit; nothing was sent"),
    ("quota_exceeded", "artifacts: over the task's or the device's quota (`ORRERY_ARTIFACT_*_QUOTA_*`; as REST: 413)"),
    ("artifact_not_found", "artifacts: the task has no artifact by that name or sha256"),
    (
        "integrity_error",
        "artifacts: the bytes did not have their sha256; nothing was recorded or written (as REST: 422)",
    ),
    ("transfer_failed", "artifacts: the orchestrator refused the transfer (the batch ended, the token)"),
    ("verification_failed", "the node's `verify` commands failed: its commands did not take effect (never retried)"),
    ("no_matching_device", "fan-out: no device matched `for_each` when the node became ready (never retried)"),
    ("fan_out_failed", "fan-out: a child failed (no `failure_budget`), once all children ended"),
    ("canary_failed", "fan-out: a canary child failed; the rollout halted"),
    ("failure_budget_exhausted", "fan-out: the K-th child failed (`failure_budget: K`); the rollout halted"),
    ("fan_out_halted", "fan-out: a child skipped because its rollout halted before it started"),
    ("planning_failed", "the planner could not turn the request into a valid DAG"),
    ("llm_error", "the model call failed after its retries"),
    ("llm_budget_exceeded", "the task used its `ORRERY_LLM_CALLS_PER_TASK` model calls"),
    ("replan_invalid", "the re-planner's reply was not a valid edit list"),
    ("prompt_error", "a prompt template (`ORRERY_PROMPTS_DIR`) failed to render"),
]

_PROTOCOL = [
    ("malformed_frame", "a frame that is not valid JSON or not a known frame (close 4400)"),
    ("out_of_order", "a frame out of the handshake's order, e.g. before `hello` (close 4400)"),
    ("unauthorized", "the device token is missing, wrong or revoked (close 4401)"),
    ("forbidden", "the frame is not allowed for this device, e.g. another device's id (close 4403)"),
    ("hello_timeout", "no `hello` within `ORRERY_HELLO_TIMEOUT_S` (close 4408)"),
    ("superseded", "a newer connection of the same device took over (close 4409)"),
    ("frame_too_large", "a frame over `ORRERY_MAX_FRAME_BYTES` (close 4413)"),
    ("no_common_version", "the agent and the server share no protocol version (close 4426)"),
    ("stale_fence", "a report carrying a fence older than the device's newest assignment; refused"),
    ("unknown_batch", "a report on a batch that was not sent to this device; refused"),
    ("rate_limited", "too many handshakes from this device per minute (`ORRERY_HANDSHAKES_PER_MINUTE`)"),
]

_AGENT = [
    (
        "destructive_per_minute",
        "budget breached: more destructive actions in a minute than `max_destructive_per_minute`",
    ),
    (
        "consecutive_bad_outcomes",
        "budget breached: more uncertain, policy_denied or approval_denied outcomes "
        "in a row than `max_consecutive_bad_outcomes`",
    ),
    ("url_invalid", "browser: the URL cannot be parsed"),
    ("url_scheme", "browser: not an http or https URL (no file:, data:, javascript: ...)"),
    ("host_unresolved", "browser: the host does not resolve"),
    ("private_address", "browser: a loopback, link-local or private address not in `allowed_private_origins`"),
]

_VIEW = [
    ("no_screen", "the device has no screen to watch or send input to (no gui display, no browser)"),
    ("watch_disallowed", "the device's owner forbids watching its screen (`[agent.view] allow_watching = false`)"),
    ("ended", "the stream ended because the server asked (`view` with `on: false`)"),
    ("lease_expired", "no copy of the `view` came within its `lease_s`: the device stopped streaming"),
    ("error", "the device could not go on streaming; the message says why"),
    ("not_taken_over", "forwarded input is taken only while a person has the device taken over"),
    ("input_disallowed", "the device's owner forbids input through the live view (`[agent.view] allow_input = false`)"),
    ("input_failed", "the input could not be delivered to the screen (it may have been partly delivered)"),
]

_CLI = [
    ("unreachable", "the server could not be reached (connection refused, DNS, TLS, timeout); the message says which"),
    ("bad_response", "the server answered with something that is not JSON (not an Orrery server?)"),
    ("wait_timeout", "the Python SDK's `wait` gave up after its timeout; the task goes on"),
]

CODES: tuple[Code, ...] = (
    *(Code(c, "rest", m, s) for c, s, m in _REST),
    *(Code(c, "submission", m, 422) for c, m in _SUBMISSION),
    *(Code(c, "result", m) for c, m in _RESULT),
    *(Code(c, "protocol", m) for c, m in _PROTOCOL),
    *(Code(c, "agent", m) for c, m in _AGENT),
    *(Code(c, "view", m) for c, m in _VIEW),
    *(Code(c, "cli", m) for c, m in _CLI),
)

# WebSocket close code -> (name, meaning); protocol.errors.CloseCode names the same numbers.
CLOSE_CODES = {
    1000: ("NORMAL", "the connection ended normally"),
    1001: ("GOING_AWAY", "the server or agent is shutting down; reconnect"),
    1013: ("TRY_AGAIN_LATER", "the server cannot take frames now; reconnect with backoff"),
    4400: ("MALFORMED", "a malformed or out-of-order frame"),
    4401: ("UNAUTHORIZED", "the token is unauthorized or was revoked"),
    4403: ("FORBIDDEN", "forbidden, e.g. `device_id` is not the token's device"),
    4408: ("HELLO_TIMEOUT", "no `hello` in time"),
    4409: ("SUPERSEDED", "superseded by a newer connection of the same device"),
    4413: ("TOO_LARGE", "a frame too large"),
    4426: ("NO_COMMON_VERSION", "no common protocol version"),
}


def known() -> frozenset[str]:
    """Every code in the registry, of any kind."""
    return frozenset(c.code for c in CODES)
