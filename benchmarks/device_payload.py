"""Fit what a GPU run needs into the device's 64 MiB: a slimmer transformers wheel and real corpus pages.

Why: everything a device call takes along (the tracked tree, about 32 MB with the bundled default model,
the wheels in `.whl/`, any other carried folder) must stay under 64 MiB, and the first GPU run's wheels
(27 MB, half of it transformers) left no room for the shared corpus (31 MB), so #5's service ratio was
measured on synthetic, corpus-shaped pages. transformers ships ~400 model families (11 MB of its 13 MB
compressed); the GPU run imports two of them (`auto` for `AutoModel` and `modernbert`), so the others
can stay behind, which frees room for several hundred of the corpus's real pages.

    python benchmarks/device_payload.py trim-wheel .whl/transformers-*.whl   # in place
    python benchmarks/device_payload.py corpus --corpus ../shared/corpus --out .corpus
    python benchmarks/device_payload.py check      # before a call: the size, wheels older than .venv,
                                                   # and wheels the device's Python would refuse

`corpus` takes pages spread evenly over the manifest (every k-th, so the language and encoding mix stays
the corpus's), as many as fit what is left of the budget after the tree and `.whl/`, keeping their bytes
and manifest rows as they are (`service.core.pages.iter_pages` reads the folder like the corpus itself).
The folder is ignored by git: the pages never enter the repository.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]
DEVICE_LIMIT = 64 * 1024 * 1024  # the device's limit on what travels with a call
MARGIN = 1024 * 1024  # left free: a file or two added to the tree before the call
KEEP_MODELS = ("auto", "modernbert")
# The GPU image's interpreter, as benchmarks/gpu_wheels.sh takes it (PYTHON_VERSION, default 3.12).
DEVICE_PYTHON = "3.12"


def trim_wheel(wheel: Path, keep: tuple[str, ...] = KEEP_MODELS) -> tuple[int, int]:
    """Rewrite `wheel` without the model packages outside `keep`; (bytes before, bytes after).

    The package's own `models/__init__.py` stays (transformers builds its lazy import table from the
    folders it finds), and RECORD loses the rows of the files that went, so pip installs it as a whole
    wheel. Idempotent: a trimmed wheel comes out the same.
    """
    before = wheel.stat().st_size
    kept: list[tuple[zipfile.ZipInfo, bytes]] = []
    with zipfile.ZipFile(wheel) as source:
        for info in source.infolist():
            if _dropped(info.filename, keep):
                continue
            data = source.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                rows = data.decode().splitlines(keepends=True)
                data = "".join(row for row in rows if not _dropped(row.split(",", 1)[0], keep)).encode()
            kept.append((info, data))
    partial = wheel.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as target:
        for info, data in kept:
            target.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    partial.replace(wheel)
    return before, wheel.stat().st_size


def _dropped(name: str, keep: tuple[str, ...]) -> bool:
    """True for a file under transformers/models/<family>/ whose family is not kept."""
    parts = name.split("/")
    return len(parts) > 3 and parts[0] == "transformers" and parts[1] == "models" and parts[2] not in keep


def travelling_bytes(root: Path = ROOT, carried: tuple[str, ...] = (".whl",)) -> int:
    """Bytes that travel with a device call: tracked and untracked-not-ignored files, plus `carried`."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    total = sum((root / name).stat().st_size for name in listed if name and (root / name).is_file())
    for folder in carried:
        total += sum(path.stat().st_size for path in (root / folder).rglob("*") if path.is_file())
    return total


def wheel_versions(folder: Path) -> dict[str, str]:
    """{normalised distribution name: version} of the wheels in `folder` (from their file names)."""
    found = {}
    for wheel in folder.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        found[name.lower().replace("_", "-")] = version
    return found


def stale_wheels(folder: Path) -> list[tuple[str, str, str]]:
    """(name, wheel's version, installed version) for each wheel whose distribution this environment has
    at another version: the GPU would run other code than the tests here do (gpu_wheels.sh pins what
    .venv has when it runs, and .venv may have moved since)."""
    stale = []
    for name, version in sorted(wheel_versions(folder).items()):
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if installed != version:
            stale.append((name, version, installed))
    return stale


def device_python() -> str:
    """The device's Python version, read as benchmarks/gpu_wheels.sh reads it (`PYTHON_VERSION`)."""
    return os.environ.get("PYTHON_VERSION") or DEVICE_PYTHON


def wheel_problems(folder: Path, python: str) -> list[str]:
    """One line per reason pip on the device would not install `folder`'s wheels: no folder or no wheel
    in it (the GPU machine cannot fetch one), a file name that is no wheel's, or a wheel for another
    Python than `python` ("3.12"). Python and ABI tags only, as pip matches them for CPython `python`
    (cp312 with cp312, abi3 or none; an older cp3x with abi3; py3 or py3x with none); the platform is
    gpu_wheels.sh's `--platform` to choose. A wrong folder cost a device run: `check` said "46.76 MiB"
    and 0 without `.whl/`, and passed wheels for cp311 that pip on the device's 3.12 refuses."""
    if not folder.is_dir():
        return [f"no {folder.name}/ at {folder}: run benchmarks/gpu_wheels.sh first"]
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        return [f"no wheels in {folder}: run benchmarks/gpu_wheels.sh first"]
    if not re.fullmatch(r"\d+\.\d+", python):
        return [f"PYTHON_VERSION {python!r} is not a version such as {DEVICE_PYTHON}"]
    major, minor = (int(part) for part in python.split("."))
    interpreter = f"cp{major}{minor}"
    accepted = {
        (tag.interpreter, tag.abi)
        for tag in [
            *cpython_tags(python_version=(major, minor), platforms=["any"]),
            *compatible_tags(python_version=(major, minor), interpreter=interpreter, platforms=["any"]),
        ]
    }
    problems, other_python = [], []
    for wheel in wheels:
        try:
            name, version, _, tags = parse_wheel_filename(wheel.name)
        except InvalidWheelFilename as exc:
            problems.append(f"{wheel.name}: not a wheel's file name ({exc})")
            continue
        if not any((tag.interpreter, tag.abi) in accepted for tag in tags):
            found = "/".join(sorted({f"{tag.interpreter}-{tag.abi}" for tag in tags}))
            other_python.append(f"{name} {version} ({found})")
    if other_python:
        problems.append(
            f"{len(other_python)} wheel(s) in {folder.name}/ are for another Python than the device's "
            f"{python} (PYTHON_VERSION; rerun benchmarks/gpu_wheels.sh): {', '.join(other_python)}"
        )
    return problems


def sample_corpus(corpus: Path, out: Path, budget: int) -> tuple[int, int]:
    """Copy evenly spread pages of `corpus` (manifest rows and files) into `out`, at most `budget` bytes.

    Returns (pages copied, bytes copied). `out` is replaced as a whole.
    """
    rows = [json.loads(line) for line in (corpus / "manifest.jsonl").read_text().splitlines() if line]
    sizes = [(corpus / row["file"]).stat().st_size for row in rows]
    mean = sum(sizes) / max(len(sizes), 1)
    wanted = max(1, min(len(rows), int(budget / mean)))
    order = [round(i * len(rows) / wanted) for i in range(wanted)]
    chosen, used = [], 0
    for index in order:
        if used + sizes[index] <= budget:
            chosen.append(index)
            used += sizes[index]
    shutil.rmtree(out, ignore_errors=True)
    (out / "pages").mkdir(parents=True)
    lines = []
    for index in chosen:
        row = rows[index]
        target = out / row["file"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((corpus / row["file"]).read_bytes())
        lines.append(json.dumps(row, ensure_ascii=False))
    (out / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    return len(chosen), used


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    trim = commands.add_parser("trim-wheel", help="drop transformers' unused model families from a wheel")
    trim.add_argument("wheel", type=Path)
    sample = commands.add_parser("corpus", help="copy as many corpus pages as fit the device's budget")
    sample.add_argument("--corpus", type=Path, default=ROOT.parent / "shared" / "corpus")
    sample.add_argument("--out", type=Path, default=ROOT / ".corpus")
    sample.add_argument("--max-pages-bytes", type=int, default=None, help="cap below what is left")
    commands.add_parser(
        "check",
        help="what a call carrying .whl and .corpus takes along, stale wheels, and wheels the device's "
        f"Python (PYTHON_VERSION, default {DEVICE_PYTHON}) would refuse",
    )
    args = parser.parse_args(argv)
    if args.command == "check":
        total = travelling_bytes(ROOT, (".whl", ".corpus"))
        print(f"tree + .whl + .corpus: {total / 2**20:.2f} MiB of {DEVICE_LIMIT / 2**20:.0f} MiB")
        stale = stale_wheels(ROOT / ".whl")
        for name, version, installed in stale:
            print(f"stale wheel: {name} {version} in .whl, {installed} here (rerun benchmarks/gpu_wheels.sh)")
        refused = wheel_problems(ROOT / ".whl", device_python())
        for problem in refused:
            print(f"error: {problem}", file=sys.stderr)
        return 1 if total > DEVICE_LIMIT or stale or refused else 0
    if args.command == "trim-wheel":
        before, after = trim_wheel(args.wheel)
        print(f"{args.wheel.name}: {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
        return 0
    if not (args.corpus / "manifest.jsonl").is_file():
        print(f"no corpus at {args.corpus}: nothing sampled", file=sys.stderr)
        return 1
    left = DEVICE_LIMIT - MARGIN - travelling_bytes(ROOT, (".whl",))
    budget = left if args.max_pages_bytes is None else min(left, args.max_pages_bytes)
    if budget <= 0:
        print("no room left beside the tree and .whl/ for corpus pages", file=sys.stderr)
        return 1
    pages, used = sample_corpus(args.corpus, args.out, budget)
    print(f"{args.out}: {pages} pages, {used / 1e6:.1f} MB (room was {budget / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
