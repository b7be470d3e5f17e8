"""/info's and /metrics' build identity: which pruner and extraction code a server runs, and which pruner
its checkpoint was trained on. In a rolling upgrade old and new pods share a name and a `version`, yet
may embed a page differently."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service import __version__
from service.core.extract import EXTRACTION_VERSION
from service.core.prune import PRUNE_VERSION
from tests.api.conftest import SettingsFactory, app_client, tiny_settings

# Not this build's: what a checkpoint trained before the pruner's last change records.
_OLD_PRUNE_VERSION = f"{PRUNE_VERSION}-old"


def _trained_on(checkpoint: Path, copy: Path, prune_version: str) -> Path:
    """A copy of `checkpoint` whose htmllm.json records training on `prune_version`."""
    shutil.copytree(checkpoint, copy)
    meta_file = copy / "htmllm.json"
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    meta["prune_version"] = prune_version
    meta_file.write_text(json.dumps(meta), encoding="utf-8")
    return copy


async def _build_series(client: httpx.AsyncClient) -> list[tuple[dict[str, str], float]]:
    """Every `htmllm_build_info` series of one scrape: (labels, value)."""
    response = await client.get("/metrics")
    assert response.status_code == 200
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(response.text)
        if family.name == "htmllm_build_info"
        for sample in family.samples
    ]


async def test_a_checkpoint_of_this_pruner_reports_it_twice(settings_for: SettingsFactory) -> None:
    expected = {
        "version": __version__,
        "prune_version": PRUNE_VERSION,
        "checkpoint_prune_version": PRUNE_VERSION,  # the tiny checkpoint records this build's
        "extraction_version": EXTRACTION_VERSION,
    }
    async with app_client(settings_for(warmup=False), wait_ready=False) as client:
        info = (await client.get("/info")).json()
        assert {name: info[name] for name in expected} == expected
        assert await _build_series(client) == [(expected, 1.0)]


async def test_a_checkpoint_of_another_pruner_is_served_told_apart_and_warned_about_once(
    tiny_checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """/info had reported the checkpoint's recorded version as `prune_version` while every page was
    pruned by this build's: an old pod and a new one looked the same over HTTP."""
    old = _trained_on(tiny_checkpoint, tmp_path / "old", _OLD_PRUNE_VERSION)
    expected = {
        "version": __version__,
        "prune_version": PRUNE_VERSION,
        "checkpoint_prune_version": _OLD_PRUNE_VERSION,
        "extraction_version": EXTRACTION_VERSION,
    }
    with caplog.at_level(logging.WARNING, logger="service.engine.engine"):
        async with app_client(tiny_settings(old, warmup=False), wait_ready=False) as client:
            for _ in range(2):  # scraped and asked again: still one series, no new warning
                info = (await client.get("/info")).json()
                assert {name: info[name] for name in expected} == expected
                assert await _build_series(client) == [(expected, 1.0)]
            embedded = await client.post("/v1/embed", json={"documents": [{"html": "<p>served</p>"}]})
            assert embedded.status_code == 200, embedded.text
    warnings = [r.getMessage() for r in caplog.records if "prune version" in r.getMessage()]
    assert warnings == [
        f"checkpoint tiny-test was trained on prune version {_OLD_PRUNE_VERSION}, "
        f"this build prunes with {PRUNE_VERSION}"
    ]
