"""The walking skeleton end to end: real server, real agents, a DAG across two devices."""

from __future__ import annotations

from pathlib import Path

from tests.support import fleet, shell


def test_a_three_node_dag_across_two_agents_passes_data_and_succeeds(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        a = f.agent("alpha", {"role": "producer"})
        b = f.agent("beta", {"role": "consumer"})
        dag = {
            "nodes": [
                {"id": "produce", "placement": {"device": "alpha"}, "commands": [shell(["echo", "hello from alpha"])]},
                {
                    "id": "store",
                    "placement": {"labels": {"role": "consumer"}},
                    "commands": [
                        {
                            "tool": "files.write",
                            "arguments": {"path": "got.txt", "content": "${nodes.produce.output.stdout}"},
                        },
                        {"tool": "files.read", "arguments": {"path": "got.txt"}},
                    ],
                },
                {"id": "count", "placement": {"device": b.device_id}, "commands": [shell(["wc", "-c", "got.txt"])]},
            ],
            "edges": [{"from": "produce", "to": "store"}, {"from": "store", "to": "count"}],
        }
        task = f.submit(dag)
        assert task["state"] == "running"
        done = f.wait_task(task["id"])
        assert done["state"] == "succeeded", done
        produce, store, count = (f.node(done, n) for n in ("produce", "store", "count"))
        assert produce["output"]["stdout"] == "hello from alpha\n"
        assert produce["attempts"][0]["device_id"] == a.device_id
        assert store["output"]["content"] == "hello from alpha\n"
        assert store["attempts"][0]["device_id"] == b.device_id
        assert count["output"]["stdout"].split()[0] == str(len("hello from alpha\n"))
        assert (b.workspace / "got.txt").read_text() == "hello from alpha\n"
        assert all(n["state"] == "succeeded" and n["finished_at"] for n in done["nodes"])


def test_a_failed_command_skips_the_rest_of_the_batch_and_the_dependents(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        f.agent("solo")
        dag = {
            "nodes": [
                {"id": "a", "commands": [shell(["false"]), shell(["echo", "never"])]},
                {"id": "b", "commands": [shell(["echo", "b"])]},
            ],
            "edges": [{"from": "a", "to": "b"}],
        }
        done = f.wait_task(f.submit(dag)["id"])
        assert done["state"] == "failed"
        a, b = f.node(done, "a"), f.node(done, "b")
        assert a["state"] == "failed" and a["error"]["code"] == "tool_error"
        statuses = [r["status"] for r in a["attempts"][0]["results"]]
        assert statuses == ["failure", "skipped"]
        assert a["attempts"][0]["results"][0]["result"]["exit_code"] == 1
        assert b["state"] == "skipped"


def test_a_command_past_its_timeout_s_fails_with_timeout_and_its_process_is_killed(tmp_path: Path) -> None:
    with fleet(tmp_path) as f:
        a = f.agent("ticker")
        cmd = {"tool": "shell.run", "arguments": {"argv": ["sh", "-c", "echo $$ > pid; sleep 60"]}, "timeout_s": 1}
        done = f.wait_task(f.submit({"nodes": [{"id": "n", "commands": [cmd]}]})["id"], timeout=60)
        node = f.node(done, "n")
        assert node["state"] == "failed"
        assert node["error"]["code"] == "timeout"
        pid = int((a.workspace / "pid").read_text())
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or ") Z " in stat.read_text()
