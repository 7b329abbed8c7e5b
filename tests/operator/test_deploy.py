"""deploy/: every manifest parses, the operator's ClusterRole is exactly its least privilege,
and the images, ports and environment variable names are the ones the code reads."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import typer
import typer.main
import yaml
from pydantic import BaseModel

from diagnoser.api.health import router as health_router
from diagnoser.config import Settings
from diagnoser.operator.command import operator

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"

LEAST_PRIVILEGE = {
    ("", "nodes"): {"get", "list", "patch"},
    ("", "pods"): {"list", "delete"},
    ("batch", "jobs"): {"create", "get", "list", "delete"},
    ("kubeflow.org", "pytorchjobs"): {"get"},
    ("jobset.x-k8s.io", "jobsets"): {"get"},
}


def manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        with path.open() as handle:
            docs += [doc for doc in yaml.safe_load_all(handle) if doc is not None]
    return docs


def one(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} manifests"
    return found[0]


def container(deployment: str) -> dict[str, Any]:
    containers = one("Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    found: dict[str, Any] = containers[0]
    return found


def env(deployment: str) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container(deployment).get("env", [])}


def test_every_manifest_is_a_named_object_in_the_namespace() -> None:
    docs = manifests()
    assert {d["kind"] for d in docs} >= {
        "Namespace",
        "ServiceAccount",
        "PersistentVolumeClaim",
        "Deployment",
        "Service",
        "ClusterRole",
        "ClusterRoleBinding",
    }
    cluster_scoped = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
    for doc in docs:
        assert doc["apiVersion"]
        assert doc["metadata"]["name"]
        if doc["kind"] not in cluster_scoped:
            assert doc["metadata"]["namespace"] == "diagnoser", doc["metadata"]["name"]


def test_the_operator_cluster_role_is_exactly_least_privilege() -> None:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in one("ClusterRole", "diagnoser-operator")["rules"]:
        assert set(rule) == {"apiGroups", "resources", "verbs"}  # no resourceNames, no URLs
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == LEAST_PRIVILEGE
    binding = one("ClusterRoleBinding", "diagnoser-operator")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "diagnoser-operator",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "diagnoser-operator", "namespace": "diagnoser"}
    ]
    pod = one("Deployment", "diagnoser-operator")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "diagnoser-operator"
    service_pod = one("Deployment", "diagnoser")["spec"]["template"]["spec"]
    assert service_pod["serviceAccountName"] == "diagnoser"
    assert one("ServiceAccount", "diagnoser")["automountServiceAccountToken"] is False


def test_both_deployments_run_this_version_of_the_one_image() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert container("diagnoser")["image"] == f"diagnoser:{version}"
    assert container("diagnoser-operator")["image"] == f"diagnoser:{version}"
    assert container("diagnoser")["args"] == ["serve"]
    assert container("diagnoser-operator")["args"] == ["operator"]
    assert '".[operator]"' in (ROOT / "Dockerfile").read_text()  # the image has the client


def _is_setting(variable: str) -> bool:
    """DIAGNOSER_A__B names field b of group a of Settings."""
    assert variable.startswith("DIAGNOSER_")
    model: type[BaseModel] = Settings
    parts = variable.removeprefix("DIAGNOSER_").lower().split("__")
    for index, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return False
        annotation = field.annotation
        if index < len(parts) - 1:
            if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                return False
            model = annotation
    return True


def test_service_env_port_probes_and_mounts_match_the_code() -> None:
    variables = env("diagnoser")
    unknown = [name for name in variables if not _is_setting(name)]
    assert unknown == []
    port = int(variables["DIAGNOSER_PORT"]["value"])
    box = container("diagnoser")
    assert box["ports"] == [{"name": "http", "containerPort": port}]
    routes = {getattr(route, "path", None) for route in health_router.routes}
    assert box["readinessProbe"]["httpGet"]["path"] in routes
    assert box["livenessProbe"]["httpGet"]["path"] in routes
    mounts = {m["name"]: m["mountPath"] for m in box["volumeMounts"]}
    assert mounts["data"] == variables["DIAGNOSER_DATA_DIR"]["value"]
    assert mounts["rules"] == variables["DIAGNOSER_RULES_DIR"]["value"]
    service = one("Service", "diagnoser")
    assert service["spec"]["ports"] == [{"name": "http", "port": port, "targetPort": "http"}]


def operator_envvars() -> set[str]:
    app = typer.Typer()
    app.command("operator")(operator)
    command = typer.main.get_command(app)  # one command: the command itself
    names: set[str] = set()
    for param in command.params:
        envvar = getattr(param, "envvar", None)
        if isinstance(envvar, str):
            names.add(envvar)
    return names


def test_operator_env_names_are_options_of_the_command() -> None:
    variables = env("diagnoser-operator")
    assert set(variables) <= operator_envvars()
    assert variables["DIAGNOSER_OPERATOR_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.name"
    )
    assert variables["DIAGNOSER_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    server = urlsplit(variables["DIAGNOSER_OPERATOR_SERVER"]["value"])
    service = one("Service", "diagnoser")
    assert server.hostname == f"{service['metadata']['name']}.diagnoser.svc"
    assert server.port == service["spec"]["ports"][0]["port"]
