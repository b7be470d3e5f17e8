"""The model an engine with a model process names (`Engine.info`'s name and checkpoint prune version) is
the one its child loaded, not the htmllm.json this process read before the child's load.

`build_runner` read the metadata here, then the child loaded the checkpoint on its own: the heads, the
tokenizer and the width were checked against each other, but the name and the prune version were this
process's read. A htmllm.json replaced in between (a deploy copying into the served volume while the pod
started) was served under the old name and prune version beside the new files' fingerprint.

The replacement is made at the moment in between, deterministically: right after this process's read
(`loading._meta_and_tokenizer`), before the child is spawned. The child and the files are real.
"""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from service.core.checkpoint import CheckpointMeta, checkpoint_fingerprint
from service.core.tokenizer import HtmlTokenizer
from service.engine import loading
from service.engine.engine import Engine
from service.engine.runners.process import InferenceProcessError
from service.engine.types import EngineConfig
from tests.factories.checkpoint import build_tiny_checkpoint


def _rename(checkpoint: Path, **fields: object) -> None:
    """What a deploy of another model with the same heads, tokenizer and width leaves at the path."""
    meta_file = checkpoint / "htmllm.json"
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    meta.update(fields)
    meta_file.write_text(json.dumps(meta), encoding="utf-8")


def _without_heads(checkpoint: Path, scratch: Path) -> None:
    """Another checkpoint at `checkpoint`'s path: the same tokenizer, no heads."""
    build_tiny_checkpoint(scratch, heads=False)
    shutil.rmtree(checkpoint)
    shutil.copytree(scratch, checkpoint)


def _replaced_after_the_read(monkeypatch: pytest.MonkeyPatch, replace: Callable[[], object]) -> list[str]:
    """Run `replace` right after this process reads the checkpoint for `build_runner`; the list gets the
    name this process read."""
    read_first = loading._meta_and_tokenizer
    names: list[str] = []

    def read_then_replaced(path: Path) -> tuple[CheckpointMeta, HtmlTokenizer]:
        meta, tokenizer = read_first(path)
        names.append(meta.name)
        replace()
        return meta, tokenizer

    monkeypatch.setattr(loading, "_meta_and_tokenizer", read_then_replaced)
    return names


def test_the_model_is_named_as_its_process_loaded_it(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = tmp_path / "served"
    shutil.copytree(tiny_checkpoint, served)
    renamed = functools.partial(_rename, served, name="tiny-renamed", prune_version="older-pruner")
    read = _replaced_after_the_read(monkeypatch, renamed)
    engine = Engine.from_checkpoint(served, EngineConfig(inference_process=True, intra_op_threads=1))
    try:
        info = engine.info
        assert read == ["tiny-test"]  # this process read the old one
        assert (info.name, info.checkpoint_prune_version) == ("tiny-renamed", "older-pruner")
        assert info.checkpoint_sha256 == checkpoint_fingerprint(served)  # the same files as the name
    finally:
        engine.close()


def test_a_child_that_loaded_other_heads_than_this_process_read_is_still_refused(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Named by the child, but not answered by it: this process's tokenizer was checked against the heads
    # it read, and a child without them is refused, whatever its metadata says of itself.
    served = tmp_path / "served"
    shutil.copytree(tiny_checkpoint, served)
    _replaced_after_the_read(monkeypatch, lambda: _without_heads(served, tmp_path / "other"))
    with pytest.raises(InferenceProcessError, match="another model than this process read"):
        Engine.from_checkpoint(served, EngineConfig(inference_process=True, intra_op_threads=1))
