"""Download links: signed by the server's key for one artifact version and one API key, short-lived."""

from __future__ import annotations

import pytest

from orchestrator.artifacts.errors import ArtifactNotFound, LinkExpired
from orchestrator.artifacts.links import LINK_TTL_S, LinkClaims, make_link, read_link
from orchestrator.security import Hasher

KEY = Hasher(b"k" * 32)


def test_a_link_reads_back_what_it_was_made_for_until_it_expires() -> None:
    token, claims = make_link(KEY, "task_1", "art_1", "key_1", now=1000.0)
    assert claims == LinkClaims("task_1", "art_1", "key_1", 1000 + LINK_TTL_S)
    assert read_link(KEY, token, now=1000.0 + LINK_TTL_S - 1) == claims
    with pytest.raises(LinkExpired):
        read_link(KEY, token, now=1000.0 + LINK_TTL_S)


def test_a_link_signed_by_another_server_or_altered_is_not_found() -> None:
    token, _ = make_link(KEY, "task_1", "art_1", "key_1", now=1000.0)
    with pytest.raises(ArtifactNotFound):
        read_link(Hasher(b"other" * 8), token, now=1000.0)
    payload, _, signature = token.partition(".")
    forged, _ = make_link(KEY, "task_2", "art_9", "key_1", now=1000.0)  # a valid link for something else
    with pytest.raises(ArtifactNotFound):
        read_link(KEY, f"{forged.partition('.')[0]}.{signature}", now=1000.0)
    for broken in ("", ".", payload, f"{payload}.", f".{signature}", f"{payload}x.{signature}", "a.b.c"):
        with pytest.raises(ArtifactNotFound):
            read_link(KEY, broken, now=1000.0)
