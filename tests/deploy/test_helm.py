"""The Helm chart: rendered offline by helm-python-sdk (Helm's own Go engine, no helm binary), linted, and
every manifest validated against the pinned Kubernetes version's OpenAPI schemas by kubernetes-validate.

Each value set under helm/htmllm/ci/ is rendered: default (CPU), GPU, everything optional switched on, and
an init-container checkpoint. The chart's own rules (probes, grace period, security context, GPU request,
API key from a Secret) are checked on the rendered objects, not on template text.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml

from service.api.api_keys import ApiKeys
from service.api.settings import Settings
from service.engine.runners import torch as torch_runner
from tests.deploy.dockerfile_rules import final_stage_user

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "htmllm"
# The oldest Kubernetes minor still widely run by managed offerings when this chart was written; the chart
# uses only APIs stable there (apps/v1, autoscaling/v2, policy/v1).
KUBE_VERSION = "1.30.0"
RELEASE = "crawl"
NAMESPACE = "crawlers"

VALUE_SETS = ["default", "gpu", "full", "init"]
Manifest = dict[str, Any]


def values_for(name: str) -> dict[str, Any]:
    if name == "default":
        return {}
    loaded = yaml.safe_load((CHART / "ci" / f"{name}-values.yaml").read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def render_text(values: dict[str, Any], chart_dir: Path = CHART) -> dict[str, str]:
    """Each template's rendered text, by path."""
    with helm.Chart.load(chart_dir) as chart:
        rendered: dict[str, str] = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return rendered


def render(values: dict[str, Any], chart_dir: Path = CHART) -> list[Manifest]:
    """Every object the chart renders with `values`, NOTES.txt excluded."""
    rendered = render_text(values, chart_dir)
    objects: list[Manifest] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


@pytest.fixture(scope="module", params=VALUE_SETS)
def value_set(request: pytest.FixtureRequest) -> tuple[str, list[Manifest]]:
    return request.param, render(values_for(request.param))


def one(objects: list[Manifest], kind: str) -> Manifest:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def kinds(objects: list[Manifest]) -> set[str]:
    return {o["kind"] for o in objects}


def pod_spec(objects: list[Manifest]) -> Manifest:
    spec = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec


def server_container(objects: list[Manifest]) -> Manifest:
    containers = pod_spec(objects)["containers"]
    (server,) = [c for c in containers if c["name"] == "server"]
    assert isinstance(server, dict)
    return server


def env_of(container: Manifest) -> dict[str, Manifest]:
    return {e["name"]: e for e in container.get("env", [])}


def configmap_data(objects: list[Manifest]) -> dict[str, str]:
    data = one(objects, "ConfigMap")["data"]
    assert isinstance(data, dict)
    return data


# monitoring.coreos.com/v1's Duration (units in order, each at most once: 1m30s, not 30s1m).
PROMETHEUS_DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
# A structural schema for the prometheus-operator ServiceMonitor fields the chart sets. It is a CRD, so
# kubernetes-validate has no schema for it; this subset follows monitoring.coreos.com/v1's OpenAPI schema.
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "properties": {
                        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}
                    },
                },
                "namespaceSelector": {
                    "type": "object",
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": {"type": "string", "pattern": PROMETHEUS_DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": PROMETHEUS_DURATION},
                        },
                    },
                },
            },
        },
    },
}
CRD_SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR_SCHEMA}


def validate_manifest(obj: Manifest) -> None:
    """Kubernetes' own schema (strict: unknown fields fail) or, for the CRDs we emit, our structural one."""
    key = (obj["apiVersion"], obj["kind"])
    if key in CRD_SCHEMAS:
        jsonschema.validate(obj, CRD_SCHEMAS[key])
        return
    kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint_is_clean(name: str) -> None:
    report = helm.lint(CHART, values_for(name), strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); warnings and errors fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_every_manifest_validates(value_set: tuple[str, list[Manifest]]) -> None:
    _, objects = value_set
    assert objects
    for obj in objects:
        try:
            validate_manifest(obj)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            pytest.fail(exc.message)


def test_the_validator_rejects_a_broken_manifest() -> None:
    """The validation above can fail: a typo'd field and a wrong type are both caught."""
    deployment = one(render({}), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_manifest(deployment)
    deployment = one(render({}), "Deployment")
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "fifty"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_manifest(deployment)


def test_default_release_objects() -> None:
    objects = render({})
    assert kinds(objects) == {
        "ConfigMap",
        "Deployment",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Pod",  # the `helm test` hook
        "Service",
        "ServiceAccount",
    }
    assert all(o["metadata"]["name"].startswith(f"{RELEASE}-htmllm") for o in objects)


def test_the_readme_warns_of_the_release_names_that_collide() -> None:
    """The full name drops the chart name when the release's contains it, so `crawl` and `crawl-htmllm`
    name every object alike; the rule stays (changing it would rename installed releases), the README
    says so and how to avoid it."""

    def names(release: str, values: dict[str, Any]) -> set[str]:
        with helm.Chart.load(CHART) as chart:
            rendered = chart.render(values, name=release, namespace=NAMESPACE, is_install=True)
        return {
            doc["metadata"]["name"]
            for path, text in rendered.items()
            if not path.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text)
            if doc
        }

    assert names("crawl", {}) == names("crawl-htmllm", {})
    assert names("crawl", {}).isdisjoint(names("crawl-htmllm", {"fullnameOverride": "crawl-embedder"}))
    readme = " ".join((ROOT / "helm" / "README.md").read_text(encoding="utf-8").split())
    assert "releases `crawl` and `crawl-htmllm` in one namespace both name every object" in readme
    assert "`fullnameOverride`" in readme and "second install fails" in readme


def test_full_release_objects() -> None:
    objects = render(values_for("full"))
    assert {"ServiceMonitor", "PersistentVolumeClaim"} <= kinds(objects)
    assert "Secret" not in kinds(objects)  # the key comes from the existing Secret


def test_selectors_match_the_pods(value_set: tuple[str, list[Manifest]]) -> None:
    _, objects = value_set
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    selectors = [one(objects, "Service")["spec"]["selector"]]
    selectors.append(one(objects, "Deployment")["spec"]["selector"]["matchLabels"])
    if "PodDisruptionBudget" in kinds(objects):
        selectors.append(one(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"])
    if "ServiceMonitor" in kinds(objects):
        monitor = one(objects, "ServiceMonitor")
        service = one(objects, "Service")
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        port_names = {p["name"] for p in service["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= port_names
    for selector in selectors:
        assert selector and selector.items() <= pod_labels.items()
    # The `helm test` pod is none of the servers: no selector (PDB, spread, Service) counts it.
    test_pods = [o for o in objects if o["kind"] == "Pod"]
    assert test_pods
    for pod in test_pods:
        for selector in selectors:
            assert not selector.items() <= pod["metadata"]["labels"].items()


def test_probes_hit_health_and_ready(value_set: tuple[str, list[Manifest]]) -> None:
    _, objects = value_set
    server = server_container(objects)
    assert server["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert server["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert server["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert server["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert set(server["resources"]) == {"requests", "limits"}


def test_grace_period_outlasts_the_drain(value_set: tuple[str, list[Manifest]]) -> None:
    name, objects = value_set
    merged = helm.Chart.load(CHART).merge_values(values_for(name))
    drain = int(configmap_data(objects)["HTMLLM_DRAIN_TIMEOUT_S"])
    assert drain == merged["server"]["drainTimeoutSeconds"]
    pre_stop = server_container(objects)["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    grace = pod_spec(objects)["terminationGracePeriodSeconds"]
    assert grace > drain + int(pre_stop[1])


def test_a_grace_period_shorter_than_the_drain_is_refused() -> None:
    with pytest.raises(helm.HelmRenderError, match="terminationGracePeriodSeconds"):
        render({"terminationGracePeriodSeconds": 30, "server": {"drainTimeoutSeconds": 30}})


def test_an_inflight_budget_below_the_body_cap_is_refused() -> None:
    """The server would refuse to start (HTMLLM_MAX_INFLIGHT_BYTES below HTMLLM_MAX_BODY_BYTES)."""
    with pytest.raises(helm.HelmRenderError, match=r"maxInflightBytes \(16777216\) must be at least"):
        render({"server": {"maxBodyBytes": 33554432, "maxInflightBytes": 16777216}})
    render({"server": {"maxBodyBytes": 33554432, "maxInflightBytes": 33554432}})


def test_pod_runs_unprivileged_with_a_read_only_root(value_set: tuple[str, list[Manifest]]) -> None:
    _, objects = value_set
    pod = pod_spec(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True
    # The chart's uid is the image's USER, so files the image owns stay readable.
    uid, gid = final_stage_user("cpu")
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (uid, gid)
    assert pod["automountServiceAccountToken"] is False
    for container in pod["containers"] + pod.get("initContainers", []):
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts["/tmp"] == "tmp"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["tmp"]
    assert env_of(server_container(objects))["HOME"]["value"] == "/tmp"


def test_gpu_values_request_a_gpu() -> None:
    objects = render(values_for("gpu"))
    server = server_container(objects)
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert server["resources"]["requests"]["nvidia.com/gpu"] == 1
    assert server["image"].endswith("-cuda")
    assert configmap_data(objects)["HTMLLM_DEVICE"] == "cuda"
    pod = pod_spec(objects)
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


def test_cpu_values_request_no_gpu() -> None:
    objects = render({})
    server = server_container(objects)
    for section in server["resources"].values():
        assert not any("gpu" in key for key in section)
    assert not server["image"].endswith("-cuda")
    assert configmap_data(objects)["HTMLLM_DEVICE"] == "cpu"
    assert "tolerations" not in pod_spec(objects)


def test_configmap_carries_only_htmllm_settings(value_set: tuple[str, list[Manifest]]) -> None:
    name, objects = value_set
    data = configmap_data(objects)
    assert all(key.startswith("HTMLLM_") for key in data)
    assert "HTMLLM_API_KEY" not in data
    # Each variable is a field of the service's Settings (a misspelt one would be silently ignored).
    fields = set(Settings.model_fields)
    assert [key for key in data if key.removeprefix("HTMLLM_").lower() not in fields] == []
    assert data["HTMLLM_PORT"] == str(server_container(objects)["ports"][0]["containerPort"])
    merged = helm.Chart.load(CHART).merge_values(values_for(name))
    assert data["HTMLLM_MAX_BATCH_TOKENS"] == str(merged["server"]["maxBatchTokens"])
    assert data["HTMLLM_MAX_QUEUE_DOCUMENTS"] == str(merged["server"]["maxQueueDocuments"])
    server = server_container(objects)
    assert {"configMapRef": {"name": one(objects, "ConfigMap")["metadata"]["name"]}} in server["envFrom"]


def test_preprocess_workers_follow_the_cpu_budget_unless_set() -> None:
    """By default the chart leaves the worker count to the server, which sizes it from the CPU budget
    (the threads the chart passes from the CPU request); a fixed 2 ran two pruning workers on 1 CPU."""
    assert "HTMLLM_PREPROCESS_WORKERS" not in configmap_data(render({}))
    one_cpu = {"resources": {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "6Gi"}}}
    objects = render(one_cpu)
    data = configmap_data(objects)
    assert "HTMLLM_PREPROCESS_WORKERS" not in data
    # What the kubelet puts in the variable: the CPU request, rounded up (divisor 1).
    threads = env_of(server_container(objects))["HTMLLM_INTRA_OP_THREADS"]["valueFrom"]["resourceFieldRef"]
    assert (threads["resource"], threads["divisor"]) == ("requests.cpu", "1")
    fields = {k.removeprefix("HTMLLM_").lower(): v for k, v in data.items() if k != "HTMLLM_MODEL_PATH"}
    settings = Settings(**fields, intra_op_threads=1)
    assert (settings.preprocess_workers, settings.extract_workers) == (1, 1)
    assert configmap_data(render({"server": {"preprocessWorkers": 3}}))["HTMLLM_PREPROCESS_WORKERS"] == "3"


def test_config_changes_roll_the_pods() -> None:
    """Env vars are read once, at start: the pod template names the ConfigMap, whose name follows its data
    (tests/deploy/test_helm_configmap.py), so new settings are a new pod template."""

    def template(values: dict[str, Any]) -> Manifest:
        template = one(render(values), "Deployment")["spec"]["template"]
        assert isinstance(template, dict)
        return template

    assert template({}) != template({"server": {"maxBatchTokens": 8192}})
    assert template({}) == template({})


def mounted_key_file(objects: list[Manifest]) -> tuple[str, str, str]:
    """(path, Secret name, key) of the API key file as the kubelet mounts it: the server's
    HTMLLM_API_KEY_FILE must be that path, the Secret mounted whole (a subPath never sees updates)."""
    server = server_container(objects)
    path = env_of(server)["HTMLLM_API_KEY_FILE"]["value"]
    pod = pod_spec(objects)
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    (mount,) = [m for m in server["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True and "subPath" not in mount
    (item,) = volume["secret"]["items"]
    assert path == f"{mount['mountPath']}/{item['path']}"
    return path, volume["secret"]["secretName"], item["key"]


def test_api_keys_come_from_an_existing_secret_as_a_file() -> None:
    objects = render(values_for("full"))
    assert mounted_key_file(objects)[1:] == ("htmllm-api-key", "token")
    assert "HTMLLM_API_KEY" not in env_of(server_container(objects))  # read once: could not rotate


def test_api_key_secret_created_from_a_value() -> None:
    objects = render(values_for("init"))
    secret = one(objects, "Secret")
    _, name, key = mounted_key_file(objects)
    assert name == secret["metadata"]["name"]
    assert base64.b64decode(secret["data"][key]).decode() == "not-a-real-key"


def test_the_server_accepts_the_keys_of_the_mounted_secret(tmp_path: Path) -> None:
    """The Secret's value as the kubelet writes it into the pod, read the way the server reads it."""
    values = {**values_for("init"), "auth": {"enabled": True, "apiKey": "new-key\nold-key\n"}}
    objects = render(values)
    path, _, key = mounted_key_file(objects)
    mounted = tmp_path / path.lstrip("/")
    mounted.parent.mkdir(parents=True)
    mounted.write_bytes(base64.b64decode(one(objects, "Secret")["data"][key]))
    settings = settings_of(objects)
    assert settings.api_key is None and str(settings.api_key_file) == path
    keys = ApiKeys(settings.api_key, mounted)
    assert keys.accepts("new-key") and keys.accepts("old-key") and not keys.accepts("new-key\nold-key")


def test_auth_without_a_key_is_refused() -> None:
    with pytest.raises(helm.HelmRenderError, match=r"auth\.enabled"):
        render({"auth": {"enabled": True}})


def test_no_auth_no_key_env() -> None:
    objects = render({})
    assert not {"HTMLLM_API_KEY", "HTMLLM_API_KEY_FILE"} & set(env_of(server_container(objects)))
    assert not [v for v in pod_spec(objects)["volumes"] if "secret" in v]


def test_hpa_scales_on_cpu_and_optionally_queue_size() -> None:
    default = one(render({}), "HorizontalPodAutoscaler")["spec"]
    assert [m["type"] for m in default["metrics"]] == ["Resource"]
    assert default["metrics"][0]["resource"]["name"] == "cpu"
    gpu = one(render(values_for("gpu")), "HorizontalPodAutoscaler")["spec"]
    (queue,) = [m for m in gpu["metrics"] if m["type"] == "Pods"]
    assert queue["pods"]["metric"]["name"] == "htmllm_queue_size"
    assert queue["pods"]["target"] == {"type": "AverageValue", "averageValue": "256"}
    fixed = render(values_for("init"))
    assert "HorizontalPodAutoscaler" not in kinds(fixed)
    assert one(fixed, "Deployment")["spec"]["replicas"] == 3
    assert "replicas" not in one(render({}), "Deployment")["spec"]  # the HPA owns it


def test_custom_checkpoint_on_a_pvc() -> None:
    objects = render(values_for("full"))
    claim = one(objects, "PersistentVolumeClaim")
    pod = pod_spec(objects)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"] == {
        "claimName": claim["metadata"]["name"],
        "readOnly": True,
    }
    mounts = {m["name"]: m for m in server_container(objects)["volumeMounts"]}
    assert mounts["model"] == {"name": "model", "mountPath": "/models", "readOnly": True}
    assert configmap_data(objects)["HTMLLM_MODEL_PATH"] == "/models/checkpoints/html-base"


def test_custom_checkpoint_from_an_init_container() -> None:
    objects = render(values_for("init"))
    pod = pod_spec(objects)
    (init,) = pod["initContainers"]
    assert init["image"] == "registry.example.com/tools/checkpoint-fetcher:1.4"
    assert env_of(init)["HTMLLM_MODEL_PATH"]["value"] == "/models/html-small"
    assert {"name": "model", "mountPath": "/models"} in init["volumeMounts"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["model"]
    assert configmap_data(objects)["HTMLLM_MODEL_PATH"] == "/models/html-small"


def test_bundled_model_mounts_nothing() -> None:
    objects = render({})
    assert "HTMLLM_MODEL_PATH" not in configmap_data(objects)
    assert "model" not in {m["name"] for m in server_container(objects)["volumeMounts"]}


def test_schema_rejects_misspelt_values() -> None:
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values_for("full"))
        with pytest.raises(helm.HelmValuesError, match="maxBatchTokenz"):
            chart.validate_schema({"server": {"maxBatchTokenz": 1}})
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema({"model": {"source": "s3"}})


def test_values_are_documented() -> None:
    """Every top-level key of values.yaml is typed in values.schema.json and has a comment above it."""
    text = (CHART / "values.yaml").read_text(encoding="utf-8")
    values = yaml.safe_load(text)
    with helm.Chart.load(CHART) as chart:
        schema = chart.schema
    assert schema is not None
    assert set(values) <= set(schema["properties"])
    undocumented = [key for key in values if not _commented(text, key)]
    assert undocumented == []


def _commented(text: str, key: str) -> bool:
    """Whether the top-level `key:` line is preceded by a comment (directly or through sibling keys)."""
    lines = text.splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith(f"{key}:"))
    for line in reversed(lines[:index]):
        if line.startswith("#"):
            return True
        if not line.strip():
            return False
        if not _is_top_level_key(line):
            return False
    return False


def _is_top_level_key(line: str) -> bool:
    return bool(line) and not line[0].isspace() and ":" in line


def iter_value_files() -> Iterator[Path]:
    yield from sorted((CHART / "ci").glob("*-values.yaml"))


def test_every_ci_value_file_is_rendered() -> None:
    assert {p.name.removesuffix("-values.yaml") for p in iter_value_files()} == set(VALUE_SETS) - {"default"}


REQUEST_THREADS = {
    "name": "HTMLLM_INTRA_OP_THREADS",
    "valueFrom": {
        "resourceFieldRef": {"containerName": "server", "resource": "requests.cpu", "divisor": "1"}
    },
}


def test_threads_follow_the_cpu_request_when_no_limit_bounds_them() -> None:
    # Default values: a CPU request and no CPU limit; the cgroup says nothing, so the request does.
    server = server_container(render({}))
    assert env_of(server)["HTMLLM_INTRA_OP_THREADS"] == REQUEST_THREADS
    assert server["resources"]["requests"]["cpu"] == "2" and "cpu" not in server["resources"]["limits"]


@pytest.mark.parametrize(
    "values",
    [
        {
            "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "3"}}
        },  # the server reads the limit itself
        # No request (null removes the default): nothing to go by (and no HPA, which would need one).
        {"resources": {"requests": {"cpu": None}}, "autoscaling": {"enabled": False}},
        {"extraEnv": [{"name": "OMP_NUM_THREADS", "value": "2"}]},
        {"extraSettings": {"HTMLLM_INTRA_OP_THREADS": "4"}},
    ],
)
def test_threads_are_not_injected_where_the_values_already_decide(values: dict[str, Any]) -> None:
    objects = render(values)
    assert "HTMLLM_INTRA_OP_THREADS" not in env_of(server_container(objects))
    for manifest in objects:
        validate_manifest(manifest)


def test_threads_set_in_the_values_go_to_the_configmap() -> None:
    objects = render({"server": {"intraOpThreads": 6}})
    assert configmap_data(objects)["HTMLLM_INTRA_OP_THREADS"] == "6"
    assert "HTMLLM_INTRA_OP_THREADS" not in env_of(server_container(objects))
    assert "HTMLLM_INTRA_OP_THREADS" not in configmap_data(render({}))


# What the kubelet puts in the server's environment for the rendered env entries that are not literals.
DOWNWARD_API_CPU = "2"  # requests.cpu with divisor 1, rounded up
SECRET_VALUE = "a-key-from-the-secret"

# Everything optional on, with values a crawl deployment sets: a result cache of a million pages (Helm
# reads every number in values as a float64), long documents, a big batch and body limit.
MAXIMAL_VALUES: dict[str, Any] = {
    **values_for("full"),
    "server": {
        "backend": "onnx",
        "onnxQuantize": "int8",
        "intraOpThreads": 4,
        "preprocessPool": "process",
        "preprocessWorkers": 3,
        "inferenceProcess": True,
        "maxBatchTokens": 1048576,
        "maxWaitMs": 0.5,
        "maxQueueDocuments": 4000000,
        "maxBodyBytes": 1073741824,
        "maxInflightBytes": 4294967296,
        "requestTimeoutSeconds": 2.5,
        "bodyTimeoutSeconds": 86400,  # the longest any setting in seconds may be (MAX_DURATION_S)
        "drainTimeoutSeconds": 45,
    },
    "extraSettings": {
        "HTMLLM_RESULT_CACHE_DOCUMENTS": 1000000,
        "HTMLLM_MAX_LENGTH": 8192,
        "HTMLLM_GZIP_MIN_BYTES": 2097152,
        "HTMLLM_TRUNCATE": False,
        "HTMLLM_LOG_LEVEL": "warning",
        "HTMLLM_ONNX_PATH": "/models/checkpoints/html-base/model.int8.onnx",
    },
    "extraEnv": [{"name": "HTMLLM_EXTRACT_WORKERS", "value": "3"}],
}


def server_environment(objects: list[Manifest]) -> dict[str, str]:
    """The server container's environment as the kubelet builds it: the ConfigMap, then `env` on top."""
    environment = dict(configmap_data(objects))
    for name, entry in env_of(server_container(objects)).items():
        if "value" in entry:
            environment[name] = entry["value"]
        elif "resourceFieldRef" in entry.get("valueFrom", {}):
            environment[name] = DOWNWARD_API_CPU
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            environment[name] = SECRET_VALUE
        else:
            raise AssertionError(f"an env entry the test cannot resolve: {entry}")
    return environment


def settings_of(objects: list[Manifest]) -> Settings:
    """The service's Settings, read from the rendered pod's environment the way the server reads them."""
    environment = server_environment(objects)
    nothing_given: dict[str, Any] = {}  # every field from the environment
    with mock.patch.dict(os.environ, environment, clear=True):
        return Settings(**nothing_given)


@pytest.mark.parametrize("name", [*VALUE_SETS, "maximal"])
def test_every_rendered_setting_is_read_by_the_service(name: str) -> None:
    """Each HTMLLM_* variable of the pod (ConfigMap and env) is a Settings field, holds what the values
    say, and the service parses it: a misspelt name would be ignored, an unparsable value stops the pod."""
    values = MAXIMAL_VALUES if name == "maximal" else values_for(name)
    objects = render(values)
    environment = server_environment(objects)
    fields = set(Settings.model_fields)
    names = [key for key in environment if key.startswith("HTMLLM_")]
    assert [key for key in names if key.removeprefix("HTMLLM_").lower() not in fields] == []
    settings = settings_of(objects)  # raises pydantic's ValidationError on a value it cannot parse
    settings.engine_config()  # and the engine takes the combination
    merged = helm.Chart.load(CHART).merge_values(values)
    for key, value in merged["extraSettings"].items():
        field = key.removeprefix("HTMLLM_").lower()
        parsed = getattr(settings, field)
        assert (str(parsed) if isinstance(value, str) else parsed) == value, key
    server = merged["server"]
    assert settings.max_batch_tokens == server["maxBatchTokens"]
    assert settings.max_body_bytes == server["maxBodyBytes"]
    assert settings.max_inflight_bytes == server["maxInflightBytes"]
    assert settings.body_timeout_s == server["bodyTimeoutSeconds"]
    assert settings.drain_timeout_s == server["drainTimeoutSeconds"]
    if merged["auth"]["enabled"]:
        assert str(settings.api_key_file) == mounted_key_file(objects)[0]


def test_large_numbers_render_as_digits() -> None:
    """Helm reads numbers as float64s and `toString` writes them as 1e+06 from a million up, which an
    integer setting refuses: the pods would never start."""
    data = configmap_data(render(MAXIMAL_VALUES))
    assert data["HTMLLM_RESULT_CACHE_DOCUMENTS"] == "1000000"
    assert data["HTMLLM_GZIP_MIN_BYTES"] == "2097152"
    assert data["HTMLLM_MAX_QUEUE_DOCUMENTS"] == "4000000"  # a server.* value too
    assert data["HTMLLM_BODY_TIMEOUT_S"] == "86400"
    assert data["HTMLLM_MAX_WAIT_MS"] == "0.5" and data["HTMLLM_TRUNCATE"] == "false"


def chart_managed_settings() -> set[str]:
    """The HTMLLM_* names the chart sets from its own values (the ConfigMap of the default release, with
    the worker count, which the chart leaves to the server by default, given)."""
    return set(configmap_data(render({"server": {"preprocessWorkers": 2}})))


def test_extra_setting_names_are_exactly_the_other_settings() -> None:
    """values.schema.json lists the names extraSettings (and HTMLLM_* entries of extraEnv) may use: every
    Settings field the chart does not set itself, and nothing else, so a misspelt name fails at install
    instead of being silently ignored by the service (its settings ignore unknown variables)."""
    with helm.Chart.load(CHART) as chart:
        schema = chart.schema
    assert schema is not None
    allowed = set(schema["definitions"]["extraSettingName"]["enum"])
    every = {f"HTMLLM_{field.upper()}" for field in Settings.model_fields}
    assert allowed == every - chart_managed_settings() - {"HTMLLM_API_KEY"}


@pytest.mark.parametrize(
    "values",
    [
        {"extraSettings": {"HTMLLM_RESULT_CACHE_DOCS": 1000}},  # misspelt
        {"extraSettings": {"HTMLLM_MAX_LENGHT": 1000}},
        {"extraEnv": [{"name": "HTMLLM_RESULT_CACHE_DOCS", "value": "1000"}]},
        # The chart's own: a second HTMLLM_PORT would move the server off the probes' port, a second
        # HTMLLM_DRAIN_TIMEOUT_S outlive the grace period derived from server.drainTimeoutSeconds.
        {"extraSettings": {"HTMLLM_PORT": 9000}},
        {"extraSettings": {"HTMLLM_DRAIN_TIMEOUT_S": 120}},
        {"extraSettings": {"HTMLLM_BACKEND": "onnx"}},
        {"extraEnv": [{"name": "HTMLLM_PORT", "value": "9000"}]},
        {"extraEnv": [{"name": "HTMLLM_DRAIN_TIMEOUT_S", "value": "120"}]},
        {"server": {"intraOpThreads": 4}, "extraSettings": {"HTMLLM_INTRA_OP_THREADS": 8}},
        {"server": {"intraOpThreads": 4}, "extraEnv": [{"name": "HTMLLM_INTRA_OP_THREADS", "value": "8"}]},
        {
            "model": {"source": "pvc", "pvc": {"existingClaim": "c"}},
            "extraSettings": {"HTMLLM_MODEL_PATH": "/m"},
        },
        {"auth": {"enabled": True, "apiKey": "k"}, "extraEnv": [{"name": "HTMLLM_API_KEY", "value": "x"}]},
        {
            "auth": {"enabled": True, "apiKey": "k"},
            "extraEnv": [{"name": "HTMLLM_API_KEY_FILE", "value": "/k"}],
        },
        {"auth": {"enabled": True, "apiKey": "k"}, "extraSettings": {"HTMLLM_API_KEY_FILE": "/k"}},
        # The service reads its variables in any case: a lowercase name is the same setting, and slipped
        # past the checks (an API key in clear text, a second drain timeout).
        {"extraEnv": [{"name": "htmllm_api_key", "value": "sekrit"}]},
        {"extraEnv": [{"name": "Htmllm_Drain_Timeout_S", "value": "120"}]},
        {"extraEnv": [{"name": "htmllm_log_level", "value": "debug"}]},
    ],
)
def test_settings_are_refused_when_misspelt_or_set_twice(values: dict[str, Any]) -> None:
    with pytest.raises((helm.HelmValuesError, helm.HelmRenderError)):
        render(values)


def test_settings_the_chart_leaves_alone_pass_through() -> None:
    objects = render(
        {
            "extraSettings": {"HTMLLM_MODEL_PATH": "/opt/models/html-base"},  # baked into a derived image
            "extraEnv": [
                {"name": "HTMLLM_API_KEY", "valueFrom": {"secretKeyRef": {"name": "mine", "key": "k"}}},
                {"name": "HTMLLM_LOG_LEVEL", "value": "debug"},
                {"name": "MALLOC_ARENA_MAX", "value": "2"},
            ],
        }
    )
    settings = settings_of(objects)
    assert str(settings.model_path) == "/opt/models/html-base" and settings.log_level == "debug"
    assert settings.api_key is not None


ENGINE_CHOICES: dict[str, list[Any]] = {
    "gpu": [False, True],
    "backend": ["torch", "onnx"],
    "dtype": ["float32", "bfloat16", "float16"],
    "onnxQuantize": ["none", "int8"],
    "attention": ["auto", "sdpa", "eager", "varlen", "flash_attention_2"],
}


def engine_refuses(gpu: bool, backend: str, dtype: str, quantize: str, attention: str) -> bool:
    """Whether the service refuses to start with these settings (EngineConfig's checks, then the torch
    runner's choice of attention), with a torch that has the varlen kernel, as the images' does."""
    chosen: dict[str, Any] = {
        "backend": backend,
        "device": "cuda" if gpu else "cpu",
        "dtype": dtype,
        "onnx_quantize": quantize,
        "attention": attention,
    }
    settings = Settings(**chosen)
    try:
        config = settings.engine_config()
        if backend == "torch":
            with mock.patch.object(torch_runner, "torch_varlen_attention", lambda: object()):
                torch_runner.choose_attention(config.device, config.dtype, config.attn_implementation)
    except ValueError:
        return True
    return False


def test_the_chart_refuses_what_the_service_refuses_to_start_with() -> None:
    """A combination the engine rejects at start leaves every pod in CrashLoopBackOff; the chart refuses
    exactly those at install, and renders the rest."""
    mismatched = []
    for gpu, backend, dtype, quantize, attention in itertools.product(*ENGINE_CHOICES.values()):
        server = {"backend": backend, "dtype": dtype, "onnxQuantize": quantize, "attention": attention}
        try:
            render({"gpu": {"enabled": gpu}, "server": server})
            refused = False
        except helm.HelmRenderError:
            refused = True
        if refused != engine_refuses(gpu, backend, dtype, quantize, attention):
            verdict = "refused" if refused else "rendered"
            mismatched.append((gpu, backend, dtype, quantize, attention, verdict))
    assert mismatched == []


def test_init_container_has_a_writable_home() -> None:
    (init,) = pod_spec(render(values_for("init")))["initContainers"]
    assert env_of(init)["HOME"] == {"name": "HOME", "value": "/tmp"}
    assert {"name": "tmp", "mountPath": "/tmp"} in init["volumeMounts"]
    own = {**values_for("init")}
    own["model"] = {**own["model"], "initContainer": {**own["model"]["initContainer"]}}
    own["model"]["initContainer"]["env"] = [{"name": "HOME", "value": "/work"}]
    (init,) = pod_spec(render(own))["initContainers"]
    assert [e for e in init["env"] if e["name"] == "HOME"] == [{"name": "HOME", "value": "/work"}]


def test_the_pod_spec_holds_nothing_derived_from_the_api_key() -> None:
    """Nothing in the Deployment depends on the key's value: a hash of the Secret there (the old
    `checksum/api-key` annotation, unsalted over an otherwise predictable manifest) would let anyone who
    can read pods test guesses of a human-chosen key offline. The server re-reads the mounted key file
    when the kubelet updates it, so a new key needs no restart (test_the_server_accepts_...)."""

    def deployment(key: str) -> Manifest:
        return one(render({**values_for("init"), "auth": {"enabled": True, "apiKey": key}}), "Deployment")

    old, new = deployment("old-key"), deployment("new-key")
    assert old == new
    secret_text = render_text(values_for("init"))
    secret_digest = hashlib.sha256(secret_text["htmllm/templates/secret.yaml"].encode()).hexdigest()
    assert secret_digest not in json.dumps(old)


def test_rollout_is_configurable_for_clusters_without_a_spare_gpu() -> None:
    strategy = one(render({}), "Deployment")["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    gpu = {**values_for("gpu"), "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "25%"}}
    rolling = one(render(gpu), "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert rolling == {"maxSurge": 0, "maxUnavailable": "25%"}
    for stuck in ({"maxSurge": 0, "maxUnavailable": 0}, {"maxSurge": 0, "maxUnavailable": "0%"}):
        with pytest.raises(helm.HelmRenderError, match="cannot both be 0"):
            render({"rollingUpdate": stuck})
    with pytest.raises(helm.HelmValuesError):
        render({"rollingUpdate": {"maxSurge": "lots", "maxUnavailable": 0}})


def test_pods_spread_over_nodes_by_default() -> None:
    """Soft spread on the node name: a node's loss takes one pod, not every replica (the PDB covers only
    voluntary drains), and pods still schedule on a cluster that cannot take an even spread."""
    objects = render({})
    selector = one(objects, "Deployment")["spec"]["selector"]
    assert pod_spec(objects)["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": selector,
        }
    ]
    # A list of one's own replaces the default whole; an empty one turns spreading off.
    (zone,) = pod_spec(render(values_for("full")))["topologySpreadConstraints"]
    assert zone["topologyKey"] == "topology.kubernetes.io/zone" and zone["labelSelector"] == selector
    assert "topologySpreadConstraints" not in pod_spec(render({"topologySpreadConstraints": []}))


def smallest_pod_count(objects: list[Manifest]) -> int:
    """The fewest pods the release runs when nothing is wrong: the HPA's floor, or the fixed count."""
    if "HorizontalPodAutoscaler" in kinds(objects):
        return int(one(objects, "HorizontalPodAutoscaler")["spec"]["minReplicas"])
    return int(one(objects, "Deployment")["spec"]["replicas"])


def test_a_drain_never_takes_every_pod(value_set: tuple[str, list[Manifest]]) -> None:
    """The PDB lets maxUnavailable pods go at once: with no more pods than that, a node drain stops
    serving altogether (the GPU example had minReplicas 1)."""
    _, objects = value_set
    budget = one(objects, "PodDisruptionBudget")["spec"]["maxUnavailable"]
    assert isinstance(budget, int)
    assert smallest_pod_count(objects) > budget


def test_the_gpu_example_rolls_out_without_a_spare_gpu() -> None:
    """values.yaml says a surge pod never schedules on a GPU cluster without a spare GPU, so the example
    replaces pods one at a time instead, with a floor of pods that keeps one serving meanwhile."""
    objects = render(values_for("gpu"))
    rolling = one(objects, "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert rolling == {"maxSurge": 0, "maxUnavailable": 1}
    assert smallest_pod_count(objects) > rolling["maxUnavailable"]


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "HTMLLM_API_KEY", "value": "sk-inline-secret"},
        {"name": "HTMLLM_API_KEY", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
        {
            "name": "HTMLLM_API_KEY",
            "value": "sk-inline-secret",
            "valueFrom": {"secretKeyRef": {"name": "mine", "key": "k"}},
        },
    ],
)
def test_an_api_key_in_extra_env_must_come_from_a_secret(entry: Manifest) -> None:
    """A plain value (or a ConfigMap's) would put the key in clear text in the Deployment or a ConfigMap,
    readable by anyone who can read pods."""
    with pytest.raises(helm.HelmValuesError, match="extraEnv/0"):
        render({"extraEnv": [entry]})


def test_the_schema_knows_every_secret_setting() -> None:
    """The names whose extraEnv entries must be Secret references are the Settings fields that hold a
    secret (SecretStr), so a key setting added to the service is covered here too."""
    with helm.Chart.load(CHART) as chart:
        schema = chart.schema
    assert schema is not None
    secret_fields = {
        f"HTMLLM_{name.upper()}"
        for name, field in Settings.model_fields.items()
        if "SecretStr" in str(field.annotation)
    }
    assert set(schema["definitions"]["apiKeySettingName"]["enum"]) == secret_fields == {"HTMLLM_API_KEY"}


def test_pre_stop_outlasts_slow_endpoint_propagation() -> None:
    """kube-proxy on large clusters and cloud load balancers take 10-30 s to stop routing to a deleted
    pod: the default sleep covers the usual case, and the derived grace period still outlasts it and the
    drain (the chart refuses an explicit one that does not)."""
    objects = render({})
    command = server_container(objects)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and int(command[1]) >= 15
    drain = int(configmap_data(objects)["HTMLLM_DRAIN_TIMEOUT_S"])
    assert pod_spec(objects)["terminationGracePeriodSeconds"] == int(command[1]) + drain + 15
    with pytest.raises(helm.HelmRenderError, match="terminationGracePeriodSeconds"):
        render({"terminationGracePeriodSeconds": int(command[1]) + drain})
    with pytest.raises(helm.HelmRenderError, match=r"\+ 2 \(47\): the server's stop takes up to a second"):
        render({"terminationGracePeriodSeconds": int(command[1]) + drain + 1})  # no time for the exit
    assert pod_spec(render({"terminationGracePeriodSeconds": 47}))["terminationGracePeriodSeconds"] == 47


@pytest.mark.parametrize("name", ["gpu", "full", "scheduled"])
def test_the_helm_test_pod_is_pulled_and_scheduled_like_the_server(name: str) -> None:
    """`helm test` pulls the same image: it needs the registry credentials, and belongs on the nodes the
    server pods use (on GPU values, the ones that already hold the CUDA image)."""
    values = (
        values_for(name)
        if name != "scheduled"
        else {
            "imagePullSecrets": [{"name": "regcred"}],
            "nodeSelector": {"pool": "inference"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}
            ],
        }
    )
    objects = render(values)
    server = pod_spec(objects)
    (test_pod,) = [o for o in objects if o["kind"] == "Pod"]
    for field in ("imagePullSecrets", "nodeSelector", "tolerations"):
        assert field in server or name != "scheduled"
        assert test_pod["spec"].get(field) == server.get(field), field
    kubernetes_validate.validate(test_pod, KUBE_VERSION, strict=True)


LOOKUP_DEPLOYMENT = 'lookup "apps/v1" "Deployment" .Release.Namespace (include "htmllm.fullname" .)'


def chart_seeing_a_live_deployment(tmp_path: Path, replicas: int) -> Path:
    """A copy of the chart whose `lookup` of the Deployment finds one with `replicas`, as `helm upgrade`
    does on a cluster (helm-python-sdk renders offline, where lookup finds nothing)."""
    copy = tmp_path / "htmllm"
    shutil.copytree(CHART, copy)
    helpers = copy / "templates" / "_helpers.tpl"
    text = helpers.read_text(encoding="utf-8")
    assert text.count(LOOKUP_DEPLOYMENT) == 1
    helpers.write_text(text.replace(LOOKUP_DEPLOYMENT, f'dict "spec" (dict "replicas" {replicas})'))
    return copy


def test_turning_autoscaling_on_keeps_the_live_replicas(tmp_path: Path) -> None:
    """On the upgrade that turns autoscaling on, a Deployment without `replicas` would lose the field in
    Helm's three-way merge and fall back to 1 pod; the chart renders the live count instead, on that
    upgrade and later ones (the field is then never dropped again)."""
    live = chart_seeing_a_live_deployment(tmp_path, replicas=7)
    upgraded = render({"autoscaling": {"enabled": True}}, live)
    assert one(upgraded, "Deployment")["spec"]["replicas"] == 7
    for manifest in upgraded:
        validate_manifest(manifest)
    assert (
        one(render({"autoscaling": {"enabled": False}, "replicaCount": 3}, live), "Deployment")["spec"][
            "replicas"
        ]
        == 3
    )
    # Offline (`helm template`, first install): nothing to keep, the HPA owns the count.
    assert "replicas" not in one(render({}), "Deployment")["spec"]


def test_more_than_one_gpu_per_pod_is_refused() -> None:
    """One server process drives one GPU: a second would be requested, held and never used."""
    with pytest.raises(helm.HelmRenderError, match=r"gpu\.count is 2: one server process drives one GPU"):
        render({**values_for("gpu"), "gpu": {"enabled": True, "count": 2}})


# The memory rule's terms (docs/deployment.md, "Memory"): the idle server with the bundled model (PSS),
# an extractor worker's measured peak on large pages, and a result-cache entry of the default model.
IDLE_SERVER_BYTES = 0.95e9
EXTRACT_WORKER_PEAK_BYTES = 0.55e9
CACHE_ENTRY_BYTES = 1.7e3
DEFAULT_EXTRACT_WORKERS = 2  # the service's default on the chart's 2-CPU request
QUANTITY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 1e3, "M": 1e6, "G": 1e9, "": 1}


def quantity_bytes(quantity: str) -> float:
    number, suffix = re.fullmatch(r"([0-9.]+)([KMG]i?)?", quantity).groups()  # type: ignore[union-attr]
    return float(number) * QUANTITY_SUFFIXES[suffix or ""]


def memory_estimate(merged: dict[str, Any], extra_settings: dict[str, Any]) -> float:
    """Peak memory by the documented rule: idle server, 3x the in-flight bodies, the extractor workers,
    the result cache and the memory-backed /dev/shm."""
    workers = int(extra_settings.get("HTMLLM_EXTRACT_WORKERS", DEFAULT_EXTRACT_WORKERS))
    cache = int(extra_settings.get("HTMLLM_RESULT_CACHE_DOCUMENTS", 0))
    return (
        IDLE_SERVER_BYTES
        + 3 * merged["server"]["maxInflightBytes"]
        + workers * EXTRACT_WORKER_PEAK_BYTES
        + cache * CACHE_ENTRY_BYTES
        + quantity_bytes(merged["shmSizeLimit"])
    )


def test_suggested_settings_fit_the_default_memory_limit_with_headroom() -> None:
    """Every result-cache size the chart's docs suggest fits the default memory limit by the full rule
    with a fifth to spare (the idle figure is a PSS: resident sets are larger, and pods differ): the old
    suggestion, a million documents (1.7 GB), left 13 %."""
    merged = helm.Chart.load(CHART).merge_values({})
    limit = quantity_bytes(merged["resources"]["limits"]["memory"])
    texts = [
        (CHART / "values.yaml").read_text(encoding="utf-8"),
        (ROOT / "helm" / "README.md").read_text(encoding="utf-8"),
    ]
    suggested = [
        int(n.replace(",", "").replace("_", ""))
        for text in texts
        for n in re.findall(r"HTMLLM_RESULT_CACHE_DOCUMENTS:[\s#]*([0-9][0-9,_]*)", text)
    ]
    assert suggested
    for cache in [0, *suggested]:
        assert memory_estimate(merged, {"HTMLLM_RESULT_CACHE_DOCUMENTS": cache}) <= 0.8 * limit, cache


def test_the_memory_rule_names_every_term() -> None:
    """values.yaml and docs/deployment.md give one rule, with the extractor workers and the result cache
    (the old rule, idle + 3x maxInflightBytes, left both out)."""
    values_text = (CHART / "values.yaml").read_text(encoding="utf-8")
    rule = values_text[: values_text.index("\nresources:")].rsplit("\n\n", 1)[-1]
    docs = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    memory_section = docs[docs.index("## Memory") :].split("\n## ", 1)[0]
    shared = ["HTMLLM_EXTRACT_WORKERS", "HTMLLM_RESULT_CACHE_DOCUMENTS", "shmSizeLimit"]
    for text, terms in (
        (rule, ["maxInflightBytes", *shared]),
        (memory_section, ["HTMLLM_MAX_INFLIGHT_BYTES", *shared]),
    ):
        assert [term for term in terms if term not in text] == []


def deployment_doc() -> str:
    return (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")


def test_the_documented_network_policy_admits_only_to_the_release_pods() -> None:
    """docs/deployment.md's NetworkPolicy (how to keep /metrics, /docs and /info from everyone while auth
    covers only the model routes) is valid and selects the chart's pods on the container port."""
    blocks = re.findall(r"```yaml\n(.*?)```", deployment_doc(), flags=re.DOTALL)
    policies = [
        doc for block in blocks for doc in yaml.safe_load_all(block) if doc.get("kind") == "NetworkPolicy"
    ]
    (policy,) = policies
    validate_manifest(policy)
    objects = render({})
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["metadata"]["namespace"] == NAMESPACE
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    assert ports == {server_container(objects)["ports"][0]["containerPort"]}
    # The `helm test` pod (in the release's namespace) is admitted: `helm test` would time out otherwise.
    (test_pod,) = [o for o in objects if o["kind"] == "Pod"]
    peers = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
    assert any(
        "namespaceSelector" not in peer
        and peer["podSelector"]["matchLabels"].items() <= test_pod["metadata"]["labels"].items()
        for peer in peers
        if "podSelector" in peer
    )


def test_the_documented_cluster_load_test_uses_real_flags() -> None:
    """docs/deployment.md says how to aim locust at a deployed Service: the locustfile, the Service's
    in-cluster address, and only flags that locust or the locustfile define."""
    text = deployment_doc().replace("\\\n", " ")
    (command,) = [
        line for line in text.splitlines() if "locust -f loadtests/locustfile.py" in line and "--host" in line
    ]
    service = one(render({}), "Service")
    assert (
        f"--host http://{service['metadata']['name']}.{NAMESPACE}.svc:{service['spec']['ports'][0]['port']}"
        in command
    )
    locustfile = (ROOT / "loadtests" / "locustfile.py").read_text(encoding="utf-8")
    own_flags = set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", locustfile))
    locust_flags = {"-f", "--headless", "-u", "-r", "-t", "--host", "--csv", "--html"}
    arguments = command[command.index("-f loadtests/locustfile.py") :]
    assert set(re.findall(r"(?:^|(?<=\s))(--?[\w-]+)", arguments)) <= own_flags | locust_flags
    assert "--api-key" in own_flags and "--final-csv" in own_flags


def test_start_up_time_is_documented_with_its_context() -> None:
    """The startup probe's budget needs a load time to be sized against: the doc gives the measured ones
    (a range on a loaded machine, not one figure from an idle one; the ONNX export), how they were
    measured, and the default budget stays several times above the slowest."""
    text = deployment_doc()
    section = " ".join(text[text.index("### Start-up time") :].split("\n### ", 1)[0].split())
    assert "probes.startup" in section and "bundled model" in section and "cores" in section
    loaded = re.search(r"\*\*(\d+)-(\d+) s\*\* after the process started on a loaded", section)
    onnx = re.search(
        r"`server.backend: onnx` and no graph on the model volume it took \*\*(\d+) s\*\*", section
    )
    assert loaded and onnx
    assert "exporting the graph" in section and "before the server binds its port" in section
    startup = helm.Chart.load(CHART).merge_values({})["probes"]["startup"]
    slowest = max(int(loaded[2]), int(onnx[1]))
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 5 * slowest
