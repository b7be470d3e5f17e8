"""tests/deploy/setting_schemas.py's text patterns for bounded settings, against the numbers they spell.

The settings in seconds have an upper bound (`MAX_DURATION_S`, a day): a request timeout of 1e12 was taken
at start and failed every request. The chart refuses what the service refuses, so the pattern of such a
setting's text must admit exactly the decimals within its bounds; each is checked here against every
whole number from 0 past the bound (every third, far from both), with and without a leading zero, a
fraction or one of zeros.
"""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from service.api.settings import MAX_DURATION_S, Settings
from tests.deploy.setting_schemas import _decimal_text, _integer_text, value_schema

# Bounds of every shape: one digit more, a round one, all nines, the chart's.
MAXIMA = [10, 19, 99, 100, 101, 909, 1000, 20_000, MAX_DURATION_S]


def _texts(maximum: int) -> list[str]:
    """Decimal text of the whole numbers to a little past `maximum`, in the forms people write and a few
    more (those far from 0 and from `maximum` only as digits, and only every third), and text that is no
    plain decimal."""
    texts = ["0.000", "00.001", ".5", "5.", "", "1e3", "+4", "-1", " 5", "8 6400", f"{maximum}.0001"]
    for number in range(maximum + 120):
        if number < 1200 or maximum - number < 1200:
            texts += [str(number), f"0{number}", f"{number}.0", f"{number}.5", f"{number}.05", f"{number}.00"]
        elif number % 3 == 0:
            texts.append(str(number))
    return texts


def _within(text: str, *, low: Decimal, low_excluded: bool, high: int, whole: bool) -> bool:
    """Whether `text` is plain decimal digits (a fraction too, unless `whole`) spelling a value within
    the bounds."""
    if not re.fullmatch(r"[0-9]+" if whole else r"[0-9]+(\.[0-9]+)?", text):
        return False
    value = Decimal(text)
    return (value > low if low_excluded else value >= low) and value <= high


@pytest.mark.parametrize("maximum", MAXIMA)
@pytest.mark.parametrize("positive", [True, False])
def test_a_decimal_pattern_admits_exactly_the_values_within_its_bounds(maximum: int, positive: bool) -> None:
    pattern = re.compile(_decimal_text(positive=positive, maximum=maximum))
    wrong = [
        text
        for text in _texts(maximum)
        if bool(pattern.fullmatch(text))
        != _within(text, low=Decimal(0), low_excluded=positive, high=maximum, whole=False)
    ]
    assert wrong == []


@pytest.mark.parametrize("maximum", MAXIMA)
@pytest.mark.parametrize("minimum", [0, 1, 2])
def test_an_integer_pattern_admits_exactly_the_values_within_its_bounds(maximum: int, minimum: int) -> None:
    pattern = re.compile(_integer_text(minimum, maximum))
    wrong = [
        text
        for text in _texts(maximum)
        if bool(pattern.fullmatch(text))
        != _within(text, low=Decimal(minimum), low_excluded=False, high=maximum, whole=True)
    ]
    assert wrong == []


def test_every_duration_setting_is_bounded_by_a_day_in_its_schema() -> None:
    """Each setting in seconds: a number past a day, or its text, is refused where the service refuses
    it (the service exits 2 at start, every pod in CrashLoopBackOff)."""
    durations = [name for name in Settings.model_fields if name.endswith("_s")]
    assert len(durations) == 11
    for name in durations:
        schema = value_schema(f"HTMLLM_{name.upper()}", Settings.model_fields[name])
        number, text = schema["anyOf"]
        assert number["maximum"] == MAX_DURATION_S, name
        assert re.fullmatch(text["pattern"], str(MAX_DURATION_S)), name
        assert not re.fullmatch(text["pattern"], str(MAX_DURATION_S + 1)), name
