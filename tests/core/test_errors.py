"""`shown`: what an error message echoes of the names a caller sent."""

from __future__ import annotations

from service.core.errors import shown


def test_names_are_quoted_cut_and_counted() -> None:
    assert shown(["a", "b", "a"]) == "'a', 'b'"
    assert shown(["x" * 5_000_000]) == repr("x" * 40)
    assert shown([f"h{i}" for i in range(9)], most=2) == "'h0', 'h1', ... (9 in all)"


def test_names_of_other_types_are_shown_not_raised_on() -> None:
    """A library caller may send `heads=[1]`: slicing the int had raised a bare TypeError in place of
    the typed error the message was for."""
    assert shown([1]) == "1"
    assert shown([b"abc", None, 2.5]) == "b'abc', None, 2.5"
    assert shown([[1, 2], [1, 2]]) == "[1, 2], [1, 2]"  # unhashable: each counts as itself
    assert shown([10**5000]) == "<int>"  # (its repr raises past 4300 digits)
    assert len(shown([list(range(10**5))])) <= 45
