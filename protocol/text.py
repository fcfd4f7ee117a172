"""What text a device may put in a frame: the server's check of every string of every frame it
receives, before anything of the frame is used or stored.

The store cannot hold some characters: Postgres refuses U+0000 in any text column (and its
driver cannot even compare such text), and no backend can encode a lone surrogate (a JSON
`\\ud800` escape with no partner) as UTF-8. A frame that carried either reached the engine, whose
write failed, and stopped the orchestrator. So each string of an incoming frame is one of three
kinds, named on the model's field (`IDENT`, `PAYLOAD`; anything else is free text):

- identifiers (ids, tool names): no control characters at all;
- free text (reasons, descriptions, labels, device info, tool schemas, approval arguments): no
  NUL, no lone surrogate, no control character but tab, newline and carriage return; strings
  nested in free-form values are bounded in length, depth and key length;
- a tool's output (`Result.result`, `ErrorInfo.message`): whatever the tool printed, NUL and
  control characters included (stored as JSON, where they are escapes: a tool that prints a NUL
  keeps working). Only a lone surrogate, which nothing can store, becomes U+FFFD.

A frame that breaks a rule is refused as `malformed_frame`, naming the field (SPEC section 4).
"""

from __future__ import annotations

import re
import typing
from typing import Any

from pydantic import BaseModel

from protocol.errors import MalformedFrame


class _Kind:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<text kind {self.name}>"


IDENT = _Kind("identifier")  # Annotated metadata: an id or a name, no control character at all
PAYLOAD = _Kind("payload")  # Annotated metadata: a tool's own output, stored as JSON
TEXT = _Kind("text")  # the default

MAX_NESTED_STRING = 16_384  # characters of one string inside a free-form value (labels, schemas, ...)
MAX_KEY = 256  # characters of one key of a free-form object
MAX_DEPTH = 32  # nesting of a free-form value (a tool's output is bounded by the frame alone)

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_BAD_IN_TEXT = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_BAD_IN_IDENT = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def inbound(message: BaseModel) -> BaseModel:
    """`message` if every string in it is acceptable; a copy with lone surrogates of tool output
    replaced by U+FFFD if that was all; else `MalformedFrame` naming the first bad field."""
    replaced = _Checker().model(message, str(getattr(message, "type", type(message).__name__)))
    if not replaced:
        return message
    return type(message).model_validate(_scrubbed(message.model_dump(mode="python", round_trip=True)))


def describe(char: str) -> str:
    """How a refused character is named in an error message (never the character itself)."""
    if char == "\x00":
        return "a NUL (U+0000)"
    if "\ud800" <= char <= "\udfff":
        return f"a lone surrogate (U+{ord(char):04X})"
    return f"a control character (U+{ord(char):04X})"


class _Checker:
    def __init__(self) -> None:
        self.replaced = False

    def model(self, model: BaseModel, where: str) -> bool:
        fields = type(model).model_fields
        for name, info in fields.items():
            kind = _kind_of(info.metadata, info.annotation)
            self.value(getattr(model, name), f"{where}.{name}", kind, 0, top=True)
        for key, value in (model.model_extra or {}).items():
            self.string(key, f"{where} key", TEXT, MAX_KEY)
            self.value(value, f"{where}.{key[:40]}", TEXT, 1)
        return self.replaced

    def value(self, value: Any, where: str, kind: _Kind, depth: int, top: bool = False) -> None:
        if isinstance(value, str):
            # A field's own max_length bounds it already; nested strings get the default bound.
            self.string(value, where, kind, None if top or kind is PAYLOAD else MAX_NESTED_STRING)
        elif isinstance(value, BaseModel):
            self.model(value, where)
        elif isinstance(value, dict | list | tuple):
            if depth >= MAX_DEPTH and kind is not PAYLOAD:
                raise MalformedFrame(f"{where}: nested deeper than {MAX_DEPTH} levels")
            if isinstance(value, dict):
                for key, item in value.items():
                    if isinstance(key, str):
                        self.string(key, f"{where} key", TEXT if kind is not PAYLOAD else PAYLOAD, MAX_KEY)
                    self.value(item, f"{where}.{str(key)[:40]}", kind, depth + 1)
            else:
                for i, item in enumerate(value):
                    self.value(item, f"{where}.{i}", kind, depth + 1)

    def string(self, text: str, where: str, kind: _Kind, limit: int | None) -> None:
        if limit is not None and len(text) > limit:
            raise MalformedFrame(f"{where}: a string of {len(text)} characters; at most {limit} are taken here")
        if text.isascii() and text.isprintable():
            return  # the common case: nothing to look for
        if kind is PAYLOAD:
            if _LONE_SURROGATE.search(text):
                self.replaced = True
            return
        bad = (_BAD_IN_IDENT if kind is IDENT else _BAD_IN_TEXT).search(text)
        if bad is not None:
            raise MalformedFrame(
                f"{where} holds {describe(bad.group())} at offset {bad.start()}, which is not taken "
                "in this field; send text without it"
            )


def _kind_of(metadata: list[Any], annotation: Any) -> _Kind:
    """The kind a field names: on the field, or inside an optional (`Identifier | None`)."""
    found = [m for m in metadata if isinstance(m, _Kind)]
    for arg in typing.get_args(annotation):  # X | None keeps X's Annotated metadata inside
        found += [m for m in getattr(arg, "__metadata__", ()) if isinstance(m, _Kind)]
    return found[0] if found else TEXT


def _scrubbed(value: Any) -> Any:
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_scrubbed(k): _scrubbed(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrubbed(v) for v in value]
    return value
