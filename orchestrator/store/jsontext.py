"""JSON text of a value that may hold what orjson refuses."""

from __future__ import annotations

import json
from typing import Any

import orjson


def json_text(value: Any) -> str:
    """`value` as JSON text: orjson's (fast, compact), or the standard library's for what orjson
    will not take (an int over 64 bits), so whatever a JSON column holds can be written out again."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(value)
