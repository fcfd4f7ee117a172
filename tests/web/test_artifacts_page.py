"""The task page's artifacts (issue 20), in a real browser against a real server and real agents:
the list appears when the publishing node ends, shows size, sha256, node and device, and a
Download streams the file to disk through a short-lived signed link, never the API key in a URL
(the `watching` fixture fails the test if the key shows up in any request URL)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import httpx

from tests.support import Fleet
from tests.web.conftest import Watched, shot
from tests.web.test_dashboard import api_key, sign_in


def test_the_task_page_lists_artifacts_live_and_downloads_one_through_a_signed_link(
    web_fleet: Fleet, watched: Watched, tmp_path: Path
) -> None:
    alpha, beta = web_fleet.agents
    data = os.urandom(3 * 1024 * 1024 + 7)
    digest = hashlib.sha256(data).hexdigest()
    (alpha.workspace / "site-report.tar").write_bytes(data)
    gate = alpha.workspace / "go-artifacts"
    gate.unlink(missing_ok=True)
    task = web_fleet.submit(
        {
            "nodes": [
                {
                    "id": "wait",
                    "placement": {"device": alpha.device_id},
                    "commands": [
                        {
                            "tool": "shell.run",
                            "arguments": {"argv": ["sh", "-c", f"until [ -e {gate.name} ]; do sleep 0.05; done"]},
                        }
                    ],
                },
                {
                    "id": "publish",
                    "placement": {"device": alpha.device_id},
                    "commands": [{"tool": "files.publish_artifact", "arguments": {"path": "site-report.tar"}}],
                },
                {
                    "id": "fetch",
                    "placement": {"device": beta.device_id},
                    "commands": [
                        {
                            "tool": "files.fetch_artifact",
                            "arguments": {"path": "in/site-report.tar", "name": "site-report.tar"},
                        }
                    ],
                },
            ],
            "edges": [{"from": "wait", "to": "publish"}, {"from": "publish", "to": "fetch"}],
        },
        name="collect the site report",
    )
    viewer = api_key(web_fleet, "viewer")  # looking and downloading need no more than a viewer key
    page = sign_in(watched, web_fleet, key=viewer["key"], hash_=f"#/tasks/{task['id']}")
    page.wait_for_selector("svg.dag g.node[data-node-id='wait'][data-state='running']")
    assert page.is_hidden("#task-artifacts")  # nothing published yet
    gate.touch()

    row = page.wait_for_selector(f"#artifacts-table tr[data-name='site-report.tar'][data-sha256='{digest}']")
    cells = [c.inner_text() for c in row.query_selector_all("td")]
    assert cells[0] == "site-report.tar" and cells[1] == "3.0 MiB"
    assert cells[2] == f"{digest[:16]}…" and row.query_selector(".artifact-sha").get_attribute("title") == digest
    assert cells[3] == "publish"
    page.wait_for_selector("#artifacts-table td:text-is('alpha')")  # the device's name, once known
    page.wait_for_selector("svg.dag g.node[data-node-id='fetch'][data-state='succeeded']")
    shot(page, "task-artifacts")

    with page.expect_download() as info:
        page.click("#artifacts-table button[data-download='site-report.tar']")
    download = info.value
    assert download.suggested_filename == "site-report.tar"
    saved = tmp_path / "downloaded.tar"
    download.save_as(str(saved))
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == digest
    assert "/artifact-links/" in download.url  # the signed link, scoped and short-lived
    assert viewer["key"] not in download.url and web_fleet.server.api_key not in download.url
    assert any(u.endswith("/artifacts/site-report.tar/link?version=1") for u in watched.urls)
    assert hashlib.sha256((beta.workspace / "in" / "site-report.tar").read_bytes()).hexdigest() == digest
    # Neither way to the bytes lets a browser render them on this origin: downloaded, never sniffed.
    with web_fleet.server.client(viewer["key"]) as c:
        by_key = c.get(f"/v1/tasks/{task['id']}/artifacts/site-report.tar/content", headers={"Range": "bytes=0-15"})
    by_link = httpx.get(download.url, headers={"Range": "bytes=0-15"}, timeout=10)
    for r in (by_key, by_link):
        assert r.status_code == 206 and r.headers["content-type"] == "application/octet-stream", r.headers
        assert r.headers["content-disposition"].startswith("attachment"), r.headers
        assert r.headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in r.headers["content-security-policy"].split("; ")
