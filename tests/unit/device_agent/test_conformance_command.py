"""`python -m device_agent.conformance`, the client the MCP conformance suite runs (tests/conformance):
what it says when there is nothing to test."""

from __future__ import annotations

from pytest import CaptureFixture

from device_agent import conformance
from tests.support import free_port


def test_without_a_url_it_prints_its_usage_and_exits_2(capsys: CaptureFixture[str]) -> None:
    assert conformance.main([]) == 2
    assert "usage: python -m device_agent.conformance URL" in capsys.readouterr().err


def test_a_server_that_is_not_there_is_a_failure_that_says_why(capsys: CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    assert conformance.main([url]) == 1
    err = capsys.readouterr().err
    assert "toolset 'conformance' failed to start" in err and "127.0.0.1" in err, err
