"""deploy/k8s: the manifests parse and hold the objects deploy/README.md tells you to apply."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from device_agent.config import AgentConfig
from orchestrator.config import Settings
from tests.deploy.compose_env import ROOT

K8S = ROOT / "deploy" / "k8s"
NAMESPACE = "orrery"
UVICORN_ENV = {"FORWARDED_ALLOW_IPS"}


def documents() -> list[tuple[Path, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [(path, d) for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def objects(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in documents() if d["kind"] == kind}


def known_settings() -> set[str]:
    return {f"ORRERY_{n.upper()}" for n in Settings.model_fields} | {
        f"ORRERY_AGENT_{n.upper()}" for n in AgentConfig.model_fields
    }


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result


def test_every_manifest_parses_and_has_the_expected_kinds() -> None:
    kinds = sorted(d["kind"] for _, d in documents())
    assert kinds == sorted(
        [
            "ConfigMap",
            "Deployment",
            "Deployment",
            "Job",
            "Namespace",
            "PersistentVolumeClaim",
            "PodDisruptionBudget",
            "Secret",
            "Service",
        ]
    )
    for path, doc in documents():
        assert {"apiVersion", "kind", "metadata"} <= set(doc), path.name


def test_everything_lives_in_the_orrery_namespace() -> None:
    assert set(objects("Namespace")) == {NAMESPACE}
    for path, doc in documents():
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{path.name}: {doc['kind']}"


def test_orchestrator_deployment_runs_three_replicas_without_migrating() -> None:
    deployment = objects("Deployment")["orrery-orchestrator"]
    assert deployment["spec"]["replicas"] == 3
    c = container(deployment)
    assert c["args"] == ["serve", "--host", "0.0.0.0", "--no-migrate"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert [p["containerPort"] for p in c["ports"]] == [8765]
    refs = {next(iter(v.values()))["name"] for v in c["envFrom"]}
    assert refs == {"orrery-config", "orrery-secrets"}


def test_selectors_match_their_pods() -> None:
    pods = objects("Deployment")["orrery-orchestrator"]["spec"]["template"]["metadata"]["labels"]
    for selector in (
        objects("Service")["orrery-orchestrator"]["spec"]["selector"],
        objects("PodDisruptionBudget")["orrery-orchestrator"]["spec"]["selector"]["matchLabels"],
        objects("Deployment")["orrery-orchestrator"]["spec"]["selector"]["matchLabels"],
    ):
        assert selector.items() <= pods.items()
    agent = objects("Deployment")["orrery-agent"]
    assert agent["spec"]["selector"]["matchLabels"].items() <= agent["spec"]["template"]["metadata"]["labels"].items()
    assert not (agent["spec"]["selector"]["matchLabels"].items() <= pods.items()), "the Service would reach the agent"


def test_service_exposes_the_named_container_port() -> None:
    (port,) = objects("Service")["orrery-orchestrator"]["spec"]["ports"]
    assert port["port"] == 8765
    assert port["targetPort"] == "http"


def test_migration_job_runs_orrery_migrate_with_the_database_url() -> None:
    job = objects("Job")["orrery-migrate"]
    c = container(job)
    assert c["args"] == ["migrate"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] in ("OnFailure", "Never")
    assert "ORRERY_DATABASE_URL" in objects("Secret")["orrery-secrets"]["stringData"]
    assert {"secretRef": {"name": "orrery-secrets"}} in c["envFrom"]


def test_sample_agent_keeps_its_identity_on_a_volume() -> None:
    agent = objects("Deployment")["orrery-agent"]
    assert agent["spec"]["replicas"] == 1
    assert agent["spec"]["strategy"]["type"] == "Recreate"
    c = container(agent)
    assert c["command"] == ["orrery-agent-entrypoint"]
    env = {e["name"]: e for e in c["env"]}
    assert env["ORRERY_AGENT_SERVER"]["value"] == "http://orrery-orchestrator:8765"
    assert env["ORRERY_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "orrery-secrets"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in agent["spec"]["template"]["spec"]["volumes"]}
    claim = volumes[mounts["/var/lib/orrery-agent"]]["persistentVolumeClaim"]["claimName"]
    assert claim in objects("PersistentVolumeClaim")


@pytest.mark.parametrize("kind", ["ConfigMap", "Secret"])
def test_configuration_names_only_real_settings(kind: str) -> None:
    for obj in objects(kind).values():
        keys = set(obj.get("data", {})) | set(obj.get("stringData", {}))
        assert keys - known_settings() - UVICORN_ENV == set(), obj["metadata"]["name"]


def test_secrets_are_in_the_secret_not_the_configmap() -> None:
    config = objects("ConfigMap")["orrery-config"]["data"]
    secret = objects("Secret")["orrery-secrets"]["stringData"]
    for name in ("ORRERY_SECRET_KEY", "ORRERY_ADMIN_KEY", "ORRERY_DATABASE_URL"):
        assert name in secret and name not in config


def test_pods_run_as_non_root_without_privilege() -> None:
    workloads = [*objects("Deployment").values(), *objects("Job").values()]
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        c = container(workload)
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        server_image = container(objects("Deployment")["orrery-orchestrator"])["image"]
        if workload["metadata"]["name"] == "orrery-agent":  # the device-only image, same version
            assert c["image"] == server_image.replace("orrery:", "orrery-agent:", 1)
        else:
            assert c["image"] == server_image


# The Kubernetes versions the manifests are checked against: the oldest still in wide use and the
# newest whose OpenAPI schemas the `kubernetes-validate` package ships (no network needed).
K8S_VERSIONS = ["1.28.0", "1.37.0"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_openapi_schemas(version: str) -> None:
    import kubernetes_validate

    for path, doc in documents():
        try:  # strict: a field the API does not know (a typo it would drop or refuse) fails too
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.name}: {doc['kind']} {doc['metadata']['name']}: {exc}")


def test_the_schema_check_refuses_what_the_api_server_would() -> None:
    """The check above can fail: a wrong type, a missing required field and an unknown field."""
    import copy

    import kubernetes_validate

    deployment = objects("Deployment")["orrery-orchestrator"]
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "three"
    missing = copy.deepcopy(deployment)
    del container(missing)["name"]
    unknown = copy.deepcopy(deployment)
    container(unknown)["imagePullPolicyy"] = "Always"
    for doc in (wrong_type, missing, unknown):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)
