"""Identifier and secret generation. Ids are prefixed, so a stray id says what it names."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


def new_secret(prefix: str) -> str:
    """A bearer secret: 256 bits of randomness behind a type prefix (`orrk_` keys, `orrd_` tokens)."""
    return f"{prefix}_{secrets.token_urlsafe(32)}"
