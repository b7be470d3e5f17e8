"""A checkpoint replaced between `htmllm embed`'s start (its settings, and the parts' pin, take the
checkpoint's fingerprint) and the model's load: refused, where the rows had been made by the new files
under the old fingerprint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from service.cli import main
from service.engine import Engine
from tests.factories.checkpoint import build_tiny_checkpoint


def test_a_checkpoint_changed_before_the_load_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = build_tiny_checkpoint(tmp_path / "tiny")
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "a.html").write_text("<html><body><p>A page to embed.</p></body></html>")
    output = tmp_path / "out.parquet"
    real = Engine.from_checkpoint.__func__  # type: ignore[attr-defined]

    def changed_first(cls: type[Engine], path: Any, *args: Any, **kwargs: Any) -> Engine:
        meta = json.loads((Path(path) / "htmllm.json").read_text())
        (Path(path) / "htmllm.json").write_text(json.dumps({**meta, "name": "replaced"}))
        return real(cls, path, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(Engine, "from_checkpoint", classmethod(changed_first))
    args = ["embed", "--checkpoint", str(checkpoint), "--input", str(tmp_path / "pages"), "--output",
            str(output), "--no-progress", "--preprocess-pool", "thread", "--workers", "1"]  # fmt: skip
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "changed while the command started" in err and "run the command again" in err, err
    assert not output.exists()
    monkeypatch.undo()
    assert main(args) == 0  # run again, on the checkpoint as it is now
