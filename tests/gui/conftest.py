"""A real X display for the T2 tests: Xvfb on a free display number, and the instrumented Tk app.

Without Xvfb, xdotool, xdpyinfo or tkinter the display tests are skipped with the reason, except
under CI (`CI` set), where a missing tool fails them: CI must prove the real path.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TK_APP = Path(__file__).with_name("tk_app.py")
APT_PACKAGES = "xvfb xdotool x11-utils python3-tk"


def poll(predicate: Callable[[], Any], timeout: float = 5.0, what: str = "a condition") -> Any:
    """Call `predicate` until it returns something truthy, at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


def _missing() -> list[str]:
    missing = [tool for tool in ("Xvfb", "xdotool", "xdpyinfo") if shutil.which(tool) is None]
    try:
        import tkinter  # noqa: F401
    except ImportError:
        missing.append("tkinter")
    return missing


def _display_up(number: int) -> bool:
    probe = subprocess.run(["xdpyinfo", "-display", f":{number}"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.fixture(scope="module")
def xvfb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """':N' of a private Xvfb (1280x800x24, no TCP) started for this module."""
    missing = _missing()
    if missing:
        message = f"the X11 display tests need {', '.join(missing)} (apt-get install {APT_PACKAGES})"
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail(f"{message}; under CI they must run")
        pytest.skip(message)
    log = tmp_path_factory.mktemp("xvfb") / "xvfb.log"
    start = 90 + os.getpid() % 100  # spread parallel runs over different numbers
    for number in range(start, start + 40):
        if Path(f"/tmp/.X11-unix/X{number}").exists() or Path(f"/tmp/.X{number}-lock").exists():
            continue
        with log.open("ab") as out:
            proc = subprocess.Popen(
                # -noreset: without it the server resets whenever its last client leaves, and a
                # connection made during that reset is dropped (a desktop always has clients).
                ["Xvfb", f":{number}", "-screen", "0", "1280x800x24", "-nolisten", "tcp", "-noreset"],
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        try:
            poll(lambda p=proc, n=number: p.poll() is not None or _display_up(n), 10, f"Xvfb :{number}")
        except AssertionError:
            proc.kill()
            raise
        if proc.poll() is not None:  # lost a race for this number: try the next one
            continue
        try:
            yield f":{number}"
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return
    pytest.fail(f"could not start Xvfb on any display :{start}..:{start + 39}; see {log}")


class TkApp:
    """The running test app and its published state."""

    def __init__(self, proc: subprocess.Popen[bytes], state_file: Path) -> None:
        self.proc = proc
        self.state_file = state_file

    def state(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.state_file.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], what: str, timeout: float = 5.0) -> dict[str, Any]:
        """The first state that satisfies `predicate`, polled for at most `timeout` seconds."""
        result: dict[str, Any] = poll(lambda: (s := self.state()) and predicate(s) and s, timeout, what)
        return result


@pytest.fixture
def tk_app(xvfb: str, tmp_path: Path) -> Iterator[TkApp]:
    """A fresh Tk app on the display, ready (focus on its entry) before the test starts."""
    state_file = tmp_path / "tk-state.json"
    proc = subprocess.Popen([sys.executable, str(TK_APP), str(state_file)], env={**os.environ, "DISPLAY": xvfb})
    app = TkApp(proc, state_file)
    try:
        app.wait_for(lambda s: s.get("ready") and s.get("focused") == "main", "the Tk app to start", 10)
        yield app
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
