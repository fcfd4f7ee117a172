"""Which X display the toolset drives, who controls it, and whether it is usable at all.

One controller per display: two agents clicking on one screen would each act on a world the
other keeps changing. An OS lock (`flock(LOCK_EX|LOCK_NB)`) on a file named by the user's uid
and the display decides; a second process gets `busy`, and the kernel frees the lock when the
holder dies, even by SIGKILL, so no stale lock file can wedge the device.

The lock lives under `/tmp/orrery-<uid>/` rather than `$XDG_RUNTIME_DIR`: every agent process of
the user must find the same file, and an agent started outside a login session (cron, a system
service) often has no `$XDG_RUNTIME_DIR`. The directory is 0700 and must be ours.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

from device_agent.datadir import SCREENSHOTS_NAME
from device_agent.toolsets.base import ToolsetContext
from device_agent.toolsets.gui.atspi import REGISTRY, ROOT_PATH, connect
from device_agent.toolsets.gui.rules import GuiError
from device_agent.toolsets.gui.screens import ScreenshotStore, private_dir
from device_agent.toolsets.gui.x11 import grab_png, read_screen

# What a Linux desktop needs for element grounding (Debian/Ubuntu names); see docs/how-to/gui-desktop.md.
ATSPI_PACKAGES = "dbus at-spi2-core (at-spi-bus-launcher, at-spi2-registryd); GTK/Qt apps expose their tree with it"


BUS_LAUNCHERS = (Path("/usr/libexec/at-spi-bus-launcher"), Path("/usr/lib/at-spi2-core/at-spi-bus-launcher"))


def default_lock_dir() -> Path:
    """`/tmp/orrery-<uid>`: the same for every agent process of this user."""
    return Path("/tmp") / f"orrery-{os.getuid()}"


def display_key(display: str) -> str:
    """A file-name-safe key for a display: ':1', ':1.0' and 'unix:1' are the same X server."""
    host, _, rest = display.rpartition(":")
    number = rest.split(".", 1)[0]
    host = "local" if host in ("", "unix") else host
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{host}-{number}")


class DisplayLock:
    """The per-user, per-display controller lock, taken lazily and held until `release`."""

    def __init__(self, display: str, directory: Path | None = None) -> None:
        self.display = display
        self.directory = directory or default_lock_dir()
        self.path = self.directory / f"gui-{display_key(display)}.lock"
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this instance holds the lock."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, or raise `busy` naming the process that holds it."""
        if self._fd is not None:
            return
        import fcntl  # POSIX only; imported here so that importing the toolset works everywhere

        try:
            private_dir(self.directory)
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(self.path, flags, 0o600)
        except OSError as exc:
            raise GuiError("tool_error", f"cannot open the display lock {self.path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise GuiError(
                "busy",
                f"another Orrery agent process (pid {holder}) controls X display {self.display}; only one "
                "controller per display is allowed. Use that agent, or stop it and retry",
                holder_pid=holder,
            ) from None
        # Our pid in the file, so the refused process can say who holds the display.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Give the display up (closing the descriptor drops the flock)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def probe(self) -> str:
        """'free', 'held by this process' or 'held by another process', without keeping the lock."""
        if self.held:
            return "held by this process"
        try:
            self.acquire()
        except GuiError:
            return "held by another process"
        self.release()
        return "free"


def check(ctx: ToolsetContext, display: str | None = None) -> dict[str, Any]:
    """Readiness of the `gui` toolset: an X display reachable via $DISPLAY, a real screenshot, xdotool.

    Returns `{"ready": bool, "reason": str | None, "display", "xdotool", "screen", "display_lock"}`.
    Nothing is faked: a Wayland session without X, a missing xdotool or a failed capture is
    reported as not ready with the reason.
    """
    display = display if display is not None else os.environ.get("DISPLAY", "")
    report: dict[str, Any] = {"ready": False, "reason": None, "display": display or None}
    xdotool = shutil.which("xdotool")
    report["xdotool"] = xdotool
    if not display:
        if os.environ.get("WAYLAND_DISPLAY"):
            report["reason"] = (
                "this is a Wayland session without an X11 DISPLAY; the gui toolset drives X11 only "
                "(run the agent in an X11 session, or with XWayland and DISPLAY set)"
            )
        else:
            report["reason"] = "DISPLAY is not set: no X11 display to drive (start the agent in the desktop session)"
        return report
    if xdotool is None:
        report["reason"] = "xdotool is not installed (Debian/Ubuntu: apt-get install xdotool)"
        return report
    try:
        screen = read_screen(display)
        png, width, height = grab_png(display)
        store = ScreenshotStore(ctx.data_dir / SCREENSHOTS_NAME if ctx.data_dir else None)
        path = store.save(f"check-{secrets.token_hex(8)}.png", png)
        path.unlink()
    except (GuiError, OSError) as exc:
        report["reason"] = f"cannot use X display {display}: {exc}"
        return report
    report["screen"] = {"width": width, "height": height, "focused_window_title": screen.title}
    with contextlib.suppress(GuiError, OSError):
        report["display_lock"] = DisplayLock(display).probe()
    report["accessibility"] = accessibility_report()
    report["ready"] = True
    return report


def accessibility_report() -> dict[str, Any]:
    """Whether element grounding works here: jeepney, a session D-Bus, the AT-SPI bus and its registry.

    Optional: without it the toolset still works by coordinates, so it never makes `ready` false.
    """
    out: dict[str, Any] = {"available": False, "reason": None, "packages": ATSPI_PACKAGES}
    # The programs of the packages (informative: a desktop may run them from elsewhere).
    out["dbus_daemon"] = shutil.which("dbus-daemon")
    out["at_spi_bus_launcher"] = next((str(p) for p in BUS_LAUNCHERS if p.exists()), None)
    try:
        import jeepney  # noqa: F401
    except ImportError:
        out["reason"] = "the Python package jeepney is missing (pip install jeepney, or reinstall orrery)"
        return out
    try:
        with connect() as bus:
            apps = bus.children(REGISTRY, ROOT_PATH)
    except GuiError as exc:
        out["reason"] = f"{exc.message}; without it gui.observe lists no elements and inputs use coordinates"
        return out
    except Exception as exc:  # a registry that does not answer
        out["reason"] = f"the AT-SPI registry does not answer ({type(exc).__name__}: {exc}); install at-spi2-core"
        return out
    out |= {"available": True, "applications": len(apps)}
    return out
