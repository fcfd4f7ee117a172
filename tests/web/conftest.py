"""Browser fixtures for the dashboard tests: one headless Chromium per module (Playwright
driving the system's /usr/bin/chromium; no browser download), and a page per test that fails
on uncaught script errors, on any Content-Security-Policy violation (the browser's
`securitypolicyviolation` events and its console) and on the API key showing up in a URL or the
console."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.support import ROOT, Fleet

ARTIFACTS = ROOT / "test-artifacts" / "web"
DOCS = ROOT / "docs"
VIEWPORT = {"width": 1366, "height": 768}  # a common laptop screen
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


def _chromium() -> str | None:
    configured = os.environ.get("ORRERY_CHROMIUM")
    if configured:
        return configured
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _unavailable(reason: str) -> NoReturn:
    # On CI a missing browser is a broken setup, not a reason to skip quietly.
    if os.environ.get("CI"):
        pytest.fail(f"dashboard tests need a browser: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install playwright)")
    executable = _chromium()
    if executable is None:
        _unavailable("no Chromium found (apt-get install chromium, or set ORRERY_CHROMIUM)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def web_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A real server with two real agents, shared by the module's tests."""
    with Fleet(tmp_path_factory.mktemp("web"), heartbeat_interval_s="1") as f:
        f.agent("alpha", {"role": "producer", "zone": "eu-1"})
        f.agent("beta", {"role": "consumer"})
        yield f


@dataclass
class Watched:
    """A page plus what it did: request URLs, console lines and uncaught errors."""

    page: Any
    urls: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)  # Content-Security-Policy violations
    event_auth: list[str | None] = field(default_factory=list)


@contextlib.contextmanager
def watching(browser: Any, fleet: Fleet) -> Iterator[Watched]:
    """A fresh browser context and page; on exit, fail on script errors and key leaks."""
    # Reduced motion turns CSS transitions off, so screenshots never catch a colour mid-fade.
    context = browser.new_context(
        viewport=VIEWPORT, device_scale_factor=1, locale="en-GB", timezone_id="UTC", reduced_motion="reduce"
    )
    w = Watched(context.new_page())
    # Every document of the context reports what its Content-Security-Policy blocked (an init
    # script runs before the page's own scripts, in every frame, whatever the page's policy).
    # (a lambda: Playwright tags the callable it is given, which a bound builtin cannot take)
    context.expose_function("__orreryCspViolation", lambda line: w.violations.append(line))  # noqa: PLW0108
    context.add_init_script(CSP_WATCH)
    page = w.page
    page.set_default_timeout(20_000)
    page.on("request", lambda r: _record_request(w, r))
    page.on("console", lambda m: w.console.append(m.text))
    page.on("pageerror", lambda e: w.errors.append(str(e)))
    try:
        yield w
    finally:
        context.close()
    for secret in [fleet.server.api_key, *_issued_keys]:
        assert not any(secret in u for u in w.urls), "an API key appeared in a request URL"
        assert not any(secret in c for c in w.console), "an API key appeared in the console"
    assert not w.errors, f"uncaught script errors: {w.errors}"
    assert not w.violations, f"Content-Security-Policy violations: {w.violations}"
    assert not [c for c in w.console if "Content Security Policy" in c], w.console


CSP_WATCH = """
document.addEventListener("securitypolicyviolation", (e) => {
  window.__orreryCspViolation(`${e.effectiveDirective} blocked ${e.blockedURI || "inline"} in ${e.documentURI}` +
    (e.sample ? ` (${e.sample})` : ""));
}, true);
"""


@pytest.fixture
def watched(browser: Any, web_fleet: Fleet) -> Iterator[Watched]:
    with watching(browser, web_fleet) as w:
        yield w


_issued_keys: list[str] = []


def remember_key(key: str) -> str:
    """Keys made by a test are checked for leaks too."""
    _issued_keys.append(key)
    return key


def _record_request(w: Watched, request: Any) -> None:
    w.urls.append(request.url)
    if "/events" in request.url:
        w.event_auth.append(request.headers.get("authorization"))


def shot(page: Any, name: str, docs_name: str | None = None) -> Path:
    """Save a screenshot under test-artifacts/web/. The ones the docs show are copied to docs/
    when missing or when ORRERY_UPDATE_SCREENSHOTS=1, so a plain test run leaves the tree clean."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    if docs_name and (os.environ.get("ORRERY_UPDATE_SCREENSHOTS") == "1" or not (DOCS / docs_name).exists()):
        DOCS.mkdir(exist_ok=True)
        shutil.copyfile(path, DOCS / docs_name)
    return path
