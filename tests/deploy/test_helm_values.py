"""Values the chart used to render that fail only later, at apply or at pod start: refused at `helm install`.

- extraSettings values: the schema typed them only string/number/boolean, so `HTMLLM_LOG_LEVEL: verbose`
  rendered and the server exited 2 (pydantic) in every pod. Each setting's value schema now comes from
  its Settings field (tests/deploy/setting_schemas.py).
- rollingUpdate: maxSurge "0%" with maxUnavailable 0 passed the both-zero check, which knew only "0".
- autoscaling.minReplicas above maxReplicas: an HPA the API server refuses.
- Quantities (resources, volume sizes, the queue-size target) and the PDB's count or percentage:
  kubernetes-validate does not check their formats, the API server does, at apply.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any
from unittest import mock

import helm_python as helm
import pydantic
import pytest

from service.api.settings import Settings
from tests.deploy.setting_schemas import value_schemas
from tests.deploy.test_helm import (
    CHART,
    Manifest,
    configmap_data,
    one,
    render,
    settings_of,
    validate_manifest,
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
    *[-1, 0, 1, 2, 3, 1000000, 0.5, 2.5, -0.5, True, False],
    *["", "0", "1", "2", "04", "0.0", "0.5", "00.10", "1.5", "-1", "1e3", "+4", "2 "],
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
        {"autoscaling": {"queueSize": {"enabled": True, "targetAverageValue": "abc"}}},
        {"autoscaling": {"queueSize": {"enabled": True, "targetAverageValue": 0}}},
    ],
)
def test_a_malformed_quantity_is_refused_at_install(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        render(values)


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
