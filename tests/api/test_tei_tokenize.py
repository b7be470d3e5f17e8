"""text-embeddings-inference's `POST /tokenize` and `POST /decode`: clients count a page's tokens before
they send it. The tokens are the model's: those of the pruned page, as /v1/preprocess counts them, with
offsets into the pruned HTML; limits, errors and the API key as on the other model routes."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from pydantic import BaseModel

from service.api.openapi import install_openapi, json_body_openapi
from service.core.preparation import count_limit
from service.core.tokenizer import HtmlTokenizer
from service.engine.token_listing import token_list
from tests.api.conftest import SettingsFactory, app_client
from tests.api.pages import long_page, page
from tests.factories.checkpoint import TINY_MAX_LENGTH
from tests.factories.tokenizer import WORDS, build_tiny_tokenizer, generate_pruned_page

on_module_loop = pytest.mark.asyncio(loop_scope="module")

UNICODE_PAGE = (
    "<html><body><h1>Příliš   žluťoučký kůň</h1><p>BERT reads [SEP] and [CLS] as text 😀 e\u0301 "
    "東京の天気</p><p><b>Prague</b> weather</p></body></html>"
)
# One word far longer than the offsets are computed for (8 characters a token of the 2,048 a list holds),
# between two that are not.
GIANT_WORD_PAGE = "<p>weather " + "a" * 40_000 + " sport</p>"


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint: Path) -> HtmlTokenizer:
    return HtmlTokenizer.from_file(tiny_checkpoint)


async def preprocessed(client: httpx.AsyncClient, pages: list[str]) -> list[dict[str, Any]]:
    response = await client.post("/v1/preprocess", json={"documents": [{"html": p} for p in pages]})
    assert response.status_code == 200, response.text
    data: list[dict[str, Any]] = response.json()["data"]
    return data


def assert_offsets_slice(tokens: list[dict[str, Any]], pruned: str) -> None:
    """Every token with offsets is the pruned HTML from `start` to `stop`, in order."""
    last = 0
    for token in tokens:
        if token["start"] is None:
            continue
        assert not token["special"], token
        assert last <= token["start"] < token["stop"], token
        assert pruned[token["start"] : token["stop"]] == token["text"], token
        last = token["stop"]


@on_module_loop
async def test_the_tokens_are_the_pruned_pages_as_the_model_reads_them(
    client: httpx.AsyncClient, tokenizer: HtmlTokenizer
) -> None:
    pages = [page(1), page(2, paragraphs=8), UNICODE_PAGE]
    response = await client.post("/tokenize", json={"inputs": pages})
    assert response.status_code == 200, response.text
    lists = response.json()
    expected = await preprocessed(client, pages)
    assert len(lists) == len(pages)
    special = tokenizer.special_ids
    for tokens, out in zip(lists, expected, strict=True):
        assert out["tokens_exact"] and len(tokens) == out["tokens"]  # /v1/preprocess's count
        assert [t["id"] for t in tokens] == tokenizer.encode(out["html"]).ids  # the model's ids
        assert tokens[0] == {"id": special.cls, "text": "[CLS]", "special": True, "start": None, "stop": None}
        assert tokens[-1] == {
            "id": special.sep,
            "text": "[SEP]",
            "special": True,
            "start": None,
            "stop": None,
        }
        assert all(t["start"] is not None and not t["special"] for t in tokens[1:-1])
        assert_offsets_slice(tokens, out["html"])
    # The page's text "[SEP]" is text, never the control token.
    assert not any(t["special"] for t in lists[2][1:-1])
    assert "".join(t["text"] for t in lists[2][1:-1]).count("[SEP]") == 1
    info = (await client.get("/info")).json()
    assert response.headers["x-checkpoint-sha256"] == info["checkpoint_sha256"]
    assert response.headers["x-tokens-exact"] == "true"
    assert float(response.headers["x-preprocess-time"]) >= 0


@on_module_loop
async def test_a_batch_lists_what_single_requests_list(client: httpx.AsyncClient) -> None:
    pages = [page(3), UNICODE_PAGE, page(4)]
    batch = (await client.post("/tokenize", json={"inputs": pages})).json()
    singles = [(await client.post("/tokenize", json={"inputs": p})).json() for p in pages]
    assert all(len(single) == 1 for single in singles)
    assert batch == [single[0] for single in singles]


@on_module_loop
async def test_without_special_tokens_only_the_pages_tokens_are_listed(client: httpx.AsyncClient) -> None:
    framed = (await client.post("/tokenize", json={"inputs": page(5)})).json()[0]
    bare = await client.post("/tokenize", json={"inputs": [page(5)], "add_special_tokens": False})
    assert bare.status_code == 200
    assert bare.json() == [framed[1:-1]]


@on_module_loop
async def test_a_page_past_the_count_limit_lists_its_first_tokens_and_says_so(
    client: httpx.AsyncClient, tokenizer: HtmlTokenizer
) -> None:
    """Not truncated to the model's length (TEI's /tokenize is not), but bounded where /v1/preprocess
    stops counting: a page of megabytes would list millions of tokens."""
    response = await client.post("/tokenize", json={"inputs": [page(6), long_page()]})
    assert response.status_code == 200
    assert response.headers["x-tokens-exact"] == "false"
    short, long = response.json()
    (out,) = await preprocessed(client, [long_page()])
    limit = count_limit(TINY_MAX_LENGTH)
    assert not out["tokens_exact"] and out["tokens"] > limit == len(long)
    assert [t["id"] for t in long] == tokenizer.encode(out["html"], max_length=limit).ids
    assert all(t["start"] is not None for t in long[1:-1])  # the offsets of a page of ordinary words
    assert_offsets_slice(long, out["html"])
    alone = await client.post("/tokenize", json={"inputs": page(6)})
    assert alone.headers["x-tokens-exact"] == "true" and alone.json() == [short]


@on_module_loop
async def test_tokens_past_the_characters_read_for_offsets_are_listed_without_them(
    client: httpx.AsyncClient, tokenizer: HtmlTokenizer
) -> None:
    """A giant word is one [UNK]: its page holds few tokens in many characters, and encoding all of them
    with offsets took seconds and a gigabyte for a 16 MB page."""
    response = await client.post("/tokenize", json={"inputs": GIANT_WORD_PAGE})
    assert response.status_code == 200 and response.headers["x-tokens-exact"] == "true"
    (tokens,) = response.json()
    (out,) = await preprocessed(client, [GIANT_WORD_PAGE])
    assert len(tokens) == out["tokens"]
    assert [t["id"] for t in tokens] == tokenizer.encode(out["html"]).ids
    unk = [t["id"] for t in tokens].index(tokenizer.special_ids.unk)
    assert tokens[unk]["text"] == "[UNK]" and not tokens[unk]["special"]
    # Before the giant word: offsets; from it on (8 characters a token: past them) none.
    assert "".join(t["text"] for t in tokens[1:unk]) == "<p>weather"
    assert_offsets_slice(tokens, out["html"])
    assert all(t["start"] is not None for t in tokens[1:unk])
    assert all(t["start"] is None and t["stop"] is None for t in tokens[unk:])
    assert tokens[-2]["text"] == tokenizer.id_to_token(tokens[-2]["id"]) == "</p>"


@pytest.mark.parametrize("limit", [32, 64, 2048])
def test_offsets_are_those_of_the_whole_text_wherever_the_prefix_is_cut(limit: int) -> None:
    """The offsets of a page longer than what is encoded for them are cut at any character: those
    given are the whole text's (combining marks, CJK and long words near the cut included); the rest,
    a suffix of the list, have none."""
    tokenizer = build_tiny_tokenizer()
    rng = random.Random(limit)
    pieces = [*WORDS, "e\u0301\u0301", "東京の天気", "x" * 150, "Příliš", "<p>", "</p>", " ", "  "]
    for _ in range(12):
        text = generate_pruned_page(rng) + " ".join(rng.choice(pieces) for _ in range(rng.randint(50, 400)))
        whole = tokenizer.backend.encode_batch([text], add_special_tokens=False)[0]
        tokens, exact = token_list(tokenizer, text, limit=limit, add_special_tokens=False)
        assert exact == (len(whole.ids) <= limit - 2)
        assert [t["id"] for t in tokens] == whole.ids[: limit - 2]
        offsets = [(t["start"], t["stop"]) for t in tokens]
        known = [o for o in offsets if o != (None, None)]
        assert offsets[: len(known)] == known == whole.offsets[: len(known)]
        assert_offsets_slice(tokens, text)


def test_a_word_cut_by_the_prefix_gets_the_whole_words_offsets_or_none() -> None:
    """A word too long to read is one [UNK] in the prefix too, with the same id: only the offsets tell
    the cut word from the whole one."""
    tokenizer = build_tiny_tokenizer()
    limit = 32  # offsets from the first 8 * 32 = 256 characters
    text = "the " * 10 + "z" * 300 + " the" * 40  # the long word from character 40 to 340
    whole = tokenizer.backend.encode_batch([text], add_special_tokens=False)[0]
    tokens, _ = token_list(tokenizer, text, limit=limit, add_special_tokens=False)
    unk = [t["id"] for t in tokens].index(tokenizer.special_ids.unk)
    assert whole.offsets[unk] == (39, 340)  # with the space before it
    assert tokens[unk]["start"] is None and tokens[unk]["text"] == "[UNK]"
    known = [(t["start"], t["stop"]) for t in tokens[:unk]]
    assert known == whole.offsets[:unk]


# A letter, U+3099 (a kana mark, a word of its own), a run of marks of a lower class than U+0306, then
# U+0306, which NFC composes with the letter across the run: "и" becomes "й", and the offsets of every
# token after it move. A cut inside the run reads the letter uncomposed, far (the run's length) before it.
COMPOSED_ACROSS = "и\u3099" + "\u0316" * 20_000 + "\u0306"


@on_module_loop
async def test_combining_marks_at_the_offsets_cut_give_the_whole_pages_offsets_or_none(
    client: httpx.AsyncClient, tokenizer: HtmlTokenizer
) -> None:
    """The prefix read for offsets is cut inside the run of marks (at 8 characters a token of the 2,048
    a list holds): the tokens before the run, both [UNK] whether the letter is composed or not, were
    listed with the uncomposed prefix's offsets, one character off the whole page's."""
    html = "<p>" + "the " * 1000 + COMPOSED_ACROSS + " sport" * 100 + "</p>"
    response = await client.post("/tokenize", json={"inputs": html, "add_special_tokens": False})
    assert response.status_code == 200, response.text
    (tokens,) = response.json()
    (out,) = await preprocessed(client, [html])
    pruned = out["html"]
    assert 0 < pruned.index(COMPOSED_ACROSS) < 16_000 < pruned.index(COMPOSED_ACROSS) + len(COMPOSED_ACROSS)
    whole = tokenizer.backend.encode_batch([pruned], add_special_tokens=False)[0]
    assert [t["id"] for t in tokens] == whole.ids[: len(tokens)]
    offsets = [(t["start"], t["stop"]) for t in tokens]
    known = [o for o in offsets if o != (None, None)]
    assert len(known) > 900  # the words before the run
    assert offsets[: len(known)] == known == whole.offsets[: len(known)]
    assert_offsets_slice(tokens, pruned)


@on_module_loop
@pytest.mark.parametrize(
    ("body", "status", "code", "says"),
    [
        ({"inputs": []}, 400, "empty_input", "no documents"),
        ({"inputs": [101, 2023, 102]}, 422, "validation_error", "token ids are not accepted"),
        ({"inputs": "<p>a</p>", "prompt_name": "query"}, 422, "validation_error", "defines no prompts"),
        ({"inputs": "<p>a</p>", "add_special_tokens": 0}, 422, "validation_error", "add_special_tokens"),
        ({"inputs": 5}, 422, "validation_error", "inputs"),
        ({}, 422, "validation_error", "inputs"),
    ],
)
async def test_bad_tokenize_requests_are_typed_errors(
    client: httpx.AsyncClient, body: dict[str, Any], status: int, code: str, says: str
) -> None:
    response = await client.post("/tokenize", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert says in response.json()["error"]["message"]


@on_module_loop
async def test_a_raw_page_is_refused_as_the_other_tei_routes_refuse_it(client: httpx.AsyncClient) -> None:
    for headers in ({"content-type": "text/html"}, {}):
        response = await client.post("/tokenize", content=b"<html><p>a</p></html>", headers=headers)
        assert response.status_code == 415 and response.json()["error"]["code"] == "unsupported_media_type"


@on_module_loop
async def test_decode_gives_back_the_text_of_the_tokens(
    client: httpx.AsyncClient, tokenizer: HtmlTokenizer
) -> None:
    pages = [page(7), UNICODE_PAGE]
    lists = (await client.post("/tokenize", json={"inputs": pages})).json()
    ids = [[t["id"] for t in tokens] for tokens in lists]
    one = await client.post("/decode", json={"ids": ids[0]})
    assert one.status_code == 200 and one.json() == [tokenizer.decode(ids[0])]  # a list of one, as TEI
    assert one.json()[0].startswith("<html><title>Page 7</title>")
    info = (await client.get("/info")).json()
    assert one.headers["x-checkpoint-sha256"] == info["checkpoint_sha256"]
    both = await client.post("/decode", json={"ids": ids})
    assert both.json() == [tokenizer.decode(i) for i in ids]
    kept = await client.post("/decode", json={"ids": ids[0], "skip_special_tokens": False})
    (text,) = kept.json()
    assert text.startswith("[CLS]") and text.endswith("[SEP]")
    nothing = await client.post("/decode", json={"ids": [[], [tokenizer.special_ids.cls]]})
    assert nothing.json() == ["", ""]


@on_module_loop
@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"ids": []}, 400, "ids is empty"),
        ({"ids": [5, 10**6]}, 422, "ids[1]: token id 1000000 is outside the vocabulary"),
        ({"ids": [[5], [-1]]}, 422, "ids[1][0]: token id -1 is outside the vocabulary"),
        ({"ids": [5, [6]]}, 422, "not a mix of both"),
        ({"ids": [True]}, 422, "token ids are integers"),
        ({"ids": "5"}, 422, "expected a list of token ids"),
        ({"ids": [5], "skip_special_tokens": "no"}, 422, "skip_special_tokens"),
    ],
)
async def test_bad_decode_requests_are_typed_errors(
    client: httpx.AsyncClient, body: dict[str, Any], status: int, says: str
) -> None:
    response = await client.post("/decode", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == ("empty_input" if status == 400 else "validation_error")
    assert says in response.json()["error"]["message"]


@on_module_loop
async def test_the_limits_and_the_key_are_the_model_routes(settings_for: SettingsFactory) -> None:
    one: list[tuple[str, dict[str, Any]]] = [
        ("/tokenize", {"inputs": ["<p>a</p>"]}),
        ("/decode", {"ids": [5]}),
    ]
    three: list[tuple[str, dict[str, Any]]] = [
        ("/tokenize", {"inputs": ["<p>a</p>"] * 3}),
        ("/decode", {"ids": [[5]] * 3}),
    ]
    async with app_client(settings_for(api_key="k1", max_documents=2)) as keyed:
        for route, body in one:
            refused = await keyed.post(route, json=body)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
            allowed = await keyed.post(route, json=body, headers={"authorization": "Bearer k1"})
            assert allowed.status_code == 200, route
        auth = {"authorization": "Bearer k1"}
        for route, body in three:
            response = await keyed.post(route, json=body, headers=auth)
            assert response.status_code == 422, route
            assert response.json()["error"]["code"] == "too_many_documents"


@on_module_loop
async def test_a_page_the_pruner_refuses_fails_named_by_its_index(client: httpx.AsyncClient) -> None:
    """The preprocessing and its limits are /v1/preprocess's, a failure named as there."""
    too_deep = "<div>" * 9000  # past the pruner's nesting cap
    tokenized = await client.post("/tokenize", json={"inputs": [page(1), too_deep]})
    assert tokenized.status_code == 422 and tokenized.json()["error"]["code"] == "preprocess_failed"
    assert tokenized.json()["error"]["message"].startswith("the document at index 1: page nests more than")


def test_the_document_has_the_routes_and_their_bodies(settings_for: SettingsFactory) -> None:
    from service.api.app import create_app

    doc = create_app(settings_for()).openapi()
    schemas = doc["components"]["schemas"]
    for path, model in (("/tokenize", "TeiTokenizeRequest"), ("/decode", "TeiDecodeRequest")):
        operation = doc["paths"][path]["post"]
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{model}" and model in schemas
    tokenize = doc["paths"]["/tokenize"]["post"]
    assert "pruned HTML" in tokenize["description"]
    assert tokenize["responses"]["200"]["headers"]["x-tokens-exact"]["required"]
    assert "pruned HTML" in schemas["TeiToken"]["properties"]["start"]["description"]
    assert schemas["TeiTokenizeRequest"]["properties"]["inputs"]["minItems"] == 1


def test_a_body_the_schemas_module_does_not_define_fails_the_document_loudly() -> None:
    """Bodies are found in service.api.schemas by the name the route gives; a `$ref` to nothing had
    been a document that no client generator could read."""

    class Elsewhere(BaseModel):
        value: int

    app = FastAPI()

    @app.post("/x", openapi_extra=json_body_openapi(Elsewhere))
    async def x(request: Request) -> None:
        return None

    install_openapi(app, description="d", auth=False)
    with pytest.raises(RuntimeError, match=r"'Elsewhere', which service\.api\.schemas does not define"):
        app.openapi()
