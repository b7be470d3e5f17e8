"""The order of the pruner's checks before parsing: a page the cheap checks refuse never pays for the
costly estimates (Python scans of every tag: nesting, reconstruction, name lookups, text growth).

A reviewer's 16 MB page of `<a href=x>a` tied up a worker for 15 s of nesting and reconstruction
estimates before its attribute count, a few passes in C, refused it. The pages here are small copies,
with the memory headroom patched away so that a small page meets its budget; what is checked is which
estimates run, never the time.
"""

from __future__ import annotations

from typing import NoReturn

import pytest

from service.core import prune
from service.core.precheck import attributes
from service.core.prune import InputTooLargeError, TooManyAttributesError, prune_html

_REPEATS = 10_000  # over DEFAULT_MAX_DEPTH tags: the nesting estimate runs for the page's tags
_LINKS = b"<a href=x>a" * _REPEATS
_COSTLY = ("estimate_depth", "reconstruction_bytes", "estimate_name_lookups", "text_growth_memory")


class EstimateCalled(Exception):
    """A costly estimate ran."""


def _forbid(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make each named estimate of `prune` raise `EstimateCalled`."""
    for name in names:

        def called(*args: object, _name: str = name, **kwargs: object) -> NoReturn:
            raise EstimateCalled(_name)

        monkeypatch.setattr(prune, name, called)


def _links_page(text: int) -> bytes:
    """The reviewer's page, scaled: `text` bytes of text, then `_REPEATS` links of one attribute each.

    Without headroom its budget is 10 bytes a byte: the tags (400 bytes each) fit it from about 290 KB
    of text, tags and attributes (650 bytes a link) up to about 540 KB."""
    return b"<p>" + b"x" * text + b"</p>" + _LINKS


@pytest.fixture
def no_headroom(monkeypatch: pytest.MonkeyPatch) -> None:
    """A memory budget of 10 bytes per byte of page, so that half a megabyte can break it."""
    monkeypatch.setattr(prune, "_MEMORY_HEADROOM", 0)


@pytest.mark.usefixtures("no_headroom")
def test_a_page_refused_for_its_attributes_runs_no_costly_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    _forbid(monkeypatch, *_COSTLY)
    with pytest.raises(InputTooLargeError, match=f"page has {_REPEATS + 2} tags and {_REPEATS} attributes"):
        prune_html(_links_page(400_000))
    # With more text the attributes fit its budget: the estimates run (the patches are the ones used).
    with pytest.raises(EstimateCalled, match="estimate_depth"):
        prune_html(_links_page(600_000))


def test_a_too_wide_element_runs_no_nesting_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    _forbid(monkeypatch, *_COSTLY)
    wide = "<p " + " ".join(f"a{i}" for i in range(2_000)) + ">x</p>"
    with pytest.raises(TooManyAttributesError, match="an element has 2000 attributes"):
        prune_html("<p>x</p>" * _REPEATS + wide)


def test_merged_root_attributes_run_no_nesting_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    _forbid(monkeypatch, *_COSTLY)
    with pytest.raises(TooManyAttributesError, match="<html> and <body> tags have"):
        prune_html("".join(f"<html a{i}>" for i in range(_REPEATS)) + "x")


@pytest.mark.usefixtures("no_headroom")
def test_attributes_charged_with_the_clones_are_checked_before_the_name_lookups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The page's tags and attributes fit its budget, and so do its tags and clones (patched: a
    megabyte), but not all three: refused once the clones are known, before the name lookups, and its
    attributes counted once for both checks."""
    page = _links_page(600_000)  # a budget of 7.1 MB: tags 4.0 MB, attributes 2.5 MB
    _forbid(monkeypatch, "estimate_name_lookups", "text_growth_memory")
    monkeypatch.setattr(prune, "reconstruction_bytes", lambda document, limit=None: 1_000_000)
    counted: list[int] = []

    def counting(document: str | bytes) -> int:
        counted.append(attributes.count_attributes(document))
        return counted[-1]

    monkeypatch.setattr(prune, "count_attributes", counting)
    with pytest.raises(InputTooLargeError, match=f"page has {_REPEATS + 2} tags and {_REPEATS} attributes"):
        prune_html(page)
    assert counted == [_REPEATS]
