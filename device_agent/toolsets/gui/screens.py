"""Screenshot files: private, bounded, never overwritten (device-safety note, A "Audit & artifacts").

Screenshots show whatever is on the screen (mail, passwords being typed), so they are kept in a
0700 directory as 0600 files. Each file is created with O_EXCL|O_NOFOLLOW *before* pixels are
written, so nothing planted at that name (a symlink to elsewhere) receives them. One file may
hold at most 20 MiB; the directory at most 512 MiB, the oldest files deleted first.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from device_agent.toolsets.gui.rules import GuiError

MAX_FILE_BYTES = 20 * 1024 * 1024
MAX_DIR_BYTES = 512 * 1024 * 1024
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def private_dir(path: Path) -> Path:
    """Create `path` as 0700, or check that an existing one is a real directory that only we can use."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise GuiError("tool_error", f"{path} is not a directory owned by the agent's user; remove it or fix it")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


class ScreenshotStore:
    """Where `gui.observe` keeps its PNG files, under `<data_dir>/screenshots`."""

    def __init__(
        self, directory: Path | None, max_file_bytes: int = MAX_FILE_BYTES, max_dir_bytes: int = MAX_DIR_BYTES
    ) -> None:
        # Without a data dir (tests, ad-hoc use), a private temporary directory of its own.
        self._directory = directory
        self.max_file_bytes = max_file_bytes
        self.max_dir_bytes = max_dir_bytes

    @property
    def directory(self) -> Path:
        """The directory, created on first use (0700)."""
        if self._directory is None:
            self._directory = Path(tempfile.mkdtemp(prefix="orrery-gui-"))
        return private_dir(self._directory)

    def save(self, name: str, png: bytes) -> Path:
        """Write `png` to a new file `name` (0600, O_EXCL) after making room; return its path."""
        if len(png) > self.max_file_bytes:
            raise GuiError(
                "tool_error",
                f"the screenshot is {len(png)} bytes, over the {self.max_file_bytes} byte limit per image; "
                "lower the screen resolution of this device",
            )
        if not png.startswith(PNG_MAGIC):
            raise GuiError("tool_error", "the screen capture did not produce a PNG image; call gui.observe again")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            directory = self.directory
            self._make_room(directory, len(png))
            path = directory / name
            fd = os.open(path, flags, 0o600)
        except FileExistsError:  # names are random: something was planted there, leave it alone
            raise GuiError(
                "tool_error", f"{name} already exists among the screenshots; call gui.observe again"
            ) from None
        except OSError as exc:
            raise GuiError("tool_error", f"cannot store the screenshot: {exc}") from exc
        try:
            view = memoryview(png)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise GuiError("tool_error", f"cannot write the screenshot ({exc.strerror}); free disk space") from exc
        os.close(fd)
        return path

    def _make_room(self, directory: Path, incoming: int) -> None:
        """Delete the oldest screenshots until `incoming` more bytes fit under the directory cap."""
        files: list[tuple[int, int, Path]] = []
        for entry in os.scandir(directory):
            if entry.name.endswith(".png") and entry.is_file(follow_symlinks=False):
                info = entry.stat(follow_symlinks=False)
                files.append((info.st_mtime_ns, info.st_size, Path(entry.path)))
        files.sort()
        total = sum(size for _, size, _ in files)
        for _, size, path in files:
            if total + incoming <= self.max_dir_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
