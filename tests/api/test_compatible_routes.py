"""The OpenAI- and TEI-compatible routes as those clients use them: what they send that these models
cannot take is refused with what to send instead, and the metadata they look up is there."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import SettingsFactory, app_client
from tests.api.pages import long_page, page
from tests.factories.checkpoint import TINY_MAX_LENGTH

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.mark.parametrize(
    ("route", "field"), [("/v1/embeddings", "input"), ("/embed", "inputs"), ("/embeddings", "input")]
)
@pytest.mark.parametrize("ids", [[101, 2023, 102], [[101, 2023], [101, 102]]])
async def test_token_ids_are_refused_with_what_to_send_instead(
    client: httpx.AsyncClient, route: str, field: str, ids: list[object]
) -> None:
    """langchain-openai sends tiktoken's ids unless check_embedding_ctx_length=False; the 422 said only
    "input.str: Input should be a valid string"."""
    response = await client.post(route, json={field: ids})
    assert response.status_code == 422 and response.json()["error"]["code"] == "validation_error"
    message = response.json()["error"]["message"]
    assert message.startswith(f"{field}: token ids are not accepted: send the HTML pages as strings"), message
    assert "check_embedding_ctx_length=False" in message


@pytest.mark.parametrize(("route", "field"), [("/v1/embeddings", "input"), ("/embed", "inputs")])
@pytest.mark.parametrize("shape", ["flat", "nested"])
async def test_a_real_pages_worth_of_token_ids_is_refused_as_token_ids(
    client: httpx.AsyncClient, route: str, field: str, shape: str
) -> None:
    """A page is 10k-100k tiktoken ids: past the body's bound on list items, which had answered "send
    only the fields the route reads" before the ids were looked at."""
    ids = list(range(12_000))
    response = await client.post(
        route, json={"model": "m", field: ids if shape == "flat" else [ids[:6000], ids]}
    )
    assert response.status_code == 422 and response.json()["error"]["code"] == "validation_error"
    message = response.json()["error"]["message"]
    assert message.startswith(f"{field}: token ids are not accepted: send the HTML pages as strings"), message


async def test_a_list_of_non_strings_that_are_not_ids_keeps_the_type_error(client: httpx.AsyncClient) -> None:
    for value in ([True, False], [1.5], ["<p>a</p>", 3], [[]]):
        response = await client.post("/v1/embeddings", json={"input": value})
        assert response.status_code == 422, value
        assert "token ids" not in response.json()["error"]["message"], value


async def test_the_openai_route_takes_truncate_as_tei_names_it(settings_for: SettingsFactory) -> None:
    """A server that refuses over-long pages told OpenAI clients to "allow truncation", which the route
    had no way to ask for: `extra_body={"truncate": True}` was ignored."""
    async with app_client(settings_for(truncate=False)) as client:
        refused = await client.post("/v1/embeddings", json={"input": long_page()})
        assert refused.status_code == 422 and refused.json()["error"]["code"] == "too_many_tokens"
        cut = await client.post("/v1/embeddings", json={"input": long_page(), "truncate": True})
        assert cut.status_code == 200, cut.text
        assert cut.json()["usage"]["prompt_tokens"] == TINY_MAX_LENGTH
        kept = await client.post("/v1/embeddings", json={"input": long_page(), "truncate": False})
        assert kept.status_code == 422
        wrong = await client.post("/v1/embeddings", json={"input": page(1), "truncate": "yes"})
        assert wrong.status_code == 422 and wrong.json()["error"]["message"].startswith("truncate:")


async def test_left_truncation_is_refused_saying_so(client: httpx.AsyncClient) -> None:
    for direction in ("left", "Left"):
        body = {"inputs": page(1), "truncate": True, "truncation_direction": direction}
        response = await client.post("/embed", json=body)
        assert response.status_code == 422
        message = response.json()["error"]["message"]
        assert message.startswith("truncation_direction: left truncation is not supported"), message
    for direction in ("right", "Right"):
        body = {"inputs": page(1), "truncation_direction": direction}
        assert (await client.post("/embed", json=body)).status_code == 200
    assert (
        await client.post("/embed", json={"inputs": page(1), "truncation_direction": "up"})
    ).status_code == 422


async def test_the_model_list_names_the_one_model(client: httpx.AsyncClient) -> None:
    """`client.models.list()` and tools that probe `/v1/models` before embedding got 404."""
    for route in ("/v1/models", "/models"):
        response = await client.get(route)
        assert response.status_code == 200, route
        assert response.json() == {
            "object": "list",
            "data": [{"id": "tiny-test", "object": "model", "created": 0, "owned_by": "htmllm"}],
        }


async def test_the_served_model_can_be_looked_up_by_name_and_another_is_a_404_naming_it(
    client: httpx.AsyncClient,
) -> None:
    """`client.models.retrieve(name)`, which tools call before they embed, had a bare 404 "Not Found"."""
    for prefix in ("/v1/models", "/models"):
        response = await client.get(f"{prefix}/tiny-test")
        assert response.status_code == 200, prefix
        assert response.json() == {"id": "tiny-test", "object": "model", "created": 0, "owned_by": "htmllm"}
        other = await client.get(f"{prefix}/text-embedding-3-small")
        assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
        assert "'text-embedding-3-small'" in other.json()["error"]["message"]
        assert "this server runs 'tiny-test'" in other.json()["error"]["message"]
    metrics = (await client.get("/metrics")).text
    assert 'route="/v1/models/{model_id:path}"' in metrics and 'route="/models/{model_id:path}"' in metrics


async def test_the_model_list_needs_the_api_key_as_embeddings_do(settings_for: SettingsFactory) -> None:
    async with app_client(settings_for(api_key="k")) as client:
        assert (await client.get("/v1/models")).status_code == 401
        assert (await client.get("/v1/models", headers={"authorization": "Bearer k"})).status_code == 200
        assert (await client.get("/v1/models/tiny-test")).status_code == 401
        lookup = await client.get("/v1/models/tiny-test", headers={"authorization": "Bearer k"})
        assert lookup.status_code == 200


async def test_info_has_the_keys_tei_clients_read(client: httpx.AsyncClient) -> None:
    info = (await client.get("/info")).json()
    assert info["model_id"] == info["model"] == "tiny-test"
    assert info["model_type"] == {"embedding": {"pooling": "cls"}}
    assert info["max_input_length"] == info["max_length"] == TINY_MAX_LENGTH
    limits = info["limits"]
    assert info["max_client_batch_size"] == limits["max_documents"] == 64
    assert info["max_batch_tokens"] == limits["max_batch_tokens"]
    assert info["auto_truncate"] is limits["truncate"] is True


async def test_too_many_inputs_say_how_to_split_them(settings_for: SettingsFactory) -> None:
    """langchain's default chunk_size is 1,000; the 422 named only the server's setting."""
    async with app_client(settings_for(max_documents=2)) as client:
        response = await client.post("/v1/embeddings", json={"input": [page(i) for i in range(3)]})
        assert response.status_code == 422 and response.json()["error"]["code"] == "too_many_documents"
        assert response.json()["error"]["message"] == (
            "the request has 3 documents; the limit is 2 (HTMLLM_MAX_DOCUMENTS): send them in requests of "
            "at most 2 (an OpenAI client's batch, langchain's chunk_size, llama-index's embed_batch_size)"
        )


async def test_every_model_route_names_the_checkpoint_that_answered(client: httpx.AsyncClient) -> None:
    """Through a rollout two models answer behind one Service: each answer names its checkpoint (/info's
    `checkpoint_sha256`), so that a crawler storing vectors can tell which model made them."""
    sha256 = (await client.get("/info")).json()["checkpoint_sha256"]
    html = page(0)
    answers = [
        await client.post("/v1/embed", json={"documents": [{"html": html}]}),
        await client.post("/v1/embed", content=html, headers={"content-type": "text/html"}),
        await client.post("/v1/embeddings", json={"input": html}),
        await client.post("/embeddings", json={"input": html}),
        await client.post("/embed", json={"inputs": html}),
        await client.post("/", json={"inputs": html}),
        await client.post("/invocations", json={"inputs": html}),
        await client.post("/v1/preprocess", json={"documents": [{"html": html}]}),
    ]
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-checkpoint-sha256"] == sha256, answer.request.url
    extract = await client.post("/v1/extract", json={"documents": [{"html": html}]})
    assert extract.status_code == 200 and "x-checkpoint-sha256" not in extract.headers  # no model runs
