"""Result error codes from devices are bounded: known codes pass, invented ones become `device_error`."""

from __future__ import annotations

import pytest

from protocol.errors import (
    MAX_ERROR_MESSAGE_CHARS,
    RESULT_ERROR_CODES,
    ErrorCode,
    bounded_result_error,
)


@pytest.mark.parametrize("code", sorted(RESULT_ERROR_CODES))
def test_a_known_code_and_its_message_are_kept(code: str) -> None:
    assert bounded_result_error(code, "what to do next") == (code, "what to do next")


def test_an_invented_code_becomes_device_error_with_the_original_quoted_in_the_message() -> None:
    code, message = bounded_result_error("pwned-1234", "disk on fire")
    assert code == ErrorCode.DEVICE_ERROR == "device_error"
    assert "'pwned-1234'" in message and "disk on fire" in message


def test_the_quoted_code_is_truncated_and_reduced_to_safe_characters() -> None:
    code, message = bounded_result_error('x"\n\x1b[31m\u202e' + "y" * 500, "m")
    assert code == "device_error"
    quoted = message.split("'")[1]
    assert quoted.startswith("x????31m?") and quoted.endswith("...")
    assert len(quoted) <= 64 + 3
    assert "\n" not in message and "\x1b" not in message and "\u202e" not in message


def test_a_long_message_is_capped() -> None:
    _, message = bounded_result_error("tool_error", "z" * 100_000)
    assert len(message) == MAX_ERROR_MESSAGE_CHARS and message.endswith("...")
