"""Workers start whatever folder the server runs from.

multiprocessing launches the forkserver as `python -c ...`, with the current directory first on its
import path, and the forkserver imports the service's modules first thing: run from a folder holding a
`service.py` or a `service/` (a crawl team's own project), it imported that one, and no worker could
start (`htmllm serve`, `embed` and `extract` all failed). The server runs in a fresh interpreter here,
so that its forkserver is started from that folder; its script lives elsewhere, as a console script's
does, so the server itself imports the real `service`."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    f"""
    import pkgutil, sys
    sys.path.insert(0, {str(ROOT)!r})
    import service
    from service.core.workers import WorkerPool

    if __name__ == "__main__":  # (each worker imports this script too, as multiprocessing does)
        with WorkerPool(1, name="probe", preload=["service.core.workers"]) as pool:
            found = pool.call(pkgutil.resolve_name, ("service:__version__",), timeout_s=60)
            print(found == service.__version__)
    """
)


@pytest.mark.parametrize("shadow", ["service.py", "service/__init__.py", "service/"])
def test_workers_start_from_a_folder_holding_a_module_named_service(tmp_path: Path, shadow: str) -> None:
    work = tmp_path / "project"
    target = work / shadow
    if shadow.endswith("/"):
        target.mkdir(parents=True)  # an empty folder: a namespace package without the service's modules
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("X = 1\n", encoding="utf-8")
    script = tmp_path / "bin" / "serve.py"
    script.parent.mkdir()
    script.write_text(SCRIPT, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)], cwd=work, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"  # the worker's `service` is the server's
