"""Every setting in seconds is at most a day (`MAX_DURATION_S`), refused past it at start with exit 2.

HTMLLM_REQUEST_TIMEOUT_S had no upper bound: 1e12 was taken at start, and every /v1/embed answered 422
("deadline is 1000000000000 s from now, more than a year"), the Engine's refusal of a deadline it takes
for a time.time() (`MAX_DEADLINE_AHEAD_S`); HTMLLM_DRAIN_TIMEOUT_S=inf crashed the start with an
OverflowError once the model had loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from service.api import main as api_main
from service.api.settings import MAX_DURATION_S, Settings
from service.engine.engine import MAX_DEADLINE_AHEAD_S
from tests.api.conftest import SettingsFactory, app_client
from tests.api.pages import page

DURATIONS = [name for name in Settings.model_fields if name.endswith("_s")]


def test_every_setting_in_seconds_is_at_most_a_day() -> None:
    assert len(DURATIONS) == 11  # a new one is bounded too, or this says why not
    for name in DURATIONS:
        longest: dict[str, Any] = {name: MAX_DURATION_S}
        assert getattr(Settings(**longest), name) == MAX_DURATION_S
        for wrong in (MAX_DURATION_S + 1, 1e12, float("inf")):
            given: dict[str, Any] = {name: wrong}
            with pytest.raises(ValidationError, match=name):
                Settings(**given)


@pytest.mark.parametrize(
    ("name", "value"), [("HTMLLM_REQUEST_TIMEOUT_S", "1e12"), ("HTMLLM_DRAIN_TIMEOUT_S", "inf")]
)
def test_a_duration_past_a_day_is_one_line_and_exit_2_before_the_model_loads(
    name: str,
    value: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(name, value)
    monkeypatch.setenv("HTMLLM_MODEL_PATH", str(tmp_path / "none"))  # taken, it would be exit 1 for this
    assert api_main.main([]) == 2
    assert capsys.readouterr().err == (
        f"htmllm serve: invalid settings: {name}: Input should be less than or equal to {MAX_DURATION_S} "
        f"(got {value!r})\n"
    )


async def test_the_longest_request_timeout_embeds(settings_for: SettingsFactory) -> None:
    """The bound is one the Engine takes a deadline from (a day, against its year)."""
    assert MAX_DURATION_S < MAX_DEADLINE_AHEAD_S
    async with app_client(settings_for(request_timeout_s=MAX_DURATION_S)) as client:
        response = await client.post("/v1/embed", json={"documents": [{"html": page(1)}]})
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["documents"] == 1


def test_the_batcher_wait_is_at_most_a_day_too() -> None:
    """HTMLLM_MAX_WAIT_MS=inf had started, /ready said ready, and every request was answered 504 after
    the request timeout: a lone document waited for batch mates for ever."""
    assert Settings(max_wait_ms=MAX_DURATION_S * 1000).max_wait_ms == MAX_DURATION_S * 1000
    for wrong in (MAX_DURATION_S * 1000 + 1, 1e12, float("inf")):
        with pytest.raises(ValidationError, match="max_wait_ms"):
            Settings(max_wait_ms=wrong)
