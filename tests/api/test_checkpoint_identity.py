"""/info's checkpoint identity: the fingerprint of the files served and the run that trained them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from service.api.checkpoint_identity import read_identity
from service.core.checkpoint import checkpoint_fingerprint
from tests.api.conftest import SettingsFactory, app_client, tiny_settings


def _with_run_id(checkpoint: Path, copy: Path, run_id: str) -> Path:
    """A copy of `checkpoint` whose htmllm.json records the training run `run_id`, as pretraining writes."""
    shutil.copytree(checkpoint, copy)
    meta_file = copy / "htmllm.json"
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    meta["training"]["run_id"] = run_id
    meta_file.write_text(json.dumps(meta), encoding="utf-8")
    return copy


def test_the_identity_is_the_fingerprint_and_the_run_id(tiny_checkpoint: Path, tmp_path: Path) -> None:
    plain = read_identity(tiny_checkpoint)
    assert plain.sha256 == checkpoint_fingerprint(tiny_checkpoint) and plain.training_run_id is None
    copy = _with_run_id(tiny_checkpoint, tmp_path / "trained", "0f3a")
    trained = read_identity(copy)
    assert (
        trained.training_run_id == "0f3a" and trained.sha256 == checkpoint_fingerprint(copy) != plain.sha256
    )


async def test_info_tells_two_checkpoints_of_one_name_apart(
    tiny_checkpoint: Path, tmp_path: Path, settings_for: SettingsFactory
) -> None:
    """Every run of one config is served under its name ("htmllm-tiny"): /info said nothing else."""
    async with app_client(settings_for(warmup=False), wait_ready=False) as client:
        plain = (await client.get("/info")).json()
    copy = _with_run_id(tiny_checkpoint, tmp_path / "trained", "5b1e9c")
    async with app_client(tiny_settings(copy, warmup=False), wait_ready=False) as client:
        trained = (await client.get("/info")).json()
    assert plain["model"] == trained["model"] == "tiny-test"
    assert plain["checkpoint_sha256"] == checkpoint_fingerprint(tiny_checkpoint)
    assert trained["checkpoint_sha256"] == checkpoint_fingerprint(copy) != plain["checkpoint_sha256"]
    assert (plain["training_run_id"], trained["training_run_id"]) == (None, "5b1e9c")
