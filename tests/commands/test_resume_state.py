"""The bulk commands' shared resume rules (`resume_state`) where the commands' tests do not reach them
one by one: what the input's identity covers (a directory's files, a manifest's page files), SIGTERM's
and SIGHUP's handling, a raised --limit, and a part writer after a failed write."""

from __future__ import annotations

import errno
import json
import os
import signal
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest

from service.commands import resume_state
from service.commands.resume_state import (
    RUN_FILE,
    PartWriter,
    RunStateError,
    changed,
    input_identity,
    limit_raised,
    pin_settings,
    sigterm_as_ctrl_c,
)
from service.core import pages


def _site(path: Path) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "a.html").write_text("<p>a</p>")
    (path / "sub" / "b.html").write_text("<p>b</p>")
    return path


def test_the_input_identity_leaves_out_every_file_a_run_writes_beside_its_output(tmp_path: Path) -> None:
    """Named so whether they exist or not: the first run must leave out what its resume will find."""
    site = _site(tmp_path / "site")
    before = input_identity(site, site / "sub" / "out.parquet")
    own = [
        "sub/out.parquet",
        "sub/out.parquet.parts/lock",
        "sub/out.parquet.parts/run.json",
        "sub/out.parquet.parts/part-000000.parquet",
        "sub/.out.parquet.k3_x9abz.htmllm-tmp",  # a merge's temporary
        "sub/.out.parquet.zz001122.htmllm-trash/parts/part-000000.parquet",  # parts on their way out
        "sub/.out.parquet.zz003344.tmp/parts/lock",  # an older version's
    ]
    for name in own:
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text("the run's own")
    assert input_identity(site, site / "sub" / "out.parquet") == before
    # Elsewhere, the output's files are input, but for the hidden ones (no file of a directory of pages).
    assert input_identity(site, tmp_path / "elsewhere.parquet")["files"] == 2 + 4
    # Through a symlinked directory on the output's path: the same files.
    (tmp_path / "link").symlink_to(site / "sub")
    assert input_identity(site, tmp_path / "link" / "out.parquet") == before
    # A user's file named like them is input; a hidden one is no file of a directory of pages at all.
    (site / "sub" / "out.parquet.original").write_text("a backup")
    assert input_identity(site, site / "sub" / "out.parquet")["files"] == 3
    (site / "sub" / ".out.parquet.original").write_text("a hidden backup")
    assert input_identity(site, site / "sub" / "out.parquet")["files"] == 3


def test_the_input_identity_follows_symlinked_directories_as_the_pages_are_read(tmp_path: Path) -> None:
    """`Path.rglob` passed over a symlinked directory (its pages were not read either): a page edited
    there changed nothing a resume could see. A link back to a directory it is in does not loop."""
    store = _site(tmp_path / "store")
    site = tmp_path / "site"
    site.mkdir()
    (site / "linked").symlink_to(store)
    (store / "sub" / "up").symlink_to("..")
    identity = input_identity(site)
    assert identity["files"] == 2
    (store / "sub" / "b.html").write_text("<p>b, longer</p>")
    assert input_identity(site) != identity


def test_sigterm_is_ctrl_c_while_it_lasts_and_its_handler_is_given_back() -> None:
    def before(*_: object) -> None:
        raise AssertionError("not while the run lasts")

    original = signal.signal(signal.SIGTERM, before)
    try:
        with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c() as termination:
            signal.raise_signal(signal.SIGTERM)  # Python's SIGINT handler: KeyboardInterrupt
        assert termination.received and signal.getsignal(signal.SIGTERM) is before
        # SIGINT ignored (a background job of a shell without job control): still KeyboardInterrupt.
        sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c():
                signal.raise_signal(signal.SIGTERM)
        finally:
            signal.signal(signal.SIGINT, sigint)
        with sigterm_as_ctrl_c() as termination:
            pass
        assert not termination.received and signal.getsignal(signal.SIGTERM) is before
    finally:
        signal.signal(signal.SIGTERM, original)


def test_sighup_is_ctrl_c_too_with_its_own_status_unless_ignored() -> None:
    """SIGHUP (the terminal or SSH session closed) ended a run on the spot, the finished rows held for
    its part lost; SIGTERM and Ctrl-C wrote them. Under `nohup` (SIGHUP ignored) the run goes on."""

    def before(*_: object) -> None:
        raise AssertionError("SIGHUP's handler before the run: not while it lasts")

    original = signal.signal(signal.SIGHUP, before)
    try:
        with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c() as termination:
            signal.raise_signal(signal.SIGHUP)
        assert (termination.received, termination.status, termination.how) == (True, 129, "hung up (SIGHUP)")
        assert signal.getsignal(signal.SIGHUP) is before
        with pytest.raises(KeyboardInterrupt), sigterm_as_ctrl_c() as termination:
            signal.raise_signal(signal.SIGTERM)
        assert (termination.status, termination.how) == (143, "terminated (SIGTERM)")
        with sigterm_as_ctrl_c() as termination:
            pass
        assert (termination.received, termination.status, termination.how) == (False, 130, "interrupted")
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with sigterm_as_ctrl_c() as termination:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            signal.raise_signal(signal.SIGHUP)
        assert not termination.received and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, original)


def test_a_larger_limit_or_none_goes_on_from_a_smaller_one_and_nothing_else_does(tmp_path: Path) -> None:
    """`--limit 30` then no limit was refused ("limit 30 -> none") and --overwrite started over: the first
    30 pages of the same input are the same pages."""
    then: dict[str, Any] = {"limit": 30, "dtype": "float32", "input_files": {"bytes": 1}}
    assert limit_raised({**then, "limit": 200}, then) and limit_raised({**then, "limit": None}, then)
    assert not limit_raised({**then, "limit": 10}, then)  # its rows past 10 would stay
    assert not limit_raised(then, then)
    assert not limit_raised({**then, "limit": 30}, {**then, "limit": None})
    assert not limit_raised({**then, "limit": 200, "dtype": "bfloat16"}, then)
    assert not limit_raised({**then, "limit": 200, "input_files": {"bytes": 2}}, then)  # another input

    parts = tmp_path / "out.parquet.parts"
    _interrupted(parts, then, 2)
    with pytest.raises(RunStateError, match=r"other settings \(limit 30 -> 200\)"):
        pin_settings(parts, {**then, "limit": 200})  # only where the command asks for it
    assert pin_settings(parts, {**then, "limit": 200}, limit_may_grow=True) is None
    assert json.loads((parts / RUN_FILE).read_text())["limit"] == 200
    assert len(list(parts.glob("part-*"))) == 2  # kept: this run's first rows
    with pytest.raises(RunStateError, match=r"other settings \(limit 200 -> 30\)"):
        pin_settings(parts, then, limit_may_grow=True)


class _Rows:
    """A part format whose writes fail after the first, as a disk that fills."""

    suffix = ".rows"

    def __init__(self) -> None:
        self.written: list[list[dict[str, Any]]] = []

    def write(self, rows: list[dict[str, Any]], path: Path) -> None:
        self.written.append(rows)
        if len(self.written) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        path.write_text(json.dumps(rows))


def test_a_part_writer_writes_nothing_after_a_failed_write(tmp_path: Path) -> None:
    """The command's Ctrl-C path writes what it holds: after a failure that had been a second write on a
    full disk, whose error took the place of the first."""
    fmt = _Rows()
    writer = PartWriter(tmp_path, fmt, part_size=2)
    for index in range(2):
        writer.add({"index": index})
    with pytest.raises(OSError, match="No space left"):
        for index in range(2, 4):
            writer.add({"index": index})
    assert isinstance(writer.failed, OSError) and writer.failed.errno == errno.ENOSPC
    writer.add({"index": 4})
    writer.add({"index": 5})
    writer.flush()
    assert len(fmt.written) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-000000.rows"]


def _corpus(path: Path) -> Path:
    """A corpus directory: manifest.jsonl naming its pages' files under pages/."""
    (path / "pages").mkdir(parents=True)
    rows = []
    for name in ("a", "b"):
        (path / "pages" / f"{name}.html").write_text(f"<p>the page {name}</p>")
        rows.append(json.dumps({"id": name, "file": f"pages/{name}.html"}))
    (path / "manifest.jsonl").write_text("\n".join(rows) + "\n")
    return path


def _touched(path: Path) -> None:
    """`path`'s modification time a millisecond later: an edit of as many bytes, as a stat sees it."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


def test_the_input_identity_covers_the_page_files_a_manifest_names(tmp_path: Path) -> None:
    """Only the manifest was pinned: a page file rewritten under its name passed a resume, and a
    finished output over it was "complete; nothing to do" with the old page's row."""
    corpus = _corpus(tmp_path / "corpus")
    identity = input_identity(corpus)
    assert identity["files"] == 3
    manifest_size = (corpus / "manifest.jsonl").stat().st_size
    assert identity["bytes"] == manifest_size + sum(len(f"<p>the page {n}</p>") for n in "ab")
    edited = corpus / "pages" / "b.html"
    edited.write_text("<p>the page X</p>")  # as long as it was
    _touched(edited)
    assert input_identity(corpus) != identity
    # A JSONL file's rows name their files as a manifest's do, relative to it; `file` is read only in
    # a row without `html` (nor is a row that is no JSON), as the reader reads it.
    lines = [
        '{"id": "a", "fil\\u0065": "pages/a.html"}',  # the key "file", one letter escaped
        '{"id": "inline", "html": "<p>x</p>", "file": "pages/b.html"}',
        '{"id": "bad", "file": "pages/b.html"',  # no JSON
        '{"id": "a-again", "file": "pages/a.html"}',
    ]
    source = corpus / "rows.jsonl"
    source.write_text("\n".join(lines) + "\n")
    identity = input_identity(source)
    assert identity["files"] == 3  # rows.jsonl and pages/a.html twice; pages/b.html is never read
    _touched(corpus / "pages" / "b.html")
    assert input_identity(source) == identity
    _touched(corpus / "pages" / "a.html")
    assert input_identity(source) != identity


def test_a_page_file_a_row_names_where_none_is_is_pinned_by_its_name(tmp_path: Path) -> None:
    """Its row is an input_unreadable row: a file put there since makes that row stale."""
    corpus = _corpus(tmp_path / "corpus")
    (corpus / "pages" / "b.html").unlink()
    identity = input_identity(corpus)
    assert identity["files"] == 2
    (corpus / "pages" / "b.html").write_text("<p>b, back</p>")
    assert input_identity(corpus)["files"] == 3
    # Which file is missing is told too, as the same count of files.
    (corpus / "pages" / "a.html").rename(tmp_path / "a.html")
    assert input_identity(corpus)["files"] == 2 and input_identity(corpus) != identity


def _alone(path: Path) -> dict[str, object]:
    """The identity of `path` alone, as a version that pinned no page file recorded a JSONL file's."""
    stat = path.stat()
    line = f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode()
    return {
        "files": 1,
        "bytes": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": sha256(line).hexdigest(),
    }


def test_a_jsonl_file_of_inline_pages_is_pinned_alone_and_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its identity is the file's own, as before page files were pinned (an output of that version
    stays complete); recorded by an earlier run and the file unchanged, its rows are not read again."""
    source = tmp_path / "pages.jsonl"
    source.write_text("".join(json.dumps({"id": str(i), "html": "<p>file</p>"}) + "\n" for i in range(3)))
    alone = _alone(source)
    assert input_identity(source) == alone

    def unread(*_: object) -> object:
        raise AssertionError("the rows were read again")

    monkeypatch.setattr(pages, "named_files", unread)
    assert input_identity(source, known=[None, {"files": 9}, alone]) == alone
    with pytest.raises(AssertionError, match="read again"):
        input_identity(source, known=[{**alone, "bytes": 0}])


def test_a_corpus_manifest_pinned_alone_by_an_older_version_is_read_for_its_page_files(
    tmp_path: Path,
) -> None:
    """Such a version recorded the manifest's identity alone: taken as "no page file named", its output
    over a page file replaced since had stayed complete for good."""
    corpus = _corpus(tmp_path / "corpus")
    alone = _alone(corpus / "manifest.jsonl")
    assert input_identity(corpus, known=[alone])["files"] == 3
    # The same file named as the input: taken as it was (its identity is recorded so for inline pages).
    assert input_identity(corpus / "manifest.jsonl", known=[alone]) == alone


def test_a_refusal_shows_each_setting_that_differs_with_its_old_and_new_value() -> None:
    """It named them only ("other settings (extraction_version)"): what the run had pinned was left to
    find in run.json, or in the output's metadata."""
    then = {
        "extraction_version": "6",
        "checkpoint_sha256": "c35e5d8ef84fc1608070b6a1217f74f3aef9d46cafcd3e8b0f333f9a24eb066d",
        "limit": None,
        "heads": ["a", "b"],
        "input": "/data/crawls/" + "x" * 100 + "/2024-05.jsonl",
        "versions": {"trafilatura": "1.6.0", "jusText": "3.0.1"},
        "input_files": {"bytes": 1},
        "min_words": 50,
    }
    now = {
        **then,
        "extraction_version": "7",
        "checkpoint_sha256": "9bc1" + "0" * 60,
        "limit": 5,
        "heads": ["a"],
        "input": "/data/crawls/" + "x" * 100 + "/2024-06.jsonl",
        "versions": {"trafilatura": "2.0.0", "jusText": "3.0.1"},
        "input_files": {"bytes": 2},  # `input_change`'s to say
    }
    assert changed(now, then).split(", ") == [
        "checkpoint_sha256 c35e5d8ef84f... -> 9bc100000000...",
        "extraction_version 6 -> 7",
        'heads ["a","b"] -> ["a"]',
        # Cut in its middle, to 80 characters: a path differs at either end.
        f"input /data/crawls/{'x' * 25}...{'x' * 24}/2024-05.jsonl -> "
        f"/data/crawls/{'x' * 25}...{'x' * 24}/2024-06.jsonl",
        "limit none -> 5",
        "versions.trafilatura 1.6.0 -> 2.0.0",
    ]
    # A name this version always records, missing: an older version's run, said so; an option's
    # setting only some runs have (the union's `order`) is not.
    older = {k: v for k, v in now.items() if k != "min_words"}
    assert changed(now, older, recorded=now.keys()) == "min_words unset -> 50; written by an older htmllm"
    assert changed(now, older, recorded=now.keys() - {"min_words"}) == "min_words unset -> 50"
    assert changed(older, now, recorded=older.keys()) == "min_words 50 -> unset"
    assert changed(now, dict(now)) == ""


def _interrupted(parts: Path, settings: dict[str, object], n: int) -> None:
    parts.mkdir()
    (parts / "lock").write_text("")
    (parts / RUN_FILE).write_text(json.dumps(settings))
    for i in range(n):
        (parts / f"part-{i:06d}.parquet").write_bytes(b"rows")


def test_overwrite_discards_the_parts_before_run_json_so_a_kill_between_leaves_the_same_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.json replaced first, a kill had left the old run's parts under the new run's settings: merged
    with the new rows. Only part files go, never the lock or another file in the directory."""
    parts = tmp_path / "out.parquet.parts"
    _interrupted(parts, {"prune_version": "9"}, 3)
    (parts / "notes.txt").write_text("mine")
    real_unlink = Path.unlink

    def killed_at_the_second(self: Path, missing_ok: bool = False) -> None:
        if self.name == "part-000001.parquet":
            raise KeyboardInterrupt
        real_unlink(self, missing_ok)

    with monkeypatch.context() as patch:
        patch.setattr(Path, "unlink", killed_at_the_second)
        with pytest.raises(KeyboardInterrupt):
            pin_settings(parts, {"prune_version": "10"}, overwrite=True)
    assert json.loads((parts / RUN_FILE).read_text()) == {"prune_version": "9"}
    with pytest.raises(RunStateError, match=r"prune_version 9 -> 10\); delete it, or pass --overwrite,"):
        pin_settings(parts, {"prune_version": "10"}, overwrite=False)
    with pytest.raises(RunStateError, match=r"prune_version 9 -> 10\); delete it to start over"):
        pin_settings(parts, {"prune_version": "10"})  # a command without --overwrite
    said = pin_settings(parts, {"prune_version": "10"}, overwrite=True)
    assert said == (
        "discarded the 2 part(s) of an interrupted run with other settings (prune_version 9 -> 10) in "
        f"{parts}; starting over"
    )
    assert sorted(p.name for p in parts.iterdir()) == ["lock", "notes.txt", RUN_FILE]
    assert json.loads((parts / RUN_FILE).read_text()) == {"prune_version": "10"}
    assert pin_settings(parts, {"prune_version": "10"}) is None  # nothing to resume from: pinned again


def test_parts_without_run_json_are_never_resumed_under_this_runs_settings(tmp_path: Path) -> None:
    """run.json is written before the first part: parts without one were written under settings nobody
    recorded (run.json removed since, parts copied in), and had been pinned to the resuming run's."""
    parts = tmp_path / "out.parquet.parts"
    _interrupted(parts, {"prune_version": "9"}, 2)
    (parts / RUN_FILE).unlink()
    with pytest.raises(RunStateError, match=r"parts without run\.json.*; delete it, or pass --overwrite,"):
        pin_settings(parts, {"prune_version": "10"}, overwrite=False)
    with pytest.raises(RunStateError, match=r"parts without run\.json.*; delete it to start over"):
        pin_settings(parts, {"prune_version": "10"})
    assert not (parts / RUN_FILE).exists()  # refused, nothing pinned
    said = pin_settings(parts, {"prune_version": "10"}, overwrite=True)
    assert said == f"discarded the 2 part(s) of an interrupted run without run.json in {parts}; starting over"
    assert json.loads((parts / RUN_FILE).read_text()) == {"prune_version": "10"}
    assert not list(parts.glob("part-*"))


def _parts_of_a_finished_run(parts: Path) -> None:
    parts.mkdir()
    for name in ("part-000000-000002.parquet", "part-000002-000004.parquet", "run.json", "lock"):
        (parts / name).write_bytes(b"x")


def test_parts_on_a_mount_point_are_emptied_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts on local scratch mounted at `out.parquet.parts`: the rename is EBUSY, which had failed the
    run after its merge, and every run after it."""
    parts, output = tmp_path / "out.parquet.parts", tmp_path / "out.parquet"
    _parts_of_a_finished_run(parts)
    replace = os.replace

    def mounted(source: Any, target: Any) -> None:
        if Path(source) == parts:
            raise OSError(errno.EBUSY, "Device or resource busy")
        replace(source, target)

    monkeypatch.setattr(os, "replace", mounted)
    resume_state.remove_parts(parts, output)
    assert parts.is_dir() and list(parts.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet.parts"]  # no trash left behind


def test_parts_behind_a_symlink_are_removed_where_they_are(tmp_path: Path) -> None:
    """The rename moved the link alone: the lock, run.json and every part stayed on the other side."""
    scratch, parts = tmp_path / "scratch" / "parts", tmp_path / "out" / "out.parquet.parts"
    scratch.parent.mkdir()
    parts.parent.mkdir()
    _parts_of_a_finished_run(scratch)
    parts.symlink_to(scratch)
    resume_state.remove_parts(parts, parts.parent / "out.parquet")
    assert not parts.exists() and not parts.is_symlink()
    assert list(scratch.iterdir()) == [] and list(parts.parent.iterdir()) == []


def test_a_directory_whose_only_pages_are_hidden_is_refused_saying_they_were_left_out(tmp_path: Path) -> None:
    """Its refusal had said it held no .html file: a site unpacked under `.site/` or kept in `__MACOSX/`
    reads as empty, and the message now says why."""
    site = tmp_path / "site"
    for name in (".cache/a.html", "__MACOSX/b.html", ".c.htm", "readme.txt"):
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text("<p>hidden</p>")
    with pytest.raises(pages.PageSourceError) as caught:
        resume_state.check_has_pages(site, None)
    assert str(caught.value) == (
        f"page source {site} holds no pages: no .html or .htm file (optionally .gz) and no WARC file with "
        "an HTML record that is not hidden: hidden files and directories and __MACOSX/ are left out (.c.htm, "
        ".cache/a.html, __MACOSX/b.html)"
    )
    for name in (".c.htm", ".cache/a.html", "__MACOSX/b.html"):
        (site / name).unlink()
    with pytest.raises(pages.PageSourceError) as caught:
        resume_state.check_has_pages(site, None)
    assert str(caught.value).endswith(
        "no .html or .htm file (optionally .gz) and no WARC file with an HTML record"
    )
