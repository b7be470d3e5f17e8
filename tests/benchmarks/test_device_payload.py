"""benchmarks/device_payload.py: what a GPU call takes along must install and must fit.

A wrong trim costs a device run (the GPU machine cannot fetch a missing module), so it is checked here.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchmarks.scripts import load_script


@pytest.fixture(scope="module")
def payload() -> ModuleType:
    return load_script("device_payload")


def _wheel(path: Path) -> Path:
    files = {
        "transformers/__init__.py": "x = 1\n",
        "transformers/models/__init__.py": "",
        "transformers/models/auto/modeling_auto.py": "auto = 1\n",
        "transformers/models/modernbert/modeling_modernbert.py": "modern = 1\n",
        "transformers/models/bert/modeling_bert.py": "bert = 1\n" * 1000,
        "transformers/models/llama/__init__.py": "",
    }
    record = "".join(f"{name},sha256=x,1\n" for name in files) + "transformers-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
        wheel.writestr("transformers-1.0.dist-info/RECORD", record)
    return path


def test_the_trimmed_wheel_keeps_auto_and_modernbert_and_its_record_matches(
    payload: ModuleType, tmp_path: Path
) -> None:
    wheel = _wheel(tmp_path / "transformers-1.0-py3-none-any.whl")
    before, after = payload.trim_wheel(wheel)
    assert after < before
    with zipfile.ZipFile(wheel) as trimmed:
        names = set(trimmed.namelist())
        record = trimmed.read("transformers-1.0.dist-info/RECORD").decode()
    assert names == {
        "transformers/__init__.py",
        "transformers/models/__init__.py",
        "transformers/models/auto/modeling_auto.py",
        "transformers/models/modernbert/modeling_modernbert.py",
        "transformers-1.0.dist-info/RECORD",
    }
    assert {row.split(",")[0] for row in record.splitlines()} == names
    assert payload.trim_wheel(wheel)[1] == after  # a second trim changes nothing


def test_the_corpus_sample_fits_its_budget_and_spreads_over_the_manifest(
    payload: ModuleType, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    (corpus / "pages").mkdir(parents=True)
    rows = []
    for index in range(40):
        name = f"pages/p{index:04d}.html.gz"
        (corpus / name).write_bytes(b"x" * (100 + index))
        rows.append({"id": f"p{index:04d}", "file": name, "url": None})
    (corpus / "manifest.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "sample"
    (out / "stale").mkdir(parents=True)  # replaced as a whole

    pages, used = payload.sample_corpus(corpus, out, budget=1200)

    kept = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(kept) == pages and 0 < pages <= 10 and used <= 1200
    assert sum((out / row["file"]).stat().st_size for row in kept) == used
    indices = [int(row["id"][1:]) for row in kept]
    assert indices[0] == 0 and indices[-1] >= 30  # spread over the corpus, not its first pages
    assert not (out / "stale").exists()
    assert sorted(p.name for p in (out / "pages").iterdir()) == [Path(row["file"]).name for row in kept]


def test_wheels_at_another_version_than_installed_here_are_stale(payload: ModuleType, tmp_path: Path) -> None:
    import importlib.metadata

    here = importlib.metadata.version("pytest")
    for name in (
        "pytest-0.0.1-py3-none-any.whl",  # older than this environment's: stale
        f"pytest_asyncio-{importlib.metadata.version('pytest-asyncio')}-py3-none-any.whl",  # the same
        "not_installed_anywhere-1.0-py3-none-any.whl",  # the image's business, not ours
    ):
        (tmp_path / name).write_bytes(b"")

    assert payload.stale_wheels(tmp_path) == [("pytest", "0.0.1", here)]


def _wheels(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


def test_wheels_the_devices_python_accepts_pass(payload: ModuleType, tmp_path: Path) -> None:
    folder = _wheels(
        tmp_path / ".whl",
        "selectolax-1.0.2-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        "zstandard-0.25.0-cp39-abi3-manylinux_2_17_x86_64.whl",  # the stable ABI: any later CPython
        "fastapi-0.165.0-py3-none-any.whl",
        "six-1.17.0-py2.py3-none-any.whl",
        "tool-1.0-cp312-none-any.whl",
    )
    assert payload.wheel_problems(folder, "3.12") == []


def test_no_wheels_or_wheels_for_another_python_fail_the_check(payload: ModuleType, tmp_path: Path) -> None:
    assert payload.wheel_problems(tmp_path / ".whl", "3.12") == [
        f"no .whl/ at {tmp_path / '.whl'}: run benchmarks/gpu_wheels.sh first"
    ]
    assert "no wheels in" in payload.wheel_problems(_wheels(tmp_path / ".whl"), "3.12")[0]
    folder = _wheels(
        tmp_path / ".whl",
        "fastapi-0.165.0-py3-none-any.whl",
        "brotli-1.2.1-cp311-cp311-manylinux2014_x86_64.whl",  # pip on 3.12 refuses cp311 builds
        "old-1.0-py2-none-any.whl",
        "later-1.0-cp313-abi3-manylinux2014_x86_64.whl",  # abi3 from 3.13 on
    )
    (problem,) = payload.wheel_problems(folder, "3.12")
    assert problem.startswith("3 wheel(s) in .whl/ are for another Python than the device's 3.12")
    assert "brotli 1.2.1 (cp311-cp311)" in problem and "fastapi" not in problem
    cp311 = _wheels(tmp_path / "w311", "b-1.0-cp311-cp311-linux_x86_64.whl")
    assert payload.wheel_problems(cp311, "3.11") == []
    assert "is not a version" in payload.wheel_problems(folder, "twelve")[0]


def test_check_fails_without_wheels(
    payload: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed the size and returned 0 with no .whl/: the device call then failed at its first import."""
    monkeypatch.setattr(payload, "ROOT", tmp_path)
    monkeypatch.setattr(payload, "travelling_bytes", lambda root, carried: 10 * 2**20)
    monkeypatch.delenv("PYTHON_VERSION", raising=False)
    assert payload.main(["check"]) == 1
    assert "no .whl/ at" in capsys.readouterr().err

    _wheels(tmp_path / ".whl", "brotli-1.2.1-cp311-cp311-manylinux2014_x86_64.whl")
    assert payload.main(["check"]) == 1
    assert "another Python than the device's 3.12" in capsys.readouterr().err
    monkeypatch.setenv("PYTHON_VERSION", "3.11")  # as gpu_wheels.sh takes it
    assert payload.main(["check"]) == 0
