"""`htmllm export-onnx`: the options the exporter cannot honour fail before the export, in one line; the
export holds the lock a starting server takes on the target's directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.cli import main


def _checkpoint(path: Path) -> Path:
    """A directory the command takes for a checkpoint (it holds htmllm.json), for tests whose load and
    export are patched."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "htmllm.json").write_text("{}", encoding="utf-8")
    return path


def test_an_opset_below_the_exporters_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for opset in ("9", "17", "1000"):
        assert main(["export-onnx", "--checkpoint", str(tmp_path), "--opset", opset]) == 2
        err = capsys.readouterr().err
        assert f"--opset {opset} cannot be exported" in err and "opsets 18 to" in err
        assert "Traceback" not in err


def test_an_unwritable_out_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a-file").write_bytes(b"")
    checkpoint = _checkpoint(tmp_path / "ckpt")
    for out in (tmp_path / "a-file" / "model.onnx", tmp_path):
        assert main(["export-onnx", "--checkpoint", str(checkpoint), "--out", str(out)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"htmllm export-onnx: cannot write {out}: ") and err.count("\n") == 1
    assert main(["export-onnx", "--checkpoint", str(tmp_path / "typo")]) == 1
    assert not (tmp_path / "typo").exists()  # the probe of a default --out made no directory


def _fake_export(written_opset: int) -> Any:
    def export(checkpoint: object, out: Path, *, opset: int, quantize: str | None, **_: object) -> Path:
        import onnx
        from onnx import TensorProto, helper

        graph = helper.make_graph(
            [helper.make_node("Identity", ["x"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        )
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", written_opset)]), str(out))
        return Path(out)

    return export


@pytest.mark.parametrize(("written", "code"), [(18, 1), (20, 0)])
def test_the_opset_written_is_the_one_reported(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    written: int,
    code: int,
) -> None:
    """The converter falls back to opset 18 without failing the export when it cannot convert."""
    import service.core.checkpoint
    import service.engine.onnx_export

    monkeypatch.setattr(service.core.checkpoint, "load_checkpoint", lambda path: object())
    monkeypatch.setattr(service.core.checkpoint, "checkpoint_fingerprint", lambda path: "f")
    monkeypatch.setattr(service.engine.onnx_export, "export_onnx", _fake_export(written))
    out = tmp_path / "y.onnx"
    assert (
        main(["export-onnx", "--checkpoint", str(_checkpoint(tmp_path)), "--out", str(out), "--opset", "20"])
        == code
    )
    err = capsys.readouterr().err
    if code:
        assert f"wrote {out} at opset 18, not the 20 asked for" in err
    else:
        assert f"wrote {out} (opset 20, " in err


def test_the_export_holds_the_lock_a_starting_server_cleans_up_under(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ensure_onnx` removes, under an exclusive `flock` on the target's directory, the temporaries it
    takes for killed exports': the CLI exported without that lock, so a server starting meanwhile could
    remove its temporary. Now the export runs under the lock (the server waits), and removes the killed
    exports' temporaries for its target as the server would, leaving everything else."""
    import fcntl
    import os

    import service.core.checkpoint
    import service.engine.onnx_export

    monkeypatch.setattr(service.core.checkpoint, "load_checkpoint", lambda path: object())
    monkeypatch.setattr(service.core.checkpoint, "checkpoint_fingerprint", lambda path: "f")
    fake = _fake_export(20)
    seen: list[tuple[bool, list[str]]] = []

    def export(checkpoint: object, out: Path, **kwargs: object) -> Path:
        fd = os.open(Path(out).parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: conflicts with a holder
            locked = False
        except BlockingIOError:
            locked = True
        finally:
            os.close(fd)
        seen.append((locked, sorted(p.name for p in Path(out).parent.iterdir())))
        return fake(checkpoint, out, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(service.engine.onnx_export, "export_onnx", export)
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    killed = [".y.onnx.k3_x9abz.onnx", ".y.onnx.k3_x9abz.float.onnx"]
    kept = [".z.onnx.ab12cd34.onnx", ".y.onnx.notes", "y.onnx.bak"]
    for name in killed + kept:
        (graphs / name).write_bytes(b"graph")
    for out in (graphs / "y.onnx", tmp_path / "new" / "y.onnx"):  # a missing directory: made, then locked
        args = ["export-onnx", "--checkpoint", str(_checkpoint(tmp_path)), "--out", str(out), "--opset", "20"]
        assert main(args) == 0, capsys.readouterr().err
        assert seen[-1][0], f"exported {out} without the directory's lock"
    assert seen == [(True, sorted(kept)), (True, [])]
    assert sorted(p.name for p in graphs.iterdir()) == sorted([*kept, "y.onnx"])


def test_waiting_for_another_exports_lock_is_said_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a server exported (minutes, for a real model), the command waited on the directory's lock
    in silence and looked hung. The lock is taken without waiting first; only when that fails is the
    wait said, once, before it. (The other holder is a patched `flock`: no second process, no timing.)"""
    import fcntl

    import service.core.checkpoint
    import service.engine.onnx_export

    monkeypatch.setattr(service.core.checkpoint, "load_checkpoint", lambda path: object())
    monkeypatch.setattr(service.core.checkpoint, "checkpoint_fingerprint", lambda path: "f")
    monkeypatch.setattr(service.engine.onnx_export, "export_onnx", _fake_export(20))
    real_flock = fcntl.flock
    calls: list[str] = []
    held = [True]  # whether the patched other export holds the lock at the next try

    def held_by_another_export(fd: int, operation: int) -> None:
        if operation & fcntl.LOCK_NB and held[0]:
            calls.append("tried")
            held[0] = False
            raise BlockingIOError(11, "Resource temporarily unavailable")
        said = "waiting for another export" in capsys.readouterr().err
        calls.append(f"{'tried' if operation & fcntl.LOCK_NB else 'waited'}, having said so: {said}")
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", held_by_another_export)
    out = tmp_path / "graphs" / "y.onnx"
    args = ["export-onnx", "--checkpoint", str(_checkpoint(tmp_path)), "--out", str(out), "--opset", "20"]
    assert main(args) == 0
    assert calls == ["tried", "waited, having said so: True"]
    assert f"wrote {out} (opset 20, " in capsys.readouterr().err

    calls.clear()  # the lock free at once: taken, nothing said
    assert main(args) == 0
    assert calls == ["tried, having said so: False"]
    assert "waiting for another export" not in capsys.readouterr().err


def test_a_training_runs_folder_gets_its_model_suggested_as_embed_and_serve_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--checkpoint runs/my/smoke` (the run, whose model is in model/) said "cannot read config.json"
    after the imports; it is `check_checkpoint_path`'s line now, the one `htmllm embed` prints."""
    run = tmp_path / "smoke"
    _checkpoint(run / "model")
    assert main(["export-onnx", "--checkpoint", str(run)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"htmllm export-onnx: checkpoint_invalid: {run} is not an htmllm checkpoint (it holds no "
        f"htmllm.json); did you mean --checkpoint {run / 'model'}?"
    ]
    assert not (run / "model.onnx").exists()
    assert main(["export-onnx", "--checkpoint", str(tmp_path / "typo")]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"htmllm export-onnx: checkpoint_invalid: checkpoint directory {tmp_path / 'typo'} does not exist"
    ]


@pytest.mark.parametrize(
    ("quantize", "name"), [([], "model.onnx"), (["--quantize", "int8"], "model.int8.onnx")]
)
def test_an_out_ending_in_a_slash_is_refused_as_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], quantize: list[str], name: str
) -> None:
    """--out is the graph's file: `--out onnxout/` wrote a file named onnxout (Path() drops the slash)."""
    out = f"{tmp_path / 'onnxout'}/"
    argv = ["export-onnx", "--checkpoint", str(_checkpoint(tmp_path / "ckpt")), "--out", out, *quantize]
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"htmllm export-onnx: --out {out} names a directory; --out is the graph's file: "
        f"--out {tmp_path / 'onnxout' / name}, say"
    ]
    assert not (tmp_path / "onnxout").exists()
