"""Logging for the server and the agent: text for people, JSON lines for collectors (`--log-format`)."""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar
from typing import Any

CONTEXT_FIELDS = ("task_id", "node_id", "batch_id", "device_id", "request_id")
# Fields that apply to everything logged in the current context (e.g. a REST request's id).
context: ContextVar[dict[str, str] | None] = ContextVar("orrery_log_context", default=None)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(context.get() or {})
        for key in CONTEXT_FIELDS:
            field = getattr(record, key, None)
            if field is not None:
                entry[key] = field
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """Human lines, with the context ids appended as `key=value` when a record carries them."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = {**(context.get() or {}), **{k: getattr(record, k) for k in CONTEXT_FIELDS if getattr(record, k, None)}}
        return line + "".join(f" {k}={v}" for k, v in ids.items()) if ids else line


# Libraries kept at WARNING: chatty at INFO (a line per HTTP request). At DEBUG the agent lets the
# HTTP and MCP ones through (never websockets: its debug lines carry the handshake's headers).
NOISY = ("httpx", "httpx2", "httpcore", "httpcore2", "mcp", "websockets")


def setup_logging(fmt: str = "text", level: str = "info", quiet: tuple[str, ...] = NOISY) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING if noisy in quiet else logging.NOTSET)
