"""Artifact names and sha256s are matched whole: a trailing newline (which `$` accepts
with `re.match`) is refused on both ends, and a name that got into the store before cannot break
a download's headers."""

from __future__ import annotations

import pytest

from device_agent.toolsets.artifacts import _valid_name
from orchestrator.artifacts.errors import InvalidArtifact
from orchestrator.artifacts.model import artifact_name, content_address

SHA = "a" * 64


@pytest.mark.parametrize("name", ["rep\n", "rep\r\n", "rep\nX-Injected: 1", "\nrep", "rep\x00"])
def test_a_name_with_a_line_break_or_nul_is_refused_on_the_orchestrator_and_the_device(name: str) -> None:
    with pytest.raises(InvalidArtifact):
        artifact_name(name)
    assert not _valid_name(name)


def test_good_names_and_sha256s_are_still_taken() -> None:
    assert artifact_name("merged.log") == "merged.log" and _valid_name("merged.log")
    assert content_address(SHA.upper()) == SHA


def test_a_sha256_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(InvalidArtifact):
        content_address(SHA + "\n")


def test_a_stored_name_with_a_newline_becomes_a_safe_header_parameter() -> None:
    from orchestrator.api.artifacts import _header_safe  # here: the name checks above stand alone

    assert _header_safe('rep\n"x\\') == "rep__x_"
