"""The checkpoint a server names (/info's `checkpoint_sha256` and `training_run_id`, each model answer's
`x-checkpoint-sha256`) is the one its model was loaded from, not the files found at the path at another
moment.

The app fingerprinted the checkpoint's path itself: before the load when it loaded the engine (before
the model's child process, with HTMLLM_INFERENCE_PROCESS, had even started), after it for `htmllm
serve`'s engine. A checkpoint replaced in between (a deploy copying into the served volume while the pod
started) was served under the other one's sha, which a crawler storing vectors by it would trust. Now the
process that loads the model fingerprints what it loads (the child, or the engine in this process), and
the app names that.

The replacement is made at the moment in between, deterministically: inside `load_engine` before the
load, or between the load and the app's start.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from service.api import app as app_module
from service.api.app import create_app, load_engine
from service.api.checkpoint_identity import CHECKPOINT_HEADER
from service.api.settings import Settings
from service.core.checkpoint import checkpoint_fingerprint
from service.engine import Engine
from tests.api.conftest import serving, tiny_settings
from tests.api.pages import page
from tests.factories.waiting import ready_until


def _retrain(checkpoint: Path, run_id: str) -> str:
    """What a new training run leaves at the same path (its htmllm.json names the run; the weights are
    the same here, which the fingerprint covers all the same); the new fingerprint."""
    meta_file = checkpoint / "htmllm.json"
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    meta["training"]["run_id"] = run_id
    meta_file.write_text(json.dumps(meta), encoding="utf-8")
    return checkpoint_fingerprint(checkpoint)


async def _named(app: object) -> tuple[str, str | None, str]:
    """/info's sha and run id, and a model answer's header."""
    async with serving(app) as client:
        await ready_until(client, 200, "after the warm-up")
        info = (await client.get("/info")).json()
        embedded = await client.post("/v1/embed", json={"documents": [{"html": page(1)}]})
        assert embedded.status_code == 200, embedded.text
        return info["checkpoint_sha256"], info["training_run_id"], embedded.headers[CHECKPOINT_HEADER]


@pytest.mark.parametrize("inference_process", [False, True], ids=["in-process", "inference-process"])
async def test_a_checkpoint_replaced_before_the_load_is_named_as_loaded(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inference_process: bool
) -> None:
    served = tmp_path / "served"
    shutil.copytree(tiny_checkpoint, served)
    settings = tiny_settings(served, inference_process=inference_process, intra_op_threads=1)
    replaced: list[str] = []

    def replaced_then_loaded(settings: Settings) -> Engine:
        replaced.append(_retrain(served, "run-b"))  # after the app's start, before the model loads
        return load_engine(settings)

    monkeypatch.setattr(app_module, "load_engine", replaced_then_loaded)
    sha, run_id, header = await _named(create_app(settings))
    assert sha == header == replaced[0] != checkpoint_fingerprint(tiny_checkpoint)
    assert run_id == "run-b"


@pytest.mark.parametrize("inference_process", [False, True], ids=["in-process", "inference-process"])
async def test_a_checkpoint_replaced_after_serve_loaded_it_is_named_as_loaded(
    tiny_checkpoint: Path, tmp_path: Path, inference_process: bool
) -> None:
    served = tmp_path / "served"
    shutil.copytree(tiny_checkpoint, served)
    loaded = _retrain(served, "run-a")
    settings = tiny_settings(served, inference_process=inference_process, intra_op_threads=1)
    engine = load_engine(settings)  # as `htmllm serve` loads it, before the app starts
    assert _retrain(served, "run-b") != loaded
    sha, run_id, header = await _named(create_app(settings, engine))
    assert sha == header == loaded and run_id == "run-a"
