"""The chart's `server.host` and `server.keepAliveTimeoutSeconds`: rendered into the pod's settings,
typed by the schema, and not to be set a second time through extraSettings or extraEnv.

server.host: the chart bound 0.0.0.0 and refused any HTMLLM_HOST of its own, so on an IPv6-only cluster
(EKS in IPv6 mode) the kubelet's probes to the pod's IPv6 address failed for ever.
server.keepAliveTimeoutSeconds: uvicorn's 5 s default closed idle connections that a load balancer (60 s
and more) still meant to reuse: sporadic 502s and resets on POSTs.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

from tests.deploy.test_helm import CHART, configmap_data, render, settings_of


@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_the_host_reaches_the_server(host: str) -> None:
    objects = render({"server": {"host": host}})
    assert configmap_data(objects)["HTMLLM_HOST"] == host
    assert settings_of(objects).host == host


def test_the_defaults_bind_ipv4_and_outlast_a_load_balancers_idle_timeout() -> None:
    objects = render({})
    data = configmap_data(objects)
    assert (data["HTMLLM_HOST"], data["HTMLLM_KEEP_ALIVE_TIMEOUT_S"]) == ("0.0.0.0", "75")
    assert settings_of(objects).keep_alive_timeout_s == 75 > 60  # AWS ALB's, ingress-nginx's idle timeout


def test_the_keep_alive_timeout_reaches_the_server() -> None:
    objects = render({"server": {"keepAliveTimeoutSeconds": 620}})  # behind a Google Cloud load balancer
    assert configmap_data(objects)["HTMLLM_KEEP_ALIVE_TIMEOUT_S"] == "620"
    assert settings_of(objects).keep_alive_timeout_s == 620


@pytest.mark.parametrize(
    "server",
    [
        {"host": "127.0.0.1"},  # the probes come to the pod's IP: a loopback bind fails every one
        {"host": "localhost"},
        {"host": "[::]"},
        {"host": 0},
        {"keepAliveTimeoutSeconds": 0},
        {"keepAliveTimeoutSeconds": 1.5},
        {"keepAliveTimeoutSeconds": "75"},
    ],
)
def test_the_schema_refuses_what_cannot_serve(server: dict[str, Any]) -> None:
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"server": server})


@pytest.mark.parametrize(
    "values",
    [
        {"extraSettings": {"HTMLLM_HOST": "::"}},
        {"extraEnv": [{"name": "HTMLLM_HOST", "value": "::"}]},
        {"extraSettings": {"HTMLLM_KEEP_ALIVE_TIMEOUT_S": 620}},
        {"extraEnv": [{"name": "HTMLLM_KEEP_ALIVE_TIMEOUT_S", "value": "620"}]},
    ],
)
def test_they_are_set_through_server_values_only(values: dict[str, Any]) -> None:
    with pytest.raises((helm.HelmValuesError, helm.HelmRenderError)):
        render(values)
