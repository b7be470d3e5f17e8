"""The bulk commands' shared resume rules (`resume_state`) where the commands' tests do not reach them
one by one: what the input's identity covers, and SIGTERM's handling."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from service.commands.resume_state import input_identity, sigterm_as_ctrl_c


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
    assert input_identity(site, tmp_path / "elsewhere.parquet")["files"] == 2 + len(own)
    # Through a symlinked directory on the output's path: the same files.
    (tmp_path / "link").symlink_to(site / "sub")
    assert input_identity(site, tmp_path / "link" / "out.parquet") == before
    # A user's file named like them is input.
    (site / "sub" / ".out.parquet.original").write_text("a backup")
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
