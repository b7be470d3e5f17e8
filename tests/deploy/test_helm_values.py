"""Values the chart used to render that fail only later, at apply or at pod start: refused at `helm install`.

- extraSettings values: the schema typed them only string/number/boolean, so `HTMLLM_LOG_LEVEL: verbose`
  rendered and the server exited 2 (pydantic) in every pod. Each setting's value schema now comes from
  its Settings field (tests/deploy/setting_schemas.py).
- rollingUpdate: maxSurge "0%" with maxUnavailable 0 passed the both-zero check, which knew only "0".
- autoscaling.minReplicas above maxReplicas: an HPA the API server refuses.
- Quantities (resources, volume sizes, the queue-size target) and the PDB's count or percentage:
  kubernetes-validate does not check their formats, the API server does, at apply.
- extraEnv values: an HTMLLM_* entry skipped the value checks extraSettings gets (HTMLLM_LOG_LEVEL
  verbose rendered, and the server exited 2), and a name in both rendered both (the env entry won).
- A model.mountPath on one of the pod's own mounts (/tmp), a podLabels selector key (the Deployment's
  selector then matched none of its pods), a podAnnotations key the metrics annotations also write: the
  API server refused them at apply.
- Valid values the schema refused: `--set server.maxWaitMs=2.5` (helm --set passes a decimal as a
  string), a drain time of 7.5 s, a CPU target above 100 % of the request, a compound scrape interval.
"""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Iterator
from typing import Any
from unittest import mock

import helm_python as helm
import pydantic
import pytest
import yaml

from service.api.settings import Settings
from tests.deploy.setting_schemas import env_value_rules, value_schema, value_schemas
from tests.deploy.test_helm import (
    CHART,
    PROMETHEUS_DURATION,
    Manifest,
    configmap_data,
    one,
    pod_spec,
    render,
    render_text,
    server_container,
    settings_of,
    validate_manifest,
    values_for,
)


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def schema_of(chart: helm.Chart) -> dict[str, Any]:
    schema = chart.schema
    assert schema is not None
    return schema


def rendered_and_valid(values: dict[str, Any]) -> list[Manifest]:
    objects = render(values)
    for manifest in objects:
        validate_manifest(manifest)
    return objects


def test_extra_setting_values_are_typed_as_the_service_parses_them(chart: helm.Chart) -> None:
    """values.schema.json's value schemas are the ones derived from the Settings fields, one for each name
    extraSettings may use (a field added or retyped in the service fails here until the schema follows:
    `python -m tests.deploy.setting_schemas` prints them)."""
    schema = schema_of(chart)
    assert schema["properties"]["extraSettings"] == {"$ref": "#/definitions/extraSettings"}
    names = schema["definitions"]["extraSettingName"]["enum"]
    properties = schema["definitions"]["extraSettings"]["properties"]
    assert list(properties) == list(value_schemas(names))
    assert properties == value_schemas(names)


@pytest.mark.parametrize(
    "settings",
    [
        {"HTMLLM_LOG_LEVEL": "verbose"},
        {"HTMLLM_LOG_LEVEL": "DEBUG"},  # the service's levels are lowercase
        {"HTMLLM_TRUNCATE": "maybe"},
        {"HTMLLM_EXTRACT_WORKERS": 0},
        {"HTMLLM_EXTRACT_WORKERS": "0"},
        {"HTMLLM_EXTRACT_WORKERS": 2.5},
        {"HTMLLM_MAX_LENGTH": 1},
        {"HTMLLM_PREPROCESS_TIMEOUT_S": 0},
        {"HTMLLM_EXTRACT_TIMEOUT_S": "0.0"},
        {"HTMLLM_UNHEALTHY_AFTER_S": -1},
        {"HTMLLM_HEAD_TIMEOUT_S": 86401},  # past a day: every setting in seconds (MAX_DURATION_S)
        {"HTMLLM_EXTRACT_TIMEOUT_S": "1000000"},
        {"HTMLLM_UNREADY_AFTER_PASS_S": "86400.5"},
        {"HTMLLM_RETRY_AFTER_S": 90000},
        {"HTMLLM_RESULT_CACHE_DOCUMENTS": "lots"},
        {"HTMLLM_WARMUP": 2},
        {"HTMLLM_LOG_FORMAT": "yaml"},
        {"HTMLLM_ONNX_PATH": ""},
    ],
)
def test_a_value_the_service_refuses_is_refused_at_install(settings: dict[str, Any]) -> None:
    (name,) = settings
    with pytest.raises(helm.HelmValuesError, match=f"extraSettings/{name}"):
        render({"extraSettings": settings})


# Values a values file may hold for a setting, of every YAML type and in the forms people write.
CANDIDATE_VALUES: list[Any] = [
    *[-1, 0, 1, 2, 3, 1000000, 0.5, 2.5, -0.5, True, False, 86400, 86401, 86400.5],
    *["", "0", "1", "2", "04", "0.0", "0.5", "00.10", "1.5", "-1", "1e3", "+4", "2 "],
    *["86400", "086400.00", "86401", "86400.5", "99999", "1e12"],
    *["true", "FALSE", "Yes", "off", "maybe", "debug", "info", "DEBUG", "verbose", "json", "yaml"],
    *["/models/html-base", "/models/html-base/model.onnx"],
]


def setting_text(value: Any) -> str:
    """The variable's text as htmllm.settingValue writes it: a string as given, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def service_parses(name: str, value: Any) -> bool:
    nothing_given: dict[str, Any] = {}  # every field from the environment
    with mock.patch.dict(os.environ, {name: setting_text(value)}, clear=True):
        try:
            Settings(**nothing_given)
        except pydantic.ValidationError:
            return False
    return True


def test_every_value_the_schema_admits_is_one_the_service_parses(chart: helm.Chart) -> None:
    """Helm's own schema validation, over every setting and a spread of values: nothing it admits makes
    the server refuse to start, and every setting both takes and refuses some (no test that cannot fail)."""
    names = schema_of(chart)["definitions"]["extraSettingName"]["enum"]
    admitted_but_refused = []
    for name in names:
        verdicts = []
        for value in CANDIDATE_VALUES:
            try:
                chart.validate_schema({"extraSettings": {name: value}})
                admitted = True
            except helm.HelmValuesError:
                admitted = False
            verdicts.append(admitted)
            if admitted and not service_parses(name, value):
                admitted_but_refused.append((name, value))
        assert any(verdicts) and not all(verdicts), name
    assert admitted_but_refused == []


def test_values_in_every_form_the_schema_admits_reach_the_service() -> None:
    """Quoted numbers and booleans (a values file often quotes them) and typed ones render, validate, and
    hold what the values say once the server parses them."""
    extra = {
        "HTMLLM_LOG_LEVEL": "debug",
        "HTMLLM_TRUNCATE": "false",
        "HTMLLM_WARMUP": "TRUE",
        "HTMLLM_EXTRACT_WORKERS": "3",
        "HTMLLM_INTRA_OP_THREADS": 4,
        "HTMLLM_MAX_LENGTH": "02048",
        "HTMLLM_PREPROCESS_TIMEOUT_S": "0.5",
        "HTMLLM_UNHEALTHY_AFTER_S": 0,
        "HTMLLM_RESULT_CACHE_DOCUMENTS": 1000000,
        "HTMLLM_EXTRACT_TIMEOUT_S": 2.5,
    }
    objects = rendered_and_valid({"extraSettings": extra})
    assert configmap_data(objects)["HTMLLM_EXTRACT_WORKERS"] == "3"
    settings = settings_of(objects)
    assert (settings.log_level, settings.truncate, settings.warmup) == ("debug", False, True)
    assert (settings.extract_workers, settings.intra_op_threads, settings.max_length) == (3, 4, 2048)
    assert (settings.preprocess_timeout_s, settings.unhealthy_after_s) == (0.5, 0)
    assert (settings.result_cache_documents, settings.extract_timeout_s) == (1000000, 2.5)


@pytest.mark.parametrize(
    "rollout",
    [
        {"maxSurge": "0%", "maxUnavailable": 0},
        {"maxSurge": "0%", "maxUnavailable": "0%"},
        {"maxSurge": 0, "maxUnavailable": "0%"},
        {"maxSurge": 0, "maxUnavailable": 0},
    ],
)
def test_a_rollout_that_can_never_start_is_refused(rollout: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmRenderError, match="cannot both be 0"):
        render({"rollingUpdate": rollout})


@pytest.mark.parametrize(
    "rollout",
    [
        {"maxSurge": "0%", "maxUnavailable": 1},
        {"maxSurge": 1, "maxUnavailable": "0%"},
        {"maxSurge": "0%", "maxUnavailable": "10%"},
    ],
)
def test_a_rollout_with_room_renders(rollout: dict[str, Any]) -> None:
    objects = rendered_and_valid({"rollingUpdate": rollout})
    assert one(objects, "Deployment")["spec"]["strategy"]["rollingUpdate"] == rollout


def test_an_autoscaling_floor_above_its_ceiling_is_refused() -> None:
    with pytest.raises(helm.HelmRenderError, match=r"minReplicas \(5\) must not exceed .*maxReplicas \(2\)"):
        render({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}})
    spec = one(
        rendered_and_valid({"autoscaling": {"minReplicas": 3, "maxReplicas": 3}}), "HorizontalPodAutoscaler"
    )
    assert (spec["spec"]["minReplicas"], spec["spec"]["maxReplicas"]) == (3, 3)
    # With autoscaling off the bounds are unused (no HPA): nothing to refuse.
    fixed = rendered_and_valid({"autoscaling": {"enabled": False, "minReplicas": 5, "maxReplicas": 2}})
    assert "HorizontalPodAutoscaler" not in {o["kind"] for o in fixed}


@pytest.mark.parametrize(
    "values",
    [
        {"resources": {"requests": {"cpu": "two"}}},
        {"resources": {"limits": {"memory": "6 GB"}}},
        {"resources": {"limits": {"memory": "-6Gi"}}},
        {"resources": {"requests": {"cpu": -1}}},
        {"tmpSizeLimit": "lots"},
        {"shmSizeLimit": "256MB"},
        {"model": {"pvc": {"size": "big"}}},
        {"model": {"initContainer": {"sizeLimit": "4 Gi"}}},
        {"model": {"initContainer": {"resources": {"requests": {"memory": "some"}}}}},
        {"podDisruptionBudget": {"maxUnavailable": "abc"}},
        {"podDisruptionBudget": {"maxUnavailable": "1"}},  # a string must be a percentage
        {"podDisruptionBudget": {"maxUnavailable": "150%"}},
        {"podDisruptionBudget": {"maxUnavailable": -1}},
        # A budget of none blocks every eviction: each `kubectl drain` would hang on these pods.
        {"podDisruptionBudget": {"maxUnavailable": 0}},
        {"podDisruptionBudget": {"maxUnavailable": "0%"}},
        {"podDisruptionBudget": {"maxUnavailable": "00%"}},
        {"autoscaling": {"queueSize": {"enabled": True, "targetAverageValue": "abc"}}},
        {"autoscaling": {"queueSize": {"enabled": True, "targetAverageValue": 0}}},
        # A target of 0 queued documents per pod holds the release at maxReplicas.
        {"autoscaling": {"queueSize": {"enabled": True, "targetAverageValue": "0"}}},
        {"autoscaling": {"queueSize": {"enabled": True, "targetAverageValue": "0.0"}}},
        {"autoscaling": {"queueSize": {"enabled": True, "targetAverageValue": "0m"}}},
        {"autoscaling": {"queueSize": {"enabled": True, "targetAverageValue": ".0"}}},
    ],
)
def test_a_malformed_quantity_is_refused_at_install(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        render(values)


@pytest.mark.parametrize(
    "values",
    [
        {"podDisruptionBudget": {"maxUnavailable": "50%"}},
        {"podDisruptionBudget": {"maxUnavailable": "100%"}},
        {"podDisruptionBudget": {"maxUnavailable": 2}},
        {"autoscaling": {"queueSize": {"enabled": True, "targetAverageValue": "500m"}}},
        {"autoscaling": {"queueSize": {"enabled": True, "targetAverageValue": "0.5"}}},
        {"autoscaling": {"queueSize": {"enabled": True, "targetAverageValue": "10"}}},
    ],
)
def test_a_budget_and_a_queue_target_above_zero_render(values: dict[str, Any]) -> None:
    rendered_and_valid(values)


@pytest.mark.parametrize(
    "resources",
    [None, {"requests": {"cpu": None}}, {"requests": {"cpu": 0}}],
)
def test_an_hpa_without_a_cpu_request_is_refused(resources: dict[str, Any] | None) -> None:
    # The HPA's target is a percentage of the CPU request: without one it never scales.
    with pytest.raises(helm.HelmRenderError, match=r"autoscaling\.enabled needs resources\.requests\.cpu"):
        render({"resources": resources})
    fixed = rendered_and_valid({"resources": resources, "autoscaling": {"enabled": False}})
    assert "HorizontalPodAutoscaler" not in {o["kind"] for o in fixed}


def test_well_formed_quantities_render_and_validate() -> None:
    objects = rendered_and_valid(
        {
            "resources": {
                "requests": {"cpu": "1500m", "memory": "3Gi"},
                "limits": {"cpu": 4, "memory": "6e9"},
            },
            "tmpSizeLimit": "512Mi",
            "shmSizeLimit": "1G",
            "podDisruptionBudget": {"maxUnavailable": "50%"},
            "autoscaling": {"queueSize": {"enabled": True, "targetAverageValue": "1500m"}},
        }
    )
    assert one(objects, "PodDisruptionBudget")["spec"]["maxUnavailable"] == "50%"
    (queue,) = [m for m in one(objects, "HorizontalPodAutoscaler")["spec"]["metrics"] if m["type"] == "Pods"]
    assert queue["pods"]["target"]["averageValue"] == "1500m"
    with_model = {
        "model": {
            "source": "initContainer",
            "initContainer": {
                "image": "fetcher:1",
                "sizeLimit": "8Gi",
                "resources": {"limits": {"cpu": 0.5}},
            },
        }
    }
    rendered_and_valid(with_model)
    rendered_and_valid({"model": {"source": "pvc", "pvc": {"create": True, "size": "10Gi"}}})


def test_extra_env_values_are_typed_as_the_service_parses_them(chart: helm.Chart) -> None:
    """An extraEnv entry named for a setting has the value schema of the setting's string forms, derived
    from its Settings field as extraSettings' are (`python -m tests.deploy.setting_schemas` prints them)."""
    schema = schema_of(chart)
    names = schema["definitions"]["extraSettingName"]["enum"]
    assert schema["properties"]["extraEnv"]["items"]["allOf"] == [{"$ref": "#/definitions/extraEnvSetting"}]
    assert schema["definitions"]["extraEnvSetting"]["allOf"] == env_value_rules(names)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HTMLLM_LOG_LEVEL", "verbose"),
        ("HTMLLM_EXTRACT_WORKERS", "0"),
        ("HTMLLM_TRUNCATE", "maybe"),
        ("HTMLLM_PREPROCESS_TIMEOUT_S", "0.0"),
        ("HTMLLM_ONNX_PATH", ""),
        ("MALLOC_ARENA_MAX", 2),  # a variable's value is text: the API server refuses a number
    ],
)
def test_an_extra_env_value_the_service_refuses_is_refused_at_install(name: str, value: Any) -> None:
    with pytest.raises(helm.HelmValuesError, match="extraEnv/0"):
        render({"extraEnv": [{"name": name, "value": value}]})


def test_every_extra_env_value_the_schema_admits_is_one_the_service_parses(chart: helm.Chart) -> None:
    names = schema_of(chart)["definitions"]["extraSettingName"]["enum"]
    texts = [value for value in CANDIDATE_VALUES if isinstance(value, str)]
    admitted_but_refused = []
    for name in names:
        verdicts = []
        for text in texts:
            try:
                chart.validate_schema({"extraEnv": [{"name": name, "value": text}]})
                admitted = True
            except helm.HelmValuesError:
                admitted = False
            verdicts.append(admitted)
            if admitted and not service_parses(name, text):
                admitted_but_refused.append((name, text))
        assert any(verdicts) and not all(verdicts), name
    assert admitted_but_refused == []


def test_a_setting_in_both_extra_settings_and_extra_env_is_refused() -> None:
    """Both would render, and the env entry would silently win over the ConfigMap."""
    values = {
        "extraSettings": {"HTMLLM_LOG_LEVEL": "info"},
        "extraEnv": [{"name": "HTMLLM_LOG_LEVEL", "value": "debug"}],
    }
    with pytest.raises(helm.HelmRenderError, match=r"extraEnv HTMLLM_LOG_LEVEL: extraSettings\.HTMLLM_LOG"):
        render(values)
    objects = rendered_and_valid({"extraEnv": [{"name": "HTMLLM_LOG_LEVEL", "value": "debug"}]})
    assert settings_of(objects).log_level == "debug"


class UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a mapping with a key twice (the API server does; safe_load keeps the
    last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[typing.Hashable, Any]:
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
        duplicated = sorted({str(key) for key in keys if keys.count(key) > 1})
        if duplicated:
            raise yaml.constructor.ConstructorError(
                None, None, f"keys written twice: {duplicated}", node.start_mark
            )
        return super().construct_mapping(node, deep=deep)


def deployment_loaded_strictly(values: dict[str, Any]) -> Manifest:
    text = render_text(values)["htmllm/templates/deployment.yaml"]
    deployment = yaml.load(text, Loader=UniqueKeyLoader)
    validate_manifest(deployment)
    assert isinstance(deployment, dict)
    return deployment


@pytest.mark.parametrize(
    ("model", "auth"),
    [
        ({"mountPath": "/tmp"}, False),
        ({"mountPath": "/tmp/"}, False),
        ({"mountPath": "/dev/shm"}, False),
        ({"mountPath": "/dev"}, False),  # would hide /dev/shm
        ({"mountPath": "/"}, False),
        ({"mountPath": "/etc/htmllm/api-keys"}, True),
        ({"mountPath": "/etc/htmllm"}, True),
    ],
)
def test_a_model_mount_on_the_pods_own_mounts_is_refused(model: dict[str, Any], auth: bool) -> None:
    """Two volumes at one path: the API server refuses the Deployment at apply."""
    for source in ({"source": "pvc", "pvc": {"existingClaim": "c"}}, {"source": "initContainer"}):
        values: dict[str, Any] = {"model": {**source, **model, "initContainer": {"image": "fetch:1"}}}
        if auth:
            values["auth"] = {"enabled": True, "apiKey": "k"}
        with pytest.raises(helm.HelmRenderError, match=r"model\.mountPath"):
            render(values)


@pytest.mark.parametrize("mount_path", ["/models", "/tmp/models", "/etc/htmllm-models"])
def test_a_model_mount_of_its_own_renders(mount_path: str) -> None:
    values = {
        "model": {"source": "initContainer", "mountPath": mount_path, "initContainer": {"image": "fetch:1"}},
        "auth": {"enabled": True, "apiKey": "k"},
    }
    objects = rendered_and_valid(values)
    for container in [server_container(objects), *pod_spec(objects)["initContainers"]]:
        paths = [mount["mountPath"] for mount in container["volumeMounts"]]
        assert mount_path in paths and len(set(paths)) == len(paths)


@pytest.mark.parametrize("key", ["app.kubernetes.io/name", "app.kubernetes.io/instance"])
def test_a_selector_label_in_pod_labels_is_refused(key: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=f"podLabels.{key}"):
        render({"podLabels": {key: "other"}})


def test_a_selector_label_in_pod_labels_with_the_charts_own_value_renders_once() -> None:
    """Chart 0.2.0 rendered it (the key twice, one value): an upgrade with such values must not fail."""
    selector = deployment_loaded_strictly({})["spec"]["selector"]["matchLabels"]
    deployment = deployment_loaded_strictly({"podLabels": dict(selector)})
    assert (
        deployment["spec"]["selector"]["matchLabels"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )


def test_pod_labels_are_added_or_replace_the_charts_other_labels_once() -> None:
    deployment = deployment_loaded_strictly(
        {"podLabels": {"team": "crawl", "app.kubernetes.io/version": "0.1.3"}}
    )
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "crawl" and labels["app.kubernetes.io/version"] == "0.1.3"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_pod_annotations_merge_with_the_metrics_ones_once() -> None:
    values = {
        "metrics": {"podAnnotations": True},
        "podAnnotations": {"prometheus.io/port": "9100", "team": "x"},
    }
    annotations = deployment_loaded_strictly(values)["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9100",
        "prometheus.io/path": "/metrics",
        "team": "x",
    }
    plain = deployment_loaded_strictly({})["spec"]["template"]["metadata"]
    assert "annotations" not in plain


# Each server.* value and the Settings field it sets (htmllm.settings).
SERVER_FIELDS = {
    "host": "host",
    "keepAliveTimeoutSeconds": "keep_alive_timeout_s",
    "backend": "backend",
    "dtype": "dtype",
    "onnxQuantize": "onnx_quantize",
    "attention": "attention",
    "intraOpThreads": "intra_op_threads",
    "preprocessWorkers": "preprocess_workers",
    "preprocessPool": "preprocess_pool",
    "inferenceProcess": "inference_process",
    "maxBatchTokens": "max_batch_tokens",
    "maxBatchRequests": "max_batch_requests",
    "maxWaitMs": "max_wait_ms",
    "maxQueueDocuments": "max_queue_documents",
    "maxBodyBytes": "max_body_bytes",
    "maxInflightBytes": "max_inflight_bytes",
    "maxDocuments": "max_documents",
    "requestTimeoutSeconds": "request_timeout_s",
    "bodyTimeoutSeconds": "body_timeout_s",
    "drainTimeoutSeconds": "drain_timeout_s",
}
FLOAT_SERVER_VALUES = [
    key for key, field in SERVER_FIELDS.items() if Settings.model_fields[field].annotation is float
]


def test_server_values_are_typed_as_their_settings(chart: helm.Chart) -> None:
    """A float setting takes a fraction, and the decimal string `helm --set` makes of one (its schema is
    the one extraSettings would give it); an integer or boolean one, its own type."""
    schema = schema_of(chart)["properties"]["server"]["properties"]
    assert set(schema) == set(SERVER_FIELDS) == set(chart.merge_values({})["server"])
    assert FLOAT_SERVER_VALUES == [
        "maxWaitMs",
        "requestTimeoutSeconds",
        "bodyTimeoutSeconds",
        "drainTimeoutSeconds",
    ]
    for key, field in SERVER_FIELDS.items():
        info = Settings.model_fields[field]
        if key in FLOAT_SERVER_VALUES:
            assert schema[key] == value_schema(f"HTMLLM_{field.upper()}", info), key
        elif info.annotation in (int, int | None):
            assert schema[key]["type"] == "integer", key
        elif info.annotation is bool:
            assert schema[key]["type"] == "boolean", key
        elif info.annotation is str:
            assert all(isinstance(choice, str) for choice in schema[key]["enum"]), key
        else:
            assert set(schema[key]["enum"]) <= set(typing.get_args(info.annotation)), key


@pytest.mark.parametrize(
    "key", ["requestTimeoutSeconds", "bodyTimeoutSeconds", "drainTimeoutSeconds", "keepAliveTimeoutSeconds"]
)
def test_server_durations_past_a_day_are_refused_at_install(key: str) -> None:
    """The service refuses them at start (`MAX_DURATION_S`): a request timeout of 1e12 s had been taken and
    failed every request, a drain timeout of `inf` crashed the start after the model loaded."""
    settings = settings_of(rendered_and_valid({"server": {key: 86400}}))
    assert getattr(settings, SERVER_FIELDS[key]) == 86400
    for wrong in (86401, 1e12, "86400.5", "100000"):
        with pytest.raises(helm.HelmValuesError, match=key):
            render({"server": {key: wrong}})


def test_fractions_given_with_set_reach_the_service() -> None:
    """`helm --set` makes 2.5 the string "2.5" (helm's strvals; --set-json keeps a number a number)."""
    given = helm.parse_set_string(
        "server.maxWaitMs=2.5,server.requestTimeoutSeconds=7.5,server.bodyTimeoutSeconds=90.5,"
        "server.drainTimeoutSeconds=7.5"
    )
    assert given["server"]["maxWaitMs"] == "2.5"
    for values in (given, helm.parse_set_json('server={"maxWaitMs": 2.5, "drainTimeoutSeconds": 7.5}')):
        objects = rendered_and_valid(values)
        settings = settings_of(objects)
        assert (settings.max_wait_ms, settings.drain_timeout_s) == (2.5, 7.5)
        # The grace period covers preStop 15 s + the drain 7.5 s, rounded up, + the 15 s margin.
        assert pod_spec(objects)["terminationGracePeriodSeconds"] == 38
    settings = settings_of(rendered_and_valid(given))
    assert (settings.request_timeout_s, settings.body_timeout_s) == (7.5, 90.5)
    with pytest.raises(helm.HelmRenderError, match="terminationGracePeriodSeconds"):
        render({"server": {"drainTimeoutSeconds": 7.5}, "terminationGracePeriodSeconds": 24})
    rendered_and_valid({"server": {"drainTimeoutSeconds": 7.5}, "terminationGracePeriodSeconds": 25})
    for wrong in ("2.5s", "-1", "", "abc", "99999999", 86_400_001):  # (at most a day, as the server)
        with pytest.raises(helm.HelmValuesError, match="maxWaitMs"):
            render({"server": {"maxWaitMs": wrong}})


def test_a_cpu_target_above_the_request_is_taken() -> None:
    """Utilisation is a share of the CPU request, which pods exceed where no CPU limit caps them (the
    chart sets none): 150 aims at one and a half requests."""
    hpa = one(
        rendered_and_valid({"autoscaling": {"targetCPUUtilizationPercentage": 150}}),
        "HorizontalPodAutoscaler",
    )
    assert hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 150
    with pytest.raises(helm.HelmValuesError):
        render({"autoscaling": {"targetCPUUtilizationPercentage": 0}})


@pytest.mark.parametrize("interval", ["1m30s", "2m", "500ms", "1h5m10s"])
def test_compound_scrape_intervals_are_taken(interval: str) -> None:
    # The timeout as long as the interval: a longer one is refused (tests/deploy/test_helm_monitoring.py).
    monitor_values = {"enabled": True, "interval": interval, "scrapeTimeout": interval}
    values = {**values_for("full"), "metrics": {"serviceMonitor": monitor_values}}
    monitor = one(rendered_and_valid(values), "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["interval"] == interval
    assert monitor["spec"]["endpoints"][0]["scrapeTimeout"] == interval


@pytest.mark.parametrize("interval", ["90", "1.5m", "", "1m 30s", "30s1m"])
def test_malformed_scrape_intervals_are_refused(interval: str) -> None:
    with pytest.raises(helm.HelmValuesError, match="interval"):
        render({"metrics": {"serviceMonitor": {"enabled": True, "interval": interval}}})


def test_scrape_durations_are_the_operators(chart: helm.Chart) -> None:
    """The schema takes what the ServiceMonitor CRD takes (monitoring.coreos.com/v1's Duration)."""
    duration = schema_of(chart)["definitions"]["duration"]
    assert duration["pattern"] == PROMETHEUS_DURATION and duration["minLength"] == 1
