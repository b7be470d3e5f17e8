"""A value set to null: Helm drops the key before the schema sees it, so the templates met nil and failed
with raw Go errors (`nil pointer evaluating interface {}.maxUnavailable`, `error calling deepCopy`), or
rendered what the API server or the service refuses (`auth.secretKey: null` wrote a Secret with an empty
key, `server.maxWaitMs: null` a setting of "null"). Now a null either means none (nodeSelector,
tolerations, resources, extraSettings, ...: the templates default it) or is refused with a message that
names the key (the schema requires it, or htmllm.validate fails).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.deploy.test_helm import CHART, render, settings_of, validate_manifest, values_for

# Kubernetes' own objects, passed through as they are: the API server judges what is inside them (a null
# there removes a default of the chart's, such as resources.requests.cpu, as the user means).
KUBERNETES_OBJECTS = {
    "podSecurityContext",
    "securityContext",
    "resources",
    "affinity",
    "autoscaling.behavior",
    "model.initContainer.resources",
}


def key_paths(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Every key of values.yaml, dotted: the chart's maps and their keys alike (a list is one value)."""
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        yield dotted
        if isinstance(value, dict) and dotted not in KUBERNETES_OBJECTS:
            yield from key_paths(value, f"{dotted}.")


PATHS = list(key_paths(yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))))
# Each key over a value set where it is in use: every optional part on (full-values.yaml); the GPU
# values; the init-container checkpoint with a Secret the chart creates from auth.apiKey.
BASES = {
    "full": PATHS,
    "gpu": [path for path in PATHS if path.startswith(("gpu", "server", "resources"))],
    "init": [path for path in PATHS if path.startswith(("model", "auth", "replicaCount"))],
}


def with_null(values: dict[str, Any], dotted: str) -> dict[str, Any]:
    """`values` with the key `dotted` set to null (the maps above it kept, or made)."""
    result = copy.deepcopy(values)
    *parents, last = dotted.split(".")
    node = result
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = None
    return result


def null_verdict(base: str, dotted: str) -> str:
    """What the chart does with `dotted: null` over the value set `base`: "" when it renders objects the
    API server and the service take, or refuses with a message naming the key; else what went wrong."""
    last = dotted.rsplit(".", 1)[-1]
    try:
        objects = render(with_null(values_for(base), dotted))
    except helm.HelmValuesError as exc:
        return "" if f"'{last}'" in str(exc) or f"/{last}" in str(exc) else f"schema: {exc}"
    except helm.HelmRenderError as exc:
        # A `fail` or `required` reads "execution error at (<template>): <message>"; a template that met
        # nil reads "template: ...: executing ...: nil pointer evaluating ...".
        message = str(exc)
        return "" if message.startswith("execution error at") and dotted in message else f"raw: {message}"
    except yaml.YAMLError as exc:
        return f"unparsable manifest: {exc}"
    try:
        for manifest in objects:
            validate_manifest(manifest)
        for secret in (o for o in objects if o["kind"] == "Secret"):
            assert all(secret["data"]), "a Secret key is empty"
        settings_of(objects).engine_config()
    except Exception as exc:
        return f"rendered, then refused: {type(exc).__name__}: {exc}"
    return ""


@pytest.mark.parametrize("base", list(BASES))
def test_a_null_value_means_none_or_is_refused_by_name(base: str) -> None:
    verdicts = {dotted: null_verdict(base, dotted) for dotted in BASES[base]}
    assert {dotted: verdict for dotted, verdict in verdicts.items() if verdict} == {}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"rollingUpdate": None}, "rollingUpdate"),
        ({"lifecycle": None}, "lifecycle"),
        ({"probes": {"startup": None}}, "startup"),
        ({"auth": {"enabled": True, "apiKey": "k", "secretKey": None}}, "secretKey"),
        ({"server": {"maxWaitMs": None}}, "maxWaitMs"),
    ],
)
def test_a_null_that_cannot_mean_none_is_refused_by_name(values: dict[str, Any], message: str) -> None:
    with pytest.raises((helm.HelmValuesError, helm.HelmRenderError), match=message) as raised:
        render(values)
    assert "nil pointer" not in str(raised.value)


@pytest.mark.parametrize(
    "values",
    [
        {"nodeSelector": None},
        {"tolerations": None},
        {**values_for("gpu"), "gpu": {"enabled": True, "tolerations": None, "nodeSelector": None}},
        # Without an HPA: one needs the CPU request it scales by (test_helm_values.py).
        {"resources": None, "autoscaling": {"enabled": False}},
        {**values_for("gpu"), "resources": None, "autoscaling": {"enabled": False}},
        {"extraSettings": None},
        {"extraEnv": None, "podAnnotations": None, "podLabels": None},
    ],
)
def test_a_null_map_or_list_means_none(values: dict[str, Any]) -> None:
    objects = render(values)
    for manifest in objects:
        validate_manifest(manifest)
    settings_of(objects)
