"""The one-way dependency rules of DEVELOPERS.md, checked on the source's import statements."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every absolute module an import statement in `path` names (relative imports resolved against its
    place under `root`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def violates(module: str, forbidden: tuple[str, ...]) -> bool:
    return any(module == f or module.startswith(f + ".") for f in forbidden)


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        (
            "service/core",
            ("fastapi", "starlette", "uvicorn", "service.api", "service.engine", "model_training"),
        ),
        ("service/engine", ("fastapi", "starlette", "service.api", "model_training")),
        ("service", ("model_training",)),
    ],
)
def test_layers_import_only_downward(package: str, forbidden: tuple[str, ...]) -> None:
    bad = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sources(package)
        for module in imported_modules(path)
        if violates(module, forbidden)
    ]
    assert not bad, "\n".join(bad)


def test_checker_sees_violations(tmp_path: Path) -> None:
    """The checker itself must catch a forbidden import, or the test above could never fail."""
    # Under tmp_path, not the source tree: a probe there was seen by the other tests that read the
    # sources, in another pytest-xdist process, while it existed.
    probe = tmp_path / "service" / "core" / "_layering_probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("from fastapi import FastAPI\nimport model_training.cli\nfrom ..api import x\n")
    found = imported_modules(probe, root=tmp_path)
    assert violates("fastapi", ("fastapi",)) and "fastapi" in found
    assert "model_training.cli" in found
    assert "service.api" in found
