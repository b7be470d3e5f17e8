"""`htmllm prune`: a reader that stops early ends the command quietly; a page over the cap is refused
without being read or inflated whole; a page that cannot be read is one line with its code."""

from __future__ import annotations

import errno
import gzip
import io
import os
import sys
from pathlib import Path

import pytest

from service.cli import main
from service.commands.exits import PIPE_CLOSED
from service.core import page_files, pages
from tests.factories.disk import closed_directory
from tests.memory import gzip_bomb, traced_peak


def test_a_closed_pipe_ends_the_command_quietly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`htmllm prune big.html | head`: head has gone when the pruned page is written. Status 141, as
    SIGPIPE ends `cat` there and `htmllm extract --output -` ends (it was 1, as for a full disk)."""
    page = tmp_path / "big.html"
    page.write_text("<html><body>" + "<p>words the pruner keeps</p>" * 5000 + "</body></html>")
    reader, writer = os.pipe()
    os.close(reader)
    stdout = open(writer, "w", encoding="utf-8")  # noqa: SIM115 - closed below, after the command
    monkeypatch.setattr(sys, "stdout", stdout)
    try:
        assert main(["prune", str(page)]) == PIPE_CLOSED == 141
        stdout.write("what interpreter exit would flush")
        stdout.flush()  # stdout now leads to devnull: no second BrokenPipeError at exit
    finally:
        stdout.close()
    assert capsys.readouterr().err == ""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full: a file system that is full")
def test_a_standard_output_that_cannot_be_written_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`htmllm prune page.html > /dev/full` (a full disk) ended in an OSError traceback."""
    page = tmp_path / "page.html"
    page.write_text("<html><body><p>words the pruner keeps</p></body></html>")
    stdout = open("/dev/full", "w", encoding="utf-8")  # noqa: SIM115 - closed below, after the command
    monkeypatch.setattr(sys, "stdout", stdout)
    try:
        assert main(["prune", str(page)]) == 1
        stdout.flush()  # what interpreter exit would flush: stdout now leads to devnull
    finally:
        stdout.close()
    assert capsys.readouterr().err == "htmllm prune: cannot write the pruned page: No space left on device\n"


def test_a_closed_standard_output_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`htmllm prune page.html >&-`: Python's sys.stdout is None, and writing to it an AttributeError
    traceback."""
    page = tmp_path / "page.html"
    page.write_text("<html><body><p>words the pruner keeps</p></body></html>")
    monkeypatch.setattr(sys, "stdout", None)
    assert main(["prune", str(page)]) == 1
    assert (
        capsys.readouterr().err == "htmllm prune: cannot write the pruned page: standard output is closed\n"
    )


def _pruned(args: list[str]) -> tuple[int, int]:
    """`htmllm prune` run here: its status, and the most memory Python allocated meanwhile."""
    return traced_peak(lambda: main(["prune", *args]))


def test_a_gzip_bomb_is_refused_without_inflating_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # gzip.decompress held the whole page: a 1 MB file inflating to 1 GiB took 2 GB before the pruner's
    # cap refused it. Here the cap is lowered to 1 MiB and the page inflates to 64.
    monkeypatch.setattr(pages, "MAX_PAGE_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.html.gz"
    bomb.write_bytes(gzip_bomb(b"<p>", 64 << 20))
    status, peak = _pruned([str(bomb)])
    assert status == 1
    assert "payload_too_large" in capsys.readouterr().err
    assert peak < 8 << 20

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(bomb.read_bytes())))
    status, peak = _pruned(["-"])
    assert status == 1
    assert "payload_too_large" in capsys.readouterr().err
    assert peak < 8 << 20


def test_standard_input_is_read_no_further_than_the_cap(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pages, "MAX_PAGE_BYTES", 1 << 20)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"<p>" + b"x" * (32 << 20))))
    status, peak = _pruned(["-"])  # read() held all 32 MiB before the pruner refused the page
    assert status == 1
    assert "payload_too_large" in capsys.readouterr().err
    assert peak < 4 << 20


def test_a_corrupt_gzip_page_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "cut.html.gz"
    page.write_bytes(gzip.compress(b"<p>" + b"words " * 1000)[:40])
    assert main(["prune", str(page)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"htmllm prune: validation_error: cannot read {page}: ") and err.count("\n") == 1


def test_a_page_that_cannot_be_read_is_input_unreadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file system's refusal (a file gone, a directory, EIO) is said with its own code, as the bulk
    commands write it in a page's row; it had no code at all, where a page over the cap had one. (Root
    reads a chmod 000 file: the reader is patched for EIO.)"""
    gone = tmp_path / "gone.html"
    gone.symlink_to(tmp_path / "nowhere.html")
    for path, reason in ((gone, "No such file or directory"), (tmp_path, "Is a directory")):
        assert main(["prune", str(path)]) == 1
        assert capsys.readouterr().err == f"htmllm prune: input_unreadable: cannot read {path}: {reason}\n"

    def failing_disk(handle: object) -> bytes:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(pages, "read_page", failing_disk)  # standard input
    monkeypatch.setattr(page_files, "read_page", failing_disk)  # a file, through `read_page_bytes`
    page = tmp_path / "page.html"
    page.write_text("<p>a page on a failing disk</p>")
    for arg in (str(page), "-"):
        assert main(["prune", arg]) == 1
        assert (
            capsys.readouterr().err
            == f"htmllm prune: input_unreadable: cannot read {arg}: Input/output error\n"
        )


def test_an_oserror_of_the_content_is_validation_error_by_the_bulk_commands_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """prune had its own rule, every OSError `input_unreadable`; one without an errno is the content's
    (gzip's BadGzipFile is an OSError), a bad page as `pages.read_error` and a page's row say."""

    def bad_stream(handle: object) -> bytes:
        raise gzip.BadGzipFile("Not a gzipped file (b'xx')")

    monkeypatch.setattr(page_files, "read_page", bad_stream)  # a file, through `read_page_bytes`
    page = tmp_path / "page.html"
    page.write_text("<p>a page</p>")
    assert main(["prune", str(page)]) == 1
    assert capsys.readouterr().err == (
        f"htmllm prune: validation_error: cannot read {page}: Not a gzipped file (b'xx')\n"
    )


def test_a_page_behind_a_closed_directory_is_input_unreadable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page under a directory of mode 000: permission denied, the path, the bulk commands' code.
    (Root searches any directory: the file system is patched.)"""
    page = tmp_path / "noperm" / "page.html"
    page.parent.mkdir()
    page.write_text("<p>a page</p>")
    closed_directory(monkeypatch, page.parent)
    assert main(["prune", str(page)]) == 1
    assert (
        capsys.readouterr().err == f"htmllm prune: input_unreadable: cannot read {page}: Permission denied\n"
    )
