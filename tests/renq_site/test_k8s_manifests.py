"""The Kubernetes manifests, checked without a cluster: docker/k8s/worker-embedding.yaml against
the published apps/v1 Deployment schema and docker/keda-scaledobject.yaml against KEDA's own
CRDs (both vendored in docker/schemas/), and for what running renq needs: the Deployment KEDA
scales exists, runs the worker docker-compose.yml runs, and the metric KEDA reads is exported."""

from __future__ import annotations

import copy
import json
import re

import jsonschema
import pytest
import yaml

from .helpers import ROOT
from .test_compose import argv, compose, option

SCHEMAS = ROOT / "docker" / "schemas"
DEPLOYMENT_FILE = ROOT / "docker" / "k8s" / "worker-embedding.yaml"
KEDA_FILE = ROOT / "docker" / "keda-scaledobject.yaml"
DEPLOYMENT_SCHEMA = SCHEMAS / "deployment-apps-v1.json"
KEDA_CRDS = {
    "ScaledObject": SCHEMAS / "keda.sh_scaledobjects.yaml",
    "TriggerAuthentication": SCHEMAS / "keda.sh_triggerauthentications.yaml",
}


def deployment() -> dict:
    return yaml.safe_load(DEPLOYMENT_FILE.read_text())


def keda_documents() -> dict[str, dict]:
    """The KEDA file's documents by kind."""
    return {doc["kind"]: doc for doc in yaml.safe_load_all(KEDA_FILE.read_text())}


def deployment_errors(manifest: dict) -> list[str]:
    schema = json.loads(DEPLOYMENT_SCHEMA.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(manifest)]


def strict(schema: dict) -> dict:
    """A CRD's structural schema as the API server applies it with strict field validation
    (kubectl's default): an unknown field is refused unless the schema preserves unknown ones."""
    schema = copy.deepcopy(schema)
    nodes = [schema]
    while nodes:
        node = nodes.pop()
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            nodes.extend(node.values())
        elif isinstance(node, list):
            nodes.extend(node)
    return schema


def keda_errors(manifest: dict) -> list[str]:
    crd = yaml.safe_load(KEDA_CRDS[manifest["kind"]].read_text())
    assert crd["spec"]["names"]["kind"] == manifest["kind"]
    group, _, version = manifest["apiVersion"].partition("/")
    if group != crd["spec"]["group"]:
        return [f"apiVersion: group {group!r} is not {crd['spec']['group']!r}"]
    served = {v["name"]: v for v in crd["spec"]["versions"] if v["served"]}
    if version not in served:
        return [f"apiVersion: version {version!r} is not one of {sorted(served)}"]
    schema = strict(served[version]["schema"]["openAPIV3Schema"])
    validator = jsonschema.Draft7Validator(schema)
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(manifest)]


def test_the_deployment_matches_the_kubernetes_schema():
    assert deployment_errors(deployment()) == []


def test_the_keda_objects_match_kedas_crds():
    documents = keda_documents()
    assert set(documents) == set(KEDA_CRDS)
    for manifest in documents.values():
        assert keda_errors(manifest) == [], manifest["kind"]


def test_the_schema_checks_catch_mistakes():
    broken = deployment()
    container = broken["spec"]["template"]["spec"]["containers"][0]
    container["resource"] = container.pop("resources")  # a misspelt field
    broken["spec"]["replicas"] = "1"  # a string where an integer belongs
    assert len(deployment_errors(broken)) == 2

    documents = keda_documents()
    scaled = copy.deepcopy(documents["ScaledObject"])
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 1  # metadata values are strings
    scaled["spec"]["maxReplicas"] = 4  # not a field: maxReplicaCount
    assert len(keda_errors(scaled)) == 2
    scaled = copy.deepcopy(documents["ScaledObject"])
    scaled["apiVersion"] = "keda.sh/v1"
    assert keda_errors(scaled) != []
    auth = copy.deepcopy(documents["TriggerAuthentication"])
    del auth["spec"]["secretTargetRef"][0]["key"]
    assert len(keda_errors(auth)) == 1


def test_keda_scales_the_shipped_deployment_within_its_bounds():
    documents = keda_documents()
    scaled, auth = documents["ScaledObject"], documents["TriggerAuthentication"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment()["metadata"]["name"]
    # The CRD's own rule (CEL, not checked by the schema above).
    assert scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
    references = {t["authenticationRef"]["name"] for t in scaled["spec"]["triggers"]
                  if "authenticationRef" in t}  # fmt: skip
    assert references == {auth["metadata"]["name"]}
    # The broker URL comes from the Secret the workers load their environment from.
    secrets = {
        source["secretRef"]["name"]
        for source in deployment()["spec"]["template"]["spec"]["containers"][0]["envFrom"]
    }
    assert {ref["name"] for ref in auth["spec"]["secretTargetRef"]} <= secrets


def test_the_deployment_runs_the_compose_embedding_worker_on_one_gpu():
    pod = deployment()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = container["command"]
    assert args[:4] == ["celery", "-A", "renq_site", "worker"]
    assert option(args, "--concurrency") == "1"
    assert option(args, "--prefetch-multiplier") == "1"
    compose_worker = argv(compose()["services"]["worker-embedding"])
    assert option(args, "-Q") == option(compose_worker, "-Q")
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    worker_name = option(args, "-n").split("@")[0]
    for probe in ("startupProbe", "livenessProbe"):
        check = " ".join(container[probe]["exec"]["command"])
        assert f"renq_probe worker --name {worker_name}@$HOSTNAME" in check, probe


def test_the_manifests_hold_no_secret_values():
    for path in (DEPLOYMENT_FILE, KEDA_FILE):
        for document in yaml.safe_load_all(path.read_text()):
            assert document["kind"] != "Secret", path
    for variable in deployment()["spec"]["template"]["spec"]["containers"][0]["env"]:
        assert not re.search(r"SECRET|PASSWORD|_URL$|API_KEY", variable["name"]), variable


@pytest.mark.django_db
def test_the_prometheus_trigger_reads_a_metric_renq_exports(make_service):
    from django.test import Client
    from prometheus_client.parser import text_string_to_metric_families

    (trigger,) = [t for t in keda_documents()["ScaledObject"]["spec"]["triggers"]
                  if t["type"] == "prometheus"]  # fmt: skip
    metric, service = re.fullmatch(
        r'max\((renq_[a-z_]+)\{service="([a-z]+)"\}\)', trigger["metadata"]["query"]
    ).groups()
    make_service("embedding", name=service)
    exported = Client().get("/metrics").content.decode()
    labels = [
        sample.labels
        for family in text_string_to_metric_families(exported)
        for sample in family.samples
        if sample.name == metric
    ]
    assert {"service": service} in labels
