"""An opt-in confinement for `shell.run`, built on bubblewrap (`bwrap`, Debian package `bubblewrap`).

The shell allow and deny lists are guardrails against mistakes, not a boundary: `env rm`,
`sh -c 'rm ...'`, `find -delete` or a copied binary all get past `shell_deny = ["rm"]`. With
`sandbox = "bwrap"` each run happens in fresh Linux namespaces instead:

- the whole file system is mounted read-only (`--ro-bind / /`, submounts included);
- the workspace is bind-mounted read-write: the only writable place besides a private `/tmp`;
- the agent's data dir (ledger, audit log, lock) is hidden under an empty tmpfs, and so is `/run`,
  where system sockets (Docker, D-Bus) live: a Unix socket on a read-only mount still connects;
- fresh `/dev` and `/proc`, its own pid namespace (`--unshare-pid`), no capabilities, a new
  session (no TIOCSTI into the agent's terminal), killed with the agent (`--die-with-parent`);
- no network, loopback included (`--unshare-net`), unless `sandbox_network = true`;
- per-command resource limits (setrlimit through util-linux `prlimit`, inside the namespaces so
  the process count is the command's own): data memory, CPU seconds, processes, file size.

Killing the `bwrap` process kills everything inside: its pid-namespace init dies with it
(`--die-with-parent`), and the kernel then kills the whole namespace, including processes that
left the process group. The shell toolset's group kill (timeout, cancel) therefore still reaches
every process of the run.

Every stdio MCP server the agent starts runs in the same sandbox (`wrap_server`, used by
device_agent/launch.py), with binds of its own (its directory and npm cache under the data dir,
the browser's profile), its own network setting and no resource limits.

What it does not do: reading stays allowed everywhere the agent's user can read (apart from the
hidden paths); Unix sockets outside `/run` and `/tmp` stay reachable; the process limit does not
bind root (the kernel exempts it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
# How long the start-up probe (`bwrap ... true`) may take before the sandbox counts as broken.
PROBE_TIMEOUT_S = 15.0


class SandboxUnavailable(Exception):
    """The sandbox is configured but cannot run here; `str(exc)` is one line saying why and what to do."""


@dataclass(frozen=True)
class Limits:
    """Per-command resource limits; 0 means no limit for that resource."""

    memory_mb: int = 2048
    cpu_s: int = 3600
    max_processes: int = 256
    file_size_mb: int = 1024

    def prlimit_options(self) -> list[str]:
        """`prlimit` options setting soft and hard limits (a program cannot raise them again)."""
        # RLIMIT_DATA rather than RLIMIT_AS: runtimes such as V8 and Go reserve huge address
        # ranges they never touch, which AS counts and DATA (writable private memory) does not.
        # CPU: the soft limit sends SIGXCPU (so the result can name the limit); a program that
        # ignores it gets SIGKILL one second later, at the hard limit.
        limits = [
            (self.memory_mb, f"--data={self.memory_mb * MIB}"),
            (self.cpu_s, f"--cpu={self.cpu_s}:{self.cpu_s + 1}"),
            (self.max_processes, f"--nproc={self.max_processes}"),
            (self.file_size_mb, f"--fsize={self.file_size_mb * MIB}"),
        ]
        return [option for value, option in limits if value > 0]

    def report(self) -> dict[str, int | None]:
        return {
            "memory_mb": self.memory_mb or None,
            "cpu_s": self.cpu_s or None,
            "max_processes": self.max_processes or None,
            "file_size_mb": self.file_size_mb or None,
        }


@dataclass(frozen=True)
class Sandbox:
    """How to wrap one `shell.run` argv in bubblewrap; build it with `Sandbox.create`."""

    workspace: Path
    hidden: tuple[Path, ...]
    network: bool
    limits: Limits
    bwrap: str
    prlimit: str

    @classmethod
    def create(cls, workspace: Path, data_dir: Path, *, network: bool, limits: Limits) -> Sandbox:
        """Find `bwrap` and `prlimit` and check the layout; raises `SandboxUnavailable`."""
        workspace, data_dir = workspace.resolve(), data_dir.resolve()
        if workspace == data_dir:
            raise SandboxUnavailable(
                f"the sandbox cannot hide the data dir {data_dir} when it is the workspace {workspace}; "
                "give the agent a workspace of its own (--workspace)"
            )
        if workspace == Path("/"):
            raise SandboxUnavailable("the sandbox needs a workspace other than '/' (--workspace)")
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailable(
                "sandbox = 'bwrap' but bubblewrap is not installed (no 'bwrap' on PATH); install it "
                "(Debian/Ubuntu: apt-get install bubblewrap) or set sandbox = 'none'"
            )
        prlimit = shutil.which("prlimit")
        if prlimit is None and limits.prlimit_options():
            raise SandboxUnavailable(
                "the sandbox's resource limits need 'prlimit' (util-linux), which is not on PATH; "
                "install util-linux or set every sandbox_* limit to 0"
            )
        return cls(workspace, (data_dir,), network, limits, bwrap, prlimit or "prlimit")

    def wrap(self, argv: Sequence[str], workdir: Path) -> list[str]:
        """The command line that runs `argv` in `workdir` (inside the workspace) in the sandbox."""
        limits = self.limits.prlimit_options()
        inner = [self.prlimit, *limits, "--", *argv] if limits else list(argv)
        return [*self.bwrap_options(workdir), "--", *inner]

    def wrap_server(
        self,
        argv: Sequence[str],
        workdir: Path,
        *,
        network: bool,
        writable: Sequence[Path] = (),
        readable: Sequence[Path] = (),
    ) -> list[str]:
        """The command line that runs an MCP server (`argv`) in the sandbox, in `workdir`.

        The shell's layout (workspace writable, data dir and `/run` hidden), plus the server's own
        binds: `writable` and `readable` paths (e.g. its npm cache and browser profile under the
        data dir) and its own network setting. No per-command resource limits: a server runs as
        long as the agent does (the CPU limit would end it), and Chromium reserves more memory
        than a command's limit. A fresh `/dev/shm` for Chromium's shared memory."""
        readable = [*readable, *_installed_under_tmp(argv)]
        binds = [(path, ["--ro-bind", str(path), str(path)]) for path in readable]
        binds += [(path, ["--bind", str(path), str(path)]) for path in writable]
        options = self.bwrap_options(workdir, network=network, binds=binds, shm=True)
        return [*options, "--", *argv]

    def bwrap_options(
        self,
        workdir: Path,
        *,
        network: bool | None = None,
        binds: Sequence[tuple[Path, list[str]]] = (),
        shm: bool = False,
    ) -> list[str]:
        network = self.network if network is None else network
        options = [
            self.bwrap,
            "--unshare-all",  # user, ipc, pid, net, uts, cgroup namespaces
            *(["--share-net"] if network else []),
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
        ]
        # Later mounts cover earlier ones, so the shallower path goes first: a data dir inside
        # the workspace is hidden after the workspace is bound, a workspace inside the data dir
        # (the default) is bound after the data dir is hidden.
        mounts: list[tuple[Path, list[str]]] = [
            (Path("/tmp"), ["--tmpfs", "/tmp"]),
            (Path("/run"), ["--tmpfs", "/run"]),
            *((path, ["--tmpfs", str(path)]) for path in self.hidden),
            (self.workspace, ["--bind", str(self.workspace), str(self.workspace)]),
            *([(Path("/dev/shm"), ["--tmpfs", "/dev/shm"])] if shm else []),
            *binds,
        ]
        for _, mount in sorted(mounts, key=lambda item: len(item[0].parts)):
            options += mount
        options += self._resolver(network)
        options += ["--chdir", str(workdir)]
        return options

    def _resolver(self, network: bool) -> list[str]:
        """With network, keep DNS working where /etc/resolv.conf points into the hidden /run."""
        if not network:
            return []
        target = Path("/etc/resolv.conf").resolve()
        if target.is_relative_to("/run") and target.is_file():
            return ["--ro-bind", str(target), str(target)]
        return []

    def probe(self) -> None:
        """Run `true` in the sandbox once; raises `SandboxUnavailable` with bwrap's own reason."""
        try:
            done = subprocess.run(
                self.wrap(["true"], self.workspace),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SandboxUnavailable(
                f"the sandbox did not start a trivial command within {PROBE_TIMEOUT_S:g} s"
            ) from None
        except OSError as exc:
            raise SandboxUnavailable(f"cannot run {self.bwrap}: {exc}") from None
        if done.returncode != 0:
            reason = " ".join(done.stderr.split()) or f"exit status {done.returncode}"
            raise SandboxUnavailable(
                f"the sandbox cannot start here ({reason}); allow unprivileged user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1, or an AppArmor profile for bwrap; in a "
                "container, run it with a seccomp profile that allows them) or set sandbox = 'none'"
            )

    def report(self) -> dict[str, Any]:
        """The sandbox as `hello.info.policy` and `orrery agent --check` report it."""
        return {"kind": "bwrap", "network": self.network, "limits": self.limits.report()}


def signal_exit(code: int) -> int | None:
    """The signal number behind a sandboxed exit status (bwrap reports a signal N as 128 + N)."""
    return code - 128 if 128 < code < 128 + 65 else None


def _installed_under_tmp(argv: Sequence[str]) -> list[Path]:
    """The top directories under /tmp that hold what a server needs to start: its program (and a
    wrapped program after `--`), the agent's interpreter and the agent's own code. The sandbox's
    private /tmp would hide them when the agent or the server is installed there (read-only)."""
    programs = [argv[0], *(argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--")]
    found: set[Path] = set()
    for raw in (*programs, sys.prefix, sys.executable, __file__):
        path = Path(raw)
        if not path.is_absolute():
            continue
        for candidate in (path, path.resolve()):
            if candidate.is_relative_to("/tmp") and len(candidate.parts) > 2:
                found.add(Path("/tmp", candidate.parts[2]))
    return sorted(found)
