"""Large answers are serialized off the event loop; small ones on it; both as FastAPI would write them."""

from __future__ import annotations

import asyncio
import json
import threading

from pydantic import BaseModel, field_serializer

from service.api.rendering import INLINE_CHARS, json_response, render_json
from service.api.schemas import ExtractionOut, ExtractResponse, ExtractResult


class _Recorded(BaseModel):
    """A model that notes which thread serialized it."""

    text: str

    @field_serializer("text")
    def _note_thread(self, value: str) -> str:
        _threads.append(threading.get_ident())
        return value


_threads: list[int] = []


def _serialized_on(text: str, text_chars: int) -> tuple[int, int, bytes]:
    async def main() -> tuple[int, bytes]:
        response = await json_response(_Recorded(text=text), text_chars=text_chars, headers={"x-a": "1"})
        assert response.headers["x-a"] == "1"
        assert response.media_type == "application/json"
        return threading.get_ident(), bytes(response.body)

    _threads.clear()
    loop_thread, body = asyncio.run(main())
    assert len(_threads) == 1
    return loop_thread, _threads[0], body


def test_a_large_answer_is_serialized_off_the_loop() -> None:
    text = 'é"<x>' * (INLINE_CHARS // 4)
    loop_thread, serializer_thread, body = _serialized_on(text, len(text))
    assert serializer_thread != loop_thread
    assert json.loads(body) == {"text": text}


def test_a_small_answer_is_serialized_on_the_loop() -> None:
    loop_thread, serializer_thread, body = _serialized_on("short", 5)
    assert serializer_thread == loop_thread
    assert json.loads(body) == {"text": "short"}


def test_rendered_as_fastapi_writes_a_response_model() -> None:
    """None and default fields are written, not dropped (clients read `error: null`)."""
    out = ExtractionOut(
        extractor="union", chosen=None, text=None, words=0, passed=False, language=None, encoding=None
    )
    answer = ExtractResponse(data=[ExtractResult(id=None, extractions=[out])])
    assert json.loads(render_json(answer)) == answer.model_dump(mode="json")
    assert json.loads(render_json(answer))["data"][0]["extractions"][0]["error"] is None
