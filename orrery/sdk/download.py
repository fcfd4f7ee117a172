"""An artifact saved to a local file, checked by its sha256 (`Client.download`). No network here:
the clients open the content stream where `Download.path`/`headers()` say, report its status to
`opened`, hand each piece to `take`, and ask `finish` once `done`.

The content goes to `<file>.partial` beside the destination while it is hashed; a dropped
connection resumes with a `Range` for the rest (the `ETag` in `If-Range` makes sure it is the
same content); only a file whose sha256 is the artifact's is renamed onto the destination, so a
failed or damaged download never leaves a file that looks complete."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from orrery.sdk.calls import artifact_content
from orrery.sdk.errors import ServerError, Unavailable
from orrery.sdk.models import Artifact

TRIES = 4  # streams opened for one download (the first and up to three resumptions)
PIECE = 256 * 1024
READ_TIMEOUT_S = 300.0


class Download:
    """One artifact on its way to `dest`: the bytes written and hashed so far. Use it as a
    context manager: the partial file is removed on the way out, whatever happened."""

    def __init__(self, artifact: Artifact, dest: Path) -> None:
        self.artifact = artifact
        self.dest = dest
        self.partial = dest.with_name(f"{dest.name}.partial")
        self.written = 0
        self.why = "the stream ended early"  # why the last stream stopped early
        self._hasher = hashlib.sha256()
        self._out: BinaryIO | None = None

    def __enter__(self) -> Download:
        self._out = self.partial.open("wb")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._out is not None:
            self._out.close()
        self.partial.unlink(missing_ok=True)

    @property
    def path(self) -> str:
        """Where the bytes are: the artifact's `content_url`, else its content route."""
        if self.artifact.content_url:
            return self.artifact.content_url
        call = artifact_content(self.artifact.task_id, self.artifact.name, self.artifact.version)
        return f"{call.path}?version={self.artifact.version}"

    def headers(self) -> dict[str, str]:
        """After a dropped stream, ask for the rest of the same content only."""
        if not self.written:
            return {}
        return {"Range": f"bytes={self.written}-", "If-Range": f'"{self.artifact.sha256}"'}

    def opened(self, status: int) -> None:
        """A stream answered `status` (< 400): anything but 206 after a drop is the whole content again."""
        if self.written and status != 206:
            out = self._file()
            out.seek(0)
            out.truncate()
            self._hasher, self.written = hashlib.sha256(), 0

    def take(self, piece: bytes) -> None:
        self._file().write(piece)
        self._hasher.update(piece)
        self.written += len(piece)

    def dropped(self, why: str) -> None:
        self.why = why

    @property
    def done(self) -> bool:
        return self.written >= self.artifact.size

    def finish(self) -> Artifact:
        """The whole content is written: the file in place if its sha256 is the artifact's,
        else `ServerError` (code `integrity_error`) and nothing saved."""
        out = self._file()
        out.flush()
        os.fsync(out.fileno())
        digest = self._hasher.hexdigest()
        if digest != self.artifact.sha256:
            raise ServerError(
                0,
                "integrity_error",
                f"the downloaded bytes have sha256 {digest}, not the artifact's {self.artifact.sha256}; nothing was "
                "saved: try again",
            )
        out.close()
        os.replace(self.partial, self.dest)
        return self.artifact

    def stopped(self) -> Unavailable:
        """Every try ended early: `Unavailable` (code `unreachable`), nothing saved."""
        return Unavailable(
            0,
            "unreachable",
            f"the download stopped after {self.written} of {self.artifact.size} bytes ({self.why}); try again",
        )

    def _file(self) -> BinaryIO:
        if self._out is None:
            raise RuntimeError("use a Download as a context manager")
        return self._out
