"""Where the `browser` profile's Chromium may go: the web (http and https) at public addresses,
and the private origins the device owner lists (`[agent.browser] allowed_private_origins`).

Two layers use the same rules:

- the agent's guard checks a tool's URL argument before the call reaches the browser
  (`url_refusal`), so a refused navigation gets a clear `policy_denied` and never runs;
- every request the browser itself makes (a redirect, a link, a script's fetch, an image) goes
  through a small HTTP proxy (`serve`), which this module runs around the Playwright MCP server
  (`main`; it needs only the standard library, so it runs by path with `python -I`). The proxy
  resolves the host itself, refuses private addresses, and connects to the very address it
  checked (so a name that resolves differently a second time cannot slip past it).

The proxy sees only what Chromium sends through a proxy: HTTP(S) and WebSocket requests. Chromium
itself refuses web pages that navigate to `file:` URLs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

log = logging.getLogger("orrery.agent.browser")

WEB_SCHEMES = ("http", "https")
# Browser tools whose `url` argument is a top-level navigation target.
URL_TOOLS = ("browser.browser_navigate", "browser.browser_tabs")
# WHATWG URL parsing drops these anywhere in a URL, so `java\tscript:` is `javascript:`; a URL
# holding one is refused rather than guessed at.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
RESOLVE_TIMEOUT_S = 5.0

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Refusal:
    """Why a URL or a request is refused: `reason` is stable, `message` is for whoever acts next."""

    reason: str
    message: str


def parse_origins(origins: Iterable[str]) -> frozenset[tuple[str, str, int]]:
    """`http://127.0.0.1:8080` as (scheme, host, port); ValueError for anything else."""
    out = set()
    for origin in origins:
        parts = urlsplit(origin)
        if (
            parts.scheme not in WEB_SCHEMES
            or not parts.hostname
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
            or "@" in parts.netloc
        ):
            raise ValueError(f"'{origin}' is not an http(s) origin such as 'http://127.0.0.1:8080'")
        out.add((parts.scheme, parts.hostname.lower(), parts.port or default_port(parts.scheme)))
    return frozenset(out)


def default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def target_of(url: str) -> tuple[str, str, int] | Refusal:
    """(scheme, host, port) the browser would navigate to for the tool argument `url`, or why not.

    Playwright MCP prefixes a URL it cannot parse with `https://` (`http://` for `localhost...`),
    and Chromium reads a backslash as a slash in http(s) URLs: both are followed here."""
    shown = url if len(url) <= 200 else url[:200] + "..."
    if _CONTROL.search(url):
        return Refusal("url_invalid", f"the URL {shown!r} contains control characters; give a plain http(s) URL")
    text = url.strip()
    scheme_match = _SCHEME.match(text)
    if scheme_match:
        scheme = scheme_match.group(1).lower()
    else:  # `127.0.0.1:8080`, `example.com/a`: Playwright MCP makes them https (localhost: http)
        scheme = "http" if text.startswith("localhost") else "https"
        text = f"{scheme}://{text}"
    if scheme not in WEB_SCHEMES:
        return Refusal(
            "url_scheme",
            f"the browser may only open http and https URLs; {scheme or 'this'}: URLs such as {shown!r} are "
            "refused on this device (no file:, view-source:, javascript:, data:, chrome: or blob: URLs)",
        )
    parts = urlsplit(text.replace("\\", "/"))
    try:
        port = parts.port or default_port(scheme)
    except ValueError:
        return Refusal("url_invalid", f"the URL {shown!r} has an invalid port")
    if not parts.hostname:
        return Refusal("url_invalid", f"the URL {shown!r} has no host; give a full http(s) URL")
    return scheme, parts.hostname.lower(), port


def is_public(address: Address) -> bool:
    """Whether `address` is a public unicast address (not loopback, link-local, private, ...)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def allowed_origin(allowed: frozenset[tuple[str, str, int]], host: str, port: int, scheme: str | None) -> bool:
    """Whether the owner listed this origin (`scheme` None: a CONNECT tunnel, either scheme)."""
    return any(h == host and p == port and (scheme is None or s == scheme) for s, h, p in allowed)


async def resolve(host: str, port: int) -> list[Address]:
    """The addresses `host` resolves to (an IP literal: itself), in the resolver's order."""
    loop = asyncio.get_running_loop()
    infos = await asyncio.wait_for(loop.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S)
    out: list[Address] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in out:
            out.append(address)
    return out


async def vetted(
    host: str, port: int, scheme: str | None, allowed: frozenset[tuple[str, str, int]]
) -> list[Address] | Refusal:
    """The addresses the browser may connect to for `host:port`, or why it may not."""
    host = host.lower()
    try:
        addresses = await resolve(host, port)
    except (OSError, UnicodeError, ValueError, TimeoutError) as exc:
        return Refusal("host_unresolved", f"the host '{host}' cannot be resolved ({exc}); check the URL")
    if not addresses:
        return Refusal("host_unresolved", f"the host '{host}' resolves to no address; check the URL")
    if allowed_origin(allowed, host, port, scheme):
        return addresses
    private = [a for a in addresses if not is_public(a)]
    if private:
        return Refusal(
            "private_address",
            f"the browser may not open '{host}:{port}': it is a loopback, link-local or private address "
            f"({private[0]}) and the device owner has not listed it in [agent.browser] allowed_private_origins",
        )
    return addresses


async def url_refusal(url: str, allowed: frozenset[tuple[str, str, int]]) -> Refusal | None:
    """Why the browser must not navigate to the tool argument `url`, or None."""
    target = target_of(url)
    if isinstance(target, Refusal):
        return target
    scheme, host, port = target
    found = await vetted(host, port, scheme, allowed)
    return found if isinstance(found, Refusal) else None


# ---- the proxy every browser request goes through

_MAX_HEAD = 64 * 1024
_HOP_HEADERS = {b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization", b"te", b"upgrade"}


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()


async def _connect(addresses: Sequence[Address], port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    error: OSError = OSError("no address")
    for address in addresses:
        try:
            return await asyncio.wait_for(asyncio.open_connection(str(address), port), 30)
        except (OSError, TimeoutError) as exc:
            error = OSError(str(exc) or type(exc).__name__)
    raise error


def _reply(writer: asyncio.StreamWriter, status: str, text: str) -> None:
    body = f"<!doctype html><title>Refused</title><p>{text}</p>".encode()
    writer.write(
        f"HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode()
        + body
    )


async def _handle(
    client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, allowed: frozenset[tuple[str, str, int]]
) -> None:
    try:
        try:
            head = await asyncio.wait_for(client_r.readuntil(b"\r\n\r\n"), 60)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            return
        line, _, rest = head.partition(b"\r\n")
        try:
            method, target, version = line.decode("latin-1").split(" ")
        except ValueError:
            _reply(client_w, "400 Bad Request", "malformed request")
            return
        scheme: str | None
        if method == "CONNECT":
            host, _, port_text = target.rpartition(":")
            scheme, path = None, ""
        else:
            parts = urlsplit(target)
            if parts.scheme != "http" or not parts.hostname:
                _reply(client_w, "400 Bad Request", "only http:// requests and CONNECT tunnels are proxied")
                return
            host, port_text = parts.hostname, str(parts.port or 80)
            scheme, path = "http", (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            port = int(port_text)
        except ValueError:
            _reply(client_w, "400 Bad Request", "bad port")
            return
        found = await vetted(host.strip("[]"), port, scheme, allowed)
        if isinstance(found, Refusal):
            log.warning("browser request to %s:%s refused: %s", host, port, found.reason)
            _reply(client_w, "403 Forbidden", f"refused by this device's browser policy: {found.message}")
            return
        try:
            up_r, up_w = await _connect(found, port)
        except OSError as exc:
            _reply(client_w, "502 Bad Gateway", f"cannot connect to {host}:{port} ({exc})")
            return
        if method == "CONNECT":
            client_w.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        else:
            # One request per upstream connection: the browser may reuse a proxy connection for
            # another host, which must be checked on its own.
            headers = [h for h in rest.split(b"\r\n") if h and h.split(b":", 1)[0].strip().lower() not in _HOP_HEADERS]
            up_w.write(
                f"{method} {path} {version}\r\n".encode("latin-1") + b"\r\n".join([*headers, b"Connection: close"])
            )
            up_w.write(b"\r\n\r\n")
        await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))
        up_w.close()
    finally:
        with contextlib.suppress(Exception):
            client_w.close()


async def serve(allowed: frozenset[tuple[str, str, int]], started: threading.Event, port_box: list[int]) -> None:
    server = await asyncio.start_server(lambda r, w: _handle(r, w, allowed), "127.0.0.1", 0, limit=_MAX_HEAD)
    port_box.append(server.sockets[0].getsockname()[1])
    started.set()
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str]) -> int:
    """`python -I browser_net.py [--allow ORIGIN]... -- COMMAND...`: start the proxy on
    loopback, then COMMAND (the Playwright MCP server) with `--proxy-server` pointing at it. The
    command keeps this process's stdin and stdout (the MCP stdio channel); its exit code is ours."""
    args = list(argv)
    if "--" not in args:
        print("usage: python -I browser_net.py [--allow ORIGIN]... -- COMMAND...", file=sys.stderr)
        return 2
    split = args.index("--")
    options, command = args[:split], args[split + 1 :]
    origins = [options[i + 1] for i, flag in enumerate(options[:-1]) if flag == "--allow"]
    allowed = parse_origins(origins)
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s: %(message)s")
    started, port_box = threading.Event(), list[int]()
    threading.Thread(target=lambda: asyncio.run(serve(allowed, started, port_box)), daemon=True).start()
    if not started.wait(30):
        print("the browser proxy did not start", file=sys.stderr)
        return 1
    proxy = f"http://127.0.0.1:{port_box[0]}"
    child = subprocess.Popen([*command, "--proxy-server", proxy])
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    while True:
        try:
            return child.wait()
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
