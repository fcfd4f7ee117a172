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


# ---- the accessibility (AT-SPI) tests: a private session D-Bus, its AT-SPI bus and a GTK app ----

GTK_APP = Path(__file__).with_name("gtk_app.py")
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, with python3-gi and gir1.2-gtk-3.0 (the agent venv needs neither)
ATSPI_PACKAGES = "dbus at-spi2-core python3-gi gir1.2-gtk-3.0"
BUS_LAUNCHER = next(
    (p for p in ("/usr/libexec/at-spi-bus-launcher", "/usr/lib/at-spi2-core/at-spi-bus-launcher") if Path(p).exists()),
    None,
)


def _atspi_missing() -> list[str]:
    missing = [] if shutil.which("dbus-daemon") else ["dbus-daemon"]
    if BUS_LAUNCHER is None:
        missing.append("at-spi-bus-launcher")
    probe = [SYSTEM_PYTHON, "-c", "import gi; gi.require_version('Gtk', '3.0'); from gi.repository import Gtk"]
    if not Path(SYSTEM_PYTHON).exists() or subprocess.run(probe, capture_output=True, check=False).returncode:
        missing.append("GTK 3 for the system python")
    return missing


def _stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def a11y_bus(xvfb: str) -> Iterator[dict[str, str]]:
    """A private session D-Bus with the AT-SPI bus launcher on it, for the module's display.

    Yields the environment an agent and the GTK app need: DISPLAY, DBUS_SESSION_BUS_ADDRESS and
    NO_AT_BRIDGE=0 (GTK then registers its widget tree on the accessibility bus).
    """
    missing = _atspi_missing()
    if missing:
        message = f"the accessibility tests need {', '.join(missing)} (apt-get install {ATSPI_PACKAGES})"
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail(f"{message}; under CI they must run")
        pytest.skip(message)
    daemon = subprocess.Popen(
        ["dbus-daemon", "--session", "--nofork", "--print-address=1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    assert daemon.stdout is not None
    address = daemon.stdout.readline().decode().strip()
    env = {"DISPLAY": xvfb, "DBUS_SESSION_BUS_ADDRESS": address, "NO_AT_BRIDGE": "0"}
    assert BUS_LAUNCHER is not None
    launcher = subprocess.Popen(
        [BUS_LAUNCHER, "--launch-immediately"],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        probe = [
            "dbus-send",
            "--session",
            "--print-reply",
            "--dest=org.a11y.Bus",
            "/org/a11y/bus",
            "org.a11y.Bus.GetAddress",
        ]
        poll(
            lambda: subprocess.run(probe, env={**os.environ, **env}, capture_output=True, check=False).returncode == 0,
            10,
            "the AT-SPI bus launcher",
        )
        yield env
    finally:
        _stop(launcher)
        _stop(daemon)
        daemon.stdout.close()


@pytest.fixture
def gtk_app(a11y_bus: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TkApp]:
    """A fresh GTK app on the display, its tree on the AT-SPI bus; this process uses that session bus."""
    for name, value in a11y_bus.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AT_SPI_BUS_ADDRESS", raising=False)
    state_file = tmp_path / "gtk-state.json"
    proc = subprocess.Popen([SYSTEM_PYTHON, str(GTK_APP), str(state_file)], env={**os.environ, **a11y_bus})
    app = TkApp(proc, state_file)
    try:
        app.wait_for(lambda s: s.get("ready"), "the GTK app to start", 15)
        yield app
    finally:
        _stop(proc)
