"""`/docs` (Swagger UI) works without internet: its page loads only this server's own assets,
each asset is served, and a real browser with every other origin blocked renders the API."""

from __future__ import annotations

from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from tests.support import Fleet
from tests.web.conftest import Watched

CONTENT_TYPES = {".js": ("text/javascript", "application/javascript"), ".css": ("text/css",), ".png": ("image/png",)}


@pytest.fixture(scope="module")
def web_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The docs need a server only (this overrides the shared fleet with its agents)."""
    with Fleet(tmp_path_factory.mktemp("docs")) as f:
        yield f


class _Assets(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script" and a.get("src"):
            self.urls.append(a["src"] or "")
        if tag == "link" and a.get("href"):
            self.urls.append(a["href"] or "")
        if tag in ("img", "iframe") and a.get("src"):
            self.urls.append(a["src"] or "")


def test_docs_reference_only_same_origin_assets_and_each_is_served(web_fleet: Fleet) -> None:
    base = web_fleet.server.url
    page = httpx.get(f"{base}/docs", timeout=10)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "cdn." not in page.text and "https://" not in page.text, page.text
    parser = _Assets()
    parser.feed(page.text)
    assert len(parser.urls) >= 3, parser.urls  # the script, the style sheet and the icon
    kinds = set()
    for ref in parser.urls:
        url = urljoin(f"{base}/docs", ref)
        assert urlsplit(url).netloc == urlsplit(base).netloc, f"{ref} is not served by this server"
        asset = httpx.get(url, timeout=10)
        assert asset.status_code == 200, (ref, asset.status_code)
        suffix = "." + ref.rsplit(".", 1)[-1]
        assert asset.headers["content-type"].split(";")[0] in CONTENT_TYPES[suffix], (ref, asset.headers)
        assert len(asset.content) > 500, ref
        kinds.add(suffix)
    assert kinds == {".js", ".css", ".png"}
    # The OAuth2 redirect page Swagger UI may open is local too; ReDoc (CDN only) is off.
    redirect = httpx.get(f"{base}/docs/oauth2-redirect", timeout=10)
    assert redirect.status_code == 200 and "https://" not in redirect.text
    assert httpx.get(f"{base}/redoc", timeout=10).status_code == 404


def test_docs_render_the_operations_with_other_origins_blocked(web_fleet: Fleet, watched: Watched) -> None:
    page = watched.page
    origin = web_fleet.server.url
    blocked: list[str] = []

    def only_this_server(route: Any) -> None:
        url = route.request.url
        if url.startswith(f"{origin}/") or url.startswith("data:"):
            route.continue_()
        else:
            blocked.append(url)
            route.abort("internetdisconnected")

    page.context.route("**/*", only_this_server)
    page.goto(f"{origin}/docs")
    page.wait_for_selector(".swagger-ui .opblock-summary-path")
    paths = page.eval_on_selector_all(".opblock-summary-path", "els => els.map(e => e.dataset.path || e.textContent)")
    assert "/v1/tasks" in paths and "/v1/devices/{device_id}" in paths, paths
    assert page.inner_text(".swagger-ui .info .title").startswith("Orrery")
    # One operation opens and shows its parameters (the UI is live, not a static husk).
    page.click(".opblock-summary-path[data-path='/v1/devices/{device_id}']")
    page.wait_for_selector(".opblock.is-open .parameters-container")
    assert not blocked, f"/docs tried to reach other origins: {blocked}"
