"""The chart's Prometheus side: the ServiceMonitor's scrape timeout, one discovery per pod, and the
prometheus-adapter rule helm/README.md documents for autoscaling on the queue size.

- A scrapeTimeout longer than the interval (5s / 10s) rendered; Prometheus refuses such a scrape config and
  prometheus-operator rejects the ServiceMonitor, so the pods went unscraped and their alerts silent.
- ci/full-values.yaml turned on both the ServiceMonitor and the prometheus.io/scrape annotations: a
  Prometheus that honours both scrapes each pod twice, and every `sum by (pod)` counts it double.
- The README's adapter rule returned a series per scrape target, not one value per pod.
"""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.deploy.test_helm import ROOT, one, pod_spec, render, render_text, validate_manifest, values_for

NOTES = "htmllm/templates/NOTES.txt"
DOUBLE_DISCOVERY = "WARNING: the pods are found twice"


def monitor_values(interval: str, timeout: str) -> dict[str, Any]:
    return {"metrics": {"serviceMonitor": {"enabled": True, "interval": interval, "scrapeTimeout": timeout}}}


# Each pair fails a comparison that is not by duration: by text ("1s" < "500ms"), by the leading number
# (500 > 1), or by the last unit alone (30s < 31s, ignoring the minute before it).
@pytest.mark.parametrize(
    ("interval", "timeout"),
    [("5s", "10s"), ("500ms", "1s"), ("1m", "1m30s"), ("1m30s", "1m31s"), ("1w", "1y"), ("0", "10s")],
)
def test_a_scrape_timeout_longer_than_the_interval_is_refused(interval: str, timeout: str) -> None:
    expected = rf"scrapeTimeout \({timeout}\) must not exceed [a-zA-Z.]+\.interval \({interval}\)"
    with pytest.raises(helm.HelmRenderError, match=expected):
        render(monitor_values(interval, timeout))


@pytest.mark.parametrize(
    ("interval", "timeout"),
    [("10s", "10s"), ("1s", "500ms"), ("1m", "59s"), ("1m30s", "1m"), ("1h", "59m59s999ms"), ("15s", "0")],
)
def test_a_scrape_timeout_within_the_interval_renders(interval: str, timeout: str) -> None:
    objects = render(monitor_values(interval, timeout))
    monitor = one(objects, "ServiceMonitor")
    validate_manifest(monitor)
    endpoint = monitor["spec"]["endpoints"][0]
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == (interval, timeout)


def test_the_timeout_is_not_checked_without_a_service_monitor() -> None:
    """The durations go nowhere then: refusing them would block an install over values it does not use."""
    values = monitor_values("5s", "10s")
    values["metrics"]["serviceMonitor"]["enabled"] = False
    assert "ServiceMonitor" not in {o["kind"] for o in render(values)}


@pytest.mark.parametrize(
    ("values", "warned"),
    [
        ({"metrics": {"podAnnotations": True, "serviceMonitor": {"enabled": True}}}, True),
        # The annotation set by hand finds the pods as surely as metrics.podAnnotations.
        (
            {
                "metrics": {"serviceMonitor": {"enabled": True}},
                "podAnnotations": {"prometheus.io/scrape": "true"},
            },
            True,
        ),
        # podAnnotations win over the metrics ones: scraping paused there is no second discovery.
        (
            {
                "metrics": {"podAnnotations": True, "serviceMonitor": {"enabled": True}},
                "podAnnotations": {"prometheus.io/scrape": "false"},
            },
            False,
        ),
        ({"metrics": {"serviceMonitor": {"enabled": True}}}, False),
        ({"metrics": {"podAnnotations": True}}, False),
        ({}, False),
    ],
)
def test_the_notes_warn_of_pods_found_by_both_discoveries(values: dict[str, Any], warned: bool) -> None:
    assert (DOUBLE_DISCOVERY in render_text(values)[NOTES]) is warned


def test_the_full_values_scrape_each_pod_once() -> None:
    """ci/full-values.yaml is the example of every optional part on: it keeps to one discovery."""
    values = values_for("full")
    objects = render(values)
    assert one(objects, "ServiceMonitor")
    annotations = one(objects, "Deployment")["spec"]["template"]["metadata"].get("annotations", {})
    assert "prometheus.io/scrape" not in annotations
    assert pod_spec(objects)  # rendered whole
    assert DOUBLE_DISCOVERY not in render_text(values)[NOTES]


def documented_adapter_rule() -> dict[str, Any]:
    readme = (ROOT / "helm" / "README.md").read_text(encoding="utf-8")
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", readme, flags=re.DOTALL)]
    (rule,) = [r for b in blocks if isinstance(b, dict) and "rules" in b for r in b["rules"]["custom"]]
    assert isinstance(rule, dict)
    return rule


def test_the_documented_adapter_rule_returns_one_value_per_pod() -> None:
    """prometheus-adapter expects one series per object asked about and maps it back by the resource label
    (docs/config.md, "Querying"): the query must aggregate away every other label, by <<.GroupBy>>."""
    rule = documented_adapter_rule()
    query = " ".join(rule["metricsQuery"].split())
    aggregated = re.fullmatch(r"(sum|avg|max|min)\((.+)\) by \(<<\.GroupBy>>\)", query) or re.fullmatch(
        r"(sum|avg|max|min) by \(<<\.GroupBy>>\) \((.+)\)", query
    )
    assert aggregated, query
    assert "{<<.LabelMatchers>>}" in aggregated.group(2)
    # A gauge: rate() or increase() of it is meaningless.
    assert not re.search(r"\b(i?rate|increase)\(", query)
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}


def test_the_documented_adapter_rule_serves_the_hpas_metric() -> None:
    rule = documented_adapter_rule()
    hpa = one(render(values_for("full")), "HorizontalPodAutoscaler")
    (pods,) = [m["pods"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    name = pods["metric"]["name"]
    assert rule["name"]["as"] == name
    assert rule["seriesQuery"].startswith(f"{name}{{")
