"""REST access control: roles on every route, problem+json refusals, rate-limited failures, keys hashed."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import Fleet, shell


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("auth"), auth_failures_per_minute="5") as f:
        f.agent("auth-agent")
        yield f


def key(fleet: Fleet, role: str) -> str:
    with fleet.server.client() as c:
        r = c.post("/v1/api-keys", json={"role": role, "name": f"test {role}"})
        assert r.status_code == 201
        value: str = r.json()["key"]
        return value


def call(fleet: Fleet, method: str, path: str, token: str | None, **kw: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=fleet.server.url, timeout=30) as c:
        return c.request(method, path, headers=headers, **kw)


DAG = {"dag": {"nodes": [{"id": "a", "commands": [shell(["true"])]}]}}
ROUTES: list[tuple[str, str, dict[str, Any], str]] = [
    ("GET", "/v1/tasks", {}, "viewer"),
    ("GET", "/v1/devices", {}, "viewer"),
    ("POST", "/v1/tasks", {"json": DAG}, "operator"),
    ("POST", "/v1/devices/{device}/cordon", {}, "operator"),
    ("POST", "/v1/devices/{device}/uncordon", {}, "operator"),
    ("POST", "/v1/devices", {"json": {"name": "new-{role}"}}, "admin"),
    ("POST", "/v1/api-keys", {"json": {"role": "viewer"}}, "admin"),
]
ORDER = ["viewer", "operator", "admin"]


@pytest.mark.parametrize("role", ORDER)
@pytest.mark.parametrize(("method", "path", "kw", "needed"), ROUTES)
def test_every_route_admits_exactly_the_roles_at_or_above_its_own(
    fleet: Fleet, role: str, method: str, path: str, kw: dict[str, Any], needed: str
) -> None:
    device = fleet.agents[0].device_id
    path = path.format(device=device)
    kw = {
        k: (v if not isinstance(v, dict) or "name" not in v else {**v, "name": v["name"].format(role=role)})
        for k, v in kw.items()
    }
    r = call(fleet, method, path, key(fleet, role), **kw)
    if ORDER.index(role) >= ORDER.index(needed):
        assert r.status_code < 400, r.text
    else:
        assert r.status_code == 403
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["code"] == "forbidden"


def test_a_device_token_is_not_an_api_key(fleet: Fleet) -> None:
    r = call(fleet, "GET", "/v1/tasks", fleet.agents[0].token)
    assert r.status_code == 401 and r.json()["code"] == "unauthorized"


def test_a_viewer_cannot_enroll_a_device_and_nothing_is_stored(fleet: Fleet) -> None:
    before = len(call(fleet, "GET", "/v1/devices", key(fleet, "viewer")).json()["items"])
    r = call(fleet, "POST", "/v1/devices", key(fleet, "viewer"), json={"name": "sneaky"})
    assert r.status_code == 403
    assert len(call(fleet, "GET", "/v1/devices", key(fleet, "viewer")).json()["items"]) == before


def test_a_revoked_key_stops_working(fleet: Fleet) -> None:
    with fleet.server.client() as c:
        created = c.post("/v1/api-keys", json={"role": "operator"}).json()
        assert call(fleet, "GET", "/v1/tasks", created["key"]).status_code == 200
        assert c.delete(f"/v1/api-keys/{created['id']}").status_code == 200
    r = call(fleet, "GET", "/v1/tasks", created["key"])
    assert r.status_code == 401


def test_keys_and_tokens_are_stored_only_as_hashes(fleet: Fleet) -> None:
    secret = key(fleet, "viewer")
    db = sqlite3.connect(fleet.server.data_dir / "orrery.db")
    dump = "\n".join(db.iterdump())
    db.close()
    assert secret not in dump
    assert fleet.agents[0].token not in dump
    assert fleet.server.api_key not in dump


def test_failed_authentications_are_rate_limited_per_address_but_a_valid_key_still_gets_in(tmp_path: Path) -> None:
    """Guessing is cut off; a valid key from the same address is not locked out with it (a revoked
    key or agent token retrying behind a shared address must not deny service to everyone there)."""
    with Fleet(tmp_path, auth_failures_per_minute="3") as f:
        codes = [call(f, "GET", "/v1/tasks", "orrk_wrong").status_code for _ in range(5)]
        assert codes[:3] == [401, 401, 401]
        assert codes[3:] == [429, 429]
        limited = call(f, "GET", "/v1/tasks", "orrk_still_guessing")
        assert limited.status_code == 429 and limited.json()["code"] == "rate_limited"
        assert call(f, "GET", "/v1/tasks", f.server.api_key).status_code == 200


def test_a_key_can_ask_for_its_own_role_and_devices_show_both_halves_of_their_state(fleet: Fleet) -> None:
    me = call(fleet, "GET", "/v1/api-keys/me", key(fleet, "viewer")).json()
    assert me["role"] == "viewer" and me["id"].startswith("key_")
    device = call(fleet, "GET", f"/v1/devices/{fleet.agents[0].device_id}", key(fleet, "viewer")).json()
    assert (device["admin_state"], device["liveness"]) == ("active", "online")
