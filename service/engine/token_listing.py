"""A page's tokens as text-embeddings-inference's /tokenize lists them: each token's id, its text and its
character offsets into the pruned HTML, [CLS] and [SEP] around them on request, rendered as JSON.

Apart from the route (`service.api.routers.tei`) because the Engine runs it (`Engine.tokenize`), on the
preprocessing threads under the same admission as every page: listed on the API's own threads, any number
of /tokenize calls of big pages had run there at once, outside the queue and its 429.
"""

from __future__ import annotations

import pydantic_core

from service.core.tokenizer import HtmlTokenizer


def rendered_tokens(
    tokenizer: HtmlTokenizer, pruned: str, limit: int, add_special_tokens: bool
) -> tuple[bytes, bool]:
    """A page's list as JSON (`token_list`), and whether it is whole: a page's tokens as dicts take ~400
    bytes each, so the list is rendered where it is made."""
    tokens, whole = token_list(tokenizer, pruned, limit=limit, add_special_tokens=add_special_tokens)
    return pydantic_core.to_json(tokens), whole


def token_list(
    tokenizer: HtmlTokenizer, pruned: str, *, limit: int, add_special_tokens: bool
) -> tuple[list[dict[str, object]], bool]:
    """The tokens of one pruned page as TEI lists them, [CLS] and [SEP] included at most `limit`, and
    whether that is all of them.

    The ids are those `tokenizer.encode` gives the model; the offsets are those the tokenizer's bounded
    read is certain of (`HtmlTokenizer.encode_with_offsets`), null past them: encoding a 16 MB page of
    one word whole for them took 6 s and 1 GB, for one [UNK].
    """
    encoded = tokenizer.encode_with_offsets(pruned, max_length=limit)
    tokens = [
        _token(token_id, pruned, offsets, tokenizer)
        for token_id, offsets in zip(encoded.ids, encoded.offsets, strict=True)
    ]
    if add_special_tokens:
        special = tokenizer.special_ids
        tokens = [_special(special.cls, tokenizer), *tokens, _special(special.sep, tokenizer)]
    return tokens, not encoded.truncated


def _token(
    token_id: int, pruned: str, offsets: tuple[int, int] | None, tokenizer: HtmlTokenizer
) -> dict[str, object]:
    if offsets is None:
        text = tokenizer.id_to_token(token_id) or ""
        return {"id": token_id, "text": text, "special": False, "start": None, "stop": None}
    start, stop = offsets
    return {"id": token_id, "text": pruned[start:stop], "special": False, "start": start, "stop": stop}


def _special(token_id: int, tokenizer: HtmlTokenizer) -> dict[str, object]:
    text = tokenizer.id_to_token(token_id) or ""
    return {"id": token_id, "text": text, "special": True, "start": None, "stop": None}
