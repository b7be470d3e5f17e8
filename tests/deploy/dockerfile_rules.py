"""Reading the Dockerfile and .dockerignore the way Docker does, for the deployment tests.

The Dockerfile is parsed by `dockerfile` (a binding to BuildKit's own Go parser), so line continuations,
exec-form JSON and parser directives are read exactly as `docker build` reads them. .dockerignore
patterns follow moby's patternmatcher: Go `filepath.Match` syntax plus `**`, later patterns win, `!`
re-includes, and a pattern that matches a parent directory matches everything under it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import dockerfile

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"


@dataclass
class Stage:
    name: str
    base: str  # the FROM image with global ARG defaults substituted
    commands: list[dockerfile.Command] = field(default_factory=list)

    def of(self, cmd: str) -> list[dockerfile.Command]:
        return [c for c in self.commands if c.cmd == cmd]


def _substitute(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def global_args(commands: tuple[dockerfile.Command, ...]) -> dict[str, str]:
    """The ARG defaults declared before the first FROM (the only ones a FROM line can use)."""
    args: dict[str, str] = {}
    for command in commands:
        if command.cmd == "FROM":
            break
        if command.cmd == "ARG":
            for value in command.value:
                name, _, default = value.partition("=")
                args[name] = default
    return args


@cache
def parse() -> tuple[tuple[dockerfile.Command, ...], tuple[Stage, ...]]:
    """All commands, and the build stages in file order."""
    commands = dockerfile.parse_file(str(DOCKERFILE))
    args = global_args(commands)
    stages: list[Stage] = []
    for command in commands:
        if command.cmd == "FROM":
            parts = command.value
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(name=name, base=_substitute(parts[0], args)))
        elif stages:
            stages[-1].commands.append(command)
    return commands, tuple(stages)


def stages() -> dict[str, Stage]:
    return {stage.name: stage for stage in parse()[1]}


def final_stage_user(name: str) -> tuple[int, int]:
    """The numeric uid and gid the stage's last USER instruction sets."""
    users = stages()[name].of("USER")
    assert users, f"stage {name} sets no USER"
    uid, _, gid = users[-1].value[0].partition(":")
    return int(uid), int(gid or uid)


def copy_sources(command: dockerfile.Command) -> list[str]:
    """The source operands of a COPY/ADD (every value but the last, the destination)."""
    return list(command.value[:-1])


def copy_from(command: dockerfile.Command) -> str | None:
    for flag in command.flags:
        text = str(flag)
        if text.startswith("--from="):
            return text.removeprefix("--from=")
    return None


@dataclass(frozen=True)
class IgnorePattern:
    regex: re.Pattern[str]
    parts: int  # path components in the pattern, for matching a parent directory
    exclusion: bool  # a `!` pattern: re-include


def _translate(pattern: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = pattern.index("]", i)
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("^") else body) + "]")
            i = end
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def ignore_patterns(text: str) -> list[IgnorePattern]:
    patterns: list[IgnorePattern] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exclusion = line.startswith("!")
        line = line.removeprefix("!").strip().strip("/")
        # filepath.Clean, as moby applies it.
        line = "/".join(part for part in line.split("/") if part not in ("", "."))
        patterns.append(IgnorePattern(re.compile(_translate(line) + r"\Z"), len(line.split("/")), exclusion))
    return patterns


def ignored(path: str, patterns: list[IgnorePattern]) -> bool:
    """Whether `path` (relative, `/`-separated) is left out of the build context."""
    dirs = path.split("/")
    matched = False
    for pattern in patterns:
        hit = bool(pattern.regex.match(path))
        if not hit and len(dirs) > 1 and pattern.parts <= len(dirs) - 1:
            hit = bool(pattern.regex.match("/".join(dirs[: pattern.parts])))
        if hit:
            matched = not pattern.exclusion
    return matched


def build_context(root: Path = ROOT) -> list[str]:
    """Every file `docker build` would send from `root`, given its .dockerignore.

    An ignored directory is not descended into unless a `!` pattern could re-include something under
    it, so the walk skips .venv and .git the way the Docker client does.
    """
    patterns = ignore_patterns((root / ".dockerignore").read_text(encoding="utf-8"))
    reincluded = [p for p in patterns if p.exclusion]
    sent: list[str] = []
    for directory, subdirs, files in os.walk(root):
        base = Path(directory).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        subdirs[:] = sorted(
            d
            for d in subdirs
            if not ignored(prefix + d, patterns)
            or any(p.parts > (prefix + d).count("/") + 1 for p in reincluded)
        )
        sent.extend(prefix + f for f in sorted(files) if not ignored(prefix + f, patterns))
    return sorted(sent)
