"""The builders' layer order: the dependencies install in a layer that sees only pyproject.toml.

Each builder copied `service/` before its one `pip install ".[extras]"`, so any change to the code or the
README invalidated that layer: the CUDA build recompiled flash-attn (no PyPI wheel) and both re-downloaded
torch's dependencies. Now the extras install from a stub of the project, after `COPY pyproject.toml`
alone, and the code follows with `pip install --no-deps .`; pip's cache is a BuildKit cache mount. No
Docker engine runs here: the order is checked on BuildKit's parse, and the dependency layer's own shell
is run offline, its `pip install` building the stub's wheel instead, to show the stub builds from
pyproject.toml alone, declares the project's real requirements, and leaves nothing behind.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import dockerfile
import pytest

from tests.deploy.dockerfile_rules import ROOT, Stage, copy_from, copy_sources, stages

BUILDERS = ["cpu-builder", "cuda-builder"]
PIP_CACHE = "--mount=type=cache,target=/root/.cache/pip"


def run_text(run: dockerfile.Command) -> str:
    return " ".join(run.value)


def pip_installs(run: dockerfile.Command) -> list[str]:
    """Each `pip install ...` of a RUN, up to its `&&`."""
    return re.findall(r"pip install [^&]*", run_text(run))


def context_copies(stage: Stage) -> list[tuple[int, list[str]]]:
    """(position, sources) of each COPY from the build context."""
    return [
        (i, [s.rstrip("/").removeprefix("./") for s in copy_sources(c)])
        for i, c in enumerate(stage.commands)
        if c.cmd == "COPY" and copy_from(c) is None
    ]


def dependency_layer(stage: Stage) -> tuple[int, dockerfile.Command]:
    """The RUN that installs the project's extras (`".[...]"`)."""
    (found,) = [
        (i, c)
        for i, c in enumerate(stage.commands)
        if c.cmd == "RUN" and any(".[" in p for p in pip_installs(c))
    ]
    return found


@pytest.mark.parametrize("builder", BUILDERS)
def test_the_dependencies_install_before_the_code_is_copied(builder: str) -> None:
    stage = stages()[builder]
    position, _ = dependency_layer(stage)
    before = [sources for i, sources in context_copies(stage) if i < position]
    after = [source for i, sources in context_copies(stage) if i > position for source in sources]
    # Only pyproject.toml can invalidate the dependency layer; the code and the README come after it.
    assert before == [["pyproject.toml"]]
    assert {"service", "README.md"} <= set(after)


@pytest.mark.parametrize("builder", BUILDERS)
def test_after_the_code_only_the_project_itself_installs(builder: str) -> None:
    stage = stages()[builder]
    (code_copied,) = [i for i, sources in context_copies(stage) if "service" in sources]
    later = [p for c in stage.commands[code_copied:] if c.cmd == "RUN" for p in pip_installs(c)]
    assert later, f"{builder} never installs the copied code"
    for install in later:
        assert "--no-deps" in install.split() and ".[" not in install, install
        assert install.split()[-1] == ".", install


@pytest.mark.parametrize("builder", BUILDERS)
def test_pip_downloads_go_to_a_cache_mount_not_the_image(builder: str) -> None:
    """The dependency layer (and torch's) keep pip's downloads and built wheels (flash-attn's) in a
    BuildKit cache mount, which PIP_NO_CACHE_DIR would switch off; a pip call without the mount keeps no
    cache (--no-cache-dir), so none lands in a layer."""
    stage = stages()[builder]
    env = {name for c in stage.of("ENV") for name in c.value[::2]}
    assert "PIP_NO_CACHE_DIR" not in env
    _, layer = dependency_layer(stage)
    assert PIP_CACHE in layer.flags
    for run in stage.of("RUN"):
        for install in pip_installs(run):
            assert PIP_CACHE in run.flags or "--no-cache-dir" in install.split(), install
            if PIP_CACHE in run.flags:
                assert "--no-cache-dir" not in install.split(), install


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


@pytest.mark.slow
@pytest.mark.parametrize("builder", BUILDERS)
def test_the_dependency_layer_builds_a_stub_with_the_projects_requirements(
    builder: str, tmp_path: Path
) -> None:
    _, layer = dependency_layer(stages()[builder])
    workdir, wheels = tmp_path / "src", tmp_path / "wheels"
    workdir.mkdir()
    (workdir / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    # The layer's own shell, with `pip install` building the wheel it would install (offline, without
    # dependencies) and `pip uninstall` a no-op.
    shim = (
        f'pip() {{ case "$1" in install) shift; "{sys.executable}" -m pip wheel --quiet --no-deps '
        f'--no-build-isolation --no-index -w "{wheels}" "$@";; uninstall) ;; *) return 1;; esac; }}'
    )
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f"{shim}\n{run_text(layer)}"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # The stub and the build's droppings are gone: `COPY service` lands in a clean directory.
    assert sorted(p.name for p in workdir.iterdir()) == ["pyproject.toml"]
    (wheel,) = wheels.glob("htmllm-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (meta,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(meta).decode())
        assert [n for n in archive.namelist() if n.startswith("service/")] == ["service/__init__.py"]
    declared = metadata.get_all("Requires-Dist") or []
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = re.search(r"\.\[([\w,-]+)\]", run_text(layer))
    assert extras is not None
    for extra in ["", *extras.group(1).split(",")]:
        wanted = project["optional-dependencies"][extra] if extra else project["dependencies"]
        marker = f'extra == "{extra}"'
        stub = [r for r in declared if (marker in r if extra else "extra ==" not in r)]
        assert requirement_names(stub) == requirement_names(wanted), extra
