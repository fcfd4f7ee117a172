"""The dashboard's task page for a fan-out node (issue 20), in a real browser against a real
server and real agents: the node drawn as a stack with its progress, kept live by `node.child`
events while its children run, and its panel listing each child (state, device, attempts, its
verify attempt, output) with a filter by state."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import Fleet, shell
from tests.web.conftest import shot, watching
from tests.web.test_dashboard import node_sel, sign_in

WEB = {"role": "web"}


@pytest.fixture(scope="module")
def web_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("web-fanout"), heartbeat_interval_s="1") as f:
        for name in ("web-1", "web-2", "web-3"):
            f.agent(name, WEB)
        yield f


def test_a_fan_out_node_shows_its_children_live_and_in_its_panel(web_fleet: Fleet, browser: Any) -> None:
    gate = web_fleet.agents[2].workspace / "go"
    dag = {
        "nodes": [
            {
                "id": "rollout",
                "for_each": {"labels": WEB, "max_parallel": 3},
                "commands": [
                    shell(["sh", "-c", "while [ ! -f go ]; do sleep 0.05; done; echo deployed > release.txt"])
                ],
                "verify": [{"tool": "files.read", "arguments": {"path": "release.txt"}}],
            }
        ]
    }
    for agent in web_fleet.agents[:2]:
        (agent.workspace / "go").write_text("")  # web-1 and web-2 go at once; web-3 waits for its gate
    task = web_fleet.submit(dag)
    with watching(browser, web_fleet) as watched:
        page = sign_in(watched, web_fleet, hash_=f"#/tasks/{task['id']}")
        page.wait_for_selector(node_sel("rollout", "running"))
        assert page.query_selector(f"{node_sel('rollout')} rect.node-stack") is not None
        page.wait_for_selector(f"{node_sel('rollout')} .node-run:text('2/3 done')")
        page.click(node_sel("rollout"))
        page.wait_for_selector("#node-panel[data-node-id=rollout] #children-list")
        page.wait_for_selector("#children-list .child-row[data-device=web-3][data-state=running]")
        shot(page, "task-fan-out-running", "dashboard-fan-out.png")

        gate.write_text("")
        page.wait_for_selector(f"{node_sel('rollout', 'succeeded')}")
        page.wait_for_selector(f"{node_sel('rollout')} .node-run:text('3/3 done')")
        page.wait_for_selector("#children-list .child-row[data-device=web-3][data-state=succeeded]")
        page.click("#children-list .child-row[data-device=web-2]")
        detail = page.inner_text("#children-list")
        assert "#1 verify" in detail and "files.read" in detail
        assert "deployed" in detail  # the verify command read what the command wrote
        page.click(".child-filter button[data-filter=succeeded]")
        assert page.eval_on_selector_all("#children-list .child-row", "rs => rs.length") == 3
        assert "Fan-out" in page.inner_text("#node-panel .facts")
        assert "verify (1)" in page.inner_text("#node-panel").lower()
