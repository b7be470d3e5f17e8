"""The settings' ConfigMap across upgrades.

It had one fixed name, loaded by envFrom, and `helm upgrade` changed it in place: while a rollout was
under way (or stuck on settings that crash, maxUnavailable 0 keeping the old pods), an old pod that
restarted (OOM, liveness), was rescheduled (a node drain) or was added by the HPA started with the NEW
settings, and crashed with them. Now the ConfigMap is named for its data's checksum and immutable, and a
release renders again the earlier ConfigMaps that ReplicaSets with pods still load, since Helm deletes
what a release drops as soon as it has applied the new objects, long before the old pods are gone.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from tests.deploy.test_helm import (
    CHART,
    RELEASE,
    Manifest,
    render,
    render_text,
    server_container,
    validate_manifest,
    values_for,
)

FULLNAME = f"{RELEASE}-htmllm"
LOOKUP_REPLICA_SETS = 'lookup "apps/v1" "ReplicaSet" .Release.Namespace ""'
LOOKUP_CONFIG_MAP = 'lookup "v1" "ConfigMap" $.Release.Namespace $name'


def config_maps(objects: list[Manifest]) -> dict[str, Manifest]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}


def loaded_config_map(objects: list[Manifest]) -> str:
    """The ConfigMap the server container loads."""
    (source,) = server_container(objects)["envFrom"]
    name = source["configMapRef"]["name"]
    assert isinstance(name, str)
    return name


def test_the_configmap_is_named_for_its_settings() -> None:
    objects = render({})
    name = loaded_config_map(objects)
    assert re.fullmatch(rf"{FULLNAME}-[0-9a-f]{{10}}", name)
    (config_map,) = config_maps(objects).values()
    assert config_map["metadata"]["name"] == name and config_map["immutable"] is True
    assert loaded_config_map(render({})) == name  # the same settings, the same name: no rollout
    for other in ({"server": {"maxBatchTokens": 8192}}, {"extraSettings": {"HTMLLM_LOG_LEVEL": "debug"}}):
        assert loaded_config_map(render(other)) != name


def test_an_upgrade_never_rewrites_the_settings_running_pods_load() -> None:
    """A bad upgrade (a checkpoint path that does not exist) renders no object by the name the running
    pods load, so Helm cannot change what an old pod that restarts reads."""
    before = render(values_for("full"))
    broken = values_for("full")
    broken["model"] = {**broken["model"], "subPath": "checkpoints/no-such-run"}
    after = render(broken)
    assert loaded_config_map(before) not in config_maps(after)
    assert loaded_config_map(after) in config_maps(after)


def test_nothing_refers_to_the_configmap_by_another_name() -> None:
    """The Deployment, the `helm test` pod and NOTES.txt: every ConfigMap named is one the release renders
    (the test pod and the notes name none)."""
    for name in ("default", "full", "init"):
        rendered = render_text(values_for(name))
        objects = render(values_for(name))
        names = set(config_maps(objects))
        referred = set(re.findall(r"configMapRef:\s+name: (\S+)", "\n".join(rendered.values())))
        assert referred and referred <= names
        assert "configmap" not in rendered["htmllm/templates/NOTES.txt"].lower()
        (test_pod,) = [o for o in objects if o["kind"] == "Pod"]
        assert "configMap" not in json.dumps(test_pod)


def replica_set(name: str, owner: str, replicas: int, config_map: str) -> Manifest:
    return {
        "metadata": {"name": name, "ownerReferences": [{"kind": "Deployment", "name": owner}]},
        "spec": {
            "replicas": replicas,
            "template": {
                "spec": {
                    "containers": [{"name": "server", "envFrom": [{"configMapRef": {"name": config_map}}]}]
                }
            },
        },
    }


def live_config_map(name: str, data: dict[str, str], immutable: bool) -> Manifest:
    config_map: Manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}
    if immutable:
        config_map["immutable"] = True
    return config_map


def chart_seeing(tmp_path: Path, replica_sets: list[Manifest], live: list[Manifest]) -> Path:
    """A copy of the chart whose lookups find these ReplicaSets and ConfigMaps, as `helm upgrade` does
    on a cluster (helm-python-sdk renders offline, where lookup finds nothing)."""
    copy = tmp_path / "htmllm"
    shutil.copytree(CHART, copy)
    helpers = copy / "templates" / "_helpers.tpl"
    text = helpers.read_text(encoding="utf-8")
    assert text.count(LOOKUP_REPLICA_SETS) == 1 and text.count(LOOKUP_CONFIG_MAP) == 1
    sets = json.dumps({"kind": "ReplicaSetList", "items": replica_sets})
    by_name = json.dumps({c["metadata"]["name"]: c for c in live})
    text = text.replace(LOOKUP_REPLICA_SETS, f"fromJson `{sets}`")
    text = text.replace(LOOKUP_CONFIG_MAP, f"get (fromJson `{by_name}`) $name")
    helpers.write_text(text, encoding="utf-8")
    return copy


def test_settings_that_older_pods_still_load_are_kept(tmp_path: Path) -> None:
    """An upgrade renders again each ConfigMap that a ReplicaSet of the release with pods loads, as the
    cluster holds it: the release before (2 pods), a bad upgrade stuck mid-rollout (1 pod), and the
    fixed-name ConfigMap of the chart before 0.3.0. Not one whose ReplicaSet has scaled to 0, nor another
    Deployment's, nor one already gone; nor the new one twice."""
    new_values: dict[str, Any] = {"extraSettings": {"HTMLLM_LOG_LEVEL": "warning"}}
    current = loaded_config_map(render(new_values))
    previous, stuck, gone, scaled_down = (f"{FULLNAME}-{c * 10}" for c in "abcd")
    sets = [
        replica_set("rs-previous", FULLNAME, 2, previous),
        replica_set("rs-stuck", FULLNAME, 1, stuck),
        replica_set("rs-legacy", FULLNAME, 1, FULLNAME),
        replica_set("rs-scaled-down", FULLNAME, 0, scaled_down),
        replica_set("rs-deleted-config", FULLNAME, 1, gone),
        replica_set("rs-current", FULLNAME, 1, current),
        replica_set("rs-other-app", "other-app", 3, "other-app-config"),
    ]
    live = [
        live_config_map(previous, {"HTMLLM_LOG_LEVEL": "info", "HTMLLM_PORT": "8000"}, immutable=True),
        live_config_map(stuck, {"HTMLLM_MODEL_PATH": "/models/no-such-run"}, immutable=True),
        live_config_map(FULLNAME, {"HTMLLM_LOG_LEVEL": "info"}, immutable=False),
        live_config_map(scaled_down, {"HTMLLM_LOG_LEVEL": "debug"}, immutable=True),
        live_config_map("other-app-config", {"KEY": "value"}, immutable=False),
    ]
    objects = render(new_values, chart_seeing(tmp_path, sets, live))
    rendered = config_maps(objects)
    assert set(rendered) == {current, previous, stuck, FULLNAME}
    assert loaded_config_map(objects) == current
    labels = rendered[current]["metadata"]["labels"]
    for kept in live[:3]:
        name = kept["metadata"]["name"]
        assert rendered[name]["data"] == kept["data"]
        assert rendered[name].get("immutable") == kept.get("immutable")  # immutable cannot be unset
        assert rendered[name]["metadata"]["labels"] == labels
    for manifest in objects:
        validate_manifest(manifest)
    # Offline (`helm template`, a first install): nothing to keep.
    assert set(config_maps(render(new_values))) == {current}
