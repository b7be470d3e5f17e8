"""Request and response bodies of every route, in one place (and so in the OpenAPI document).

Our own routes reject unknown fields, so a misspelt option fails loudly; the OpenAI- and
text-embeddings-inference-compatible bodies ignore them, so existing clients work unchanged. Every
request body is read strictly: a value must have the type the document gives it (`"normalize": 0` or
`"min_words": "5"` is a 422, as it is for TEI and OpenAI, not read as false or 5); an integer may be
written `5.0`, as JSON Schema allows. Lists that must not be empty say so (`minItems`), though an empty
one is answered 400 `empty_input`, not 422.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, JsonValue, RootModel, WithJsonSchema
from pydantic_core import PydanticCustomError

from service.core.errors import ErrorCode, HtmllmError

EncodingFormat = Literal["float", "base64"]
OnError = Literal["fail", "report"]
Scores = dict[str, dict[str, float] | float]
# `encoding_format: base64`: an embedding as the base64 of its little-endian float32 bytes (OpenAI's).
Base64Embedding = Annotated[
    str,
    WithJsonSchema(
        {
            "type": "string",
            "contentEncoding": "base64",
            "description": "encoding_format base64: the little-endian float32 values, base64-encoded",
        }
    ),
]


def _integral(value: object) -> object:
    """A JSON number with no fraction as the int it is (JSON Schema's `integer` takes `5.0`); strict
    validation then refuses anything else, `"5"` and `true` included."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(_integral)]


# Also what a body of token ids too long to parse is answered (`service.api.documents.parse_json`).
TOKEN_IDS_MESSAGE = (
    "token ids are not accepted: send the HTML pages as strings "
    "(langchain-openai: OpenAIEmbeddings(check_embedding_ctx_length=False))"
)


def _not_token_ids(value: object) -> object:
    """OpenAI and TEI also take token ids (a list of ints, or of lists of ints). These models read HTML
    through their own tokenizer, so ids are refused with what to send instead: langchain-openai sends
    tiktoken's ids unless told not to, and "input.str: Input should be a valid string" did not say so."""
    if isinstance(value, list) and value:
        first = value[0]
        if type(first) is int or (isinstance(first, list) and first and type(first[0]) is int):
            raise PydanticCustomError("token_ids", TOKEN_IDS_MESSAGE)
    return value


def _right_only(value: object) -> object:
    """TEI's `truncation_direction: left` answered with why, not "Input should be 'Right' or 'right'"."""
    if value in ("Left", "left"):
        raise PydanticCustomError(
            "truncation_direction",
            "left truncation is not supported: an over-long page keeps its beginning (truncate on the right)",
        )
    return value


def _id_lists(value: object) -> object:
    """TEI's `ids`, a list of ints or a list of lists of them, refused in those words when it is neither
    (pydantic's union named both branches by their internal validator names)."""
    shape = "expected a list of token ids (integers), or a list of such lists"
    if not isinstance(value, list):
        raise PydanticCustomError("token_ids", shape)
    flat = all(not isinstance(item, list) for item in value)
    if not flat and not all(isinstance(item, list) for item in value):
        raise PydanticCustomError("token_ids", f"{shape}, not a mix of both")
    if not all(_is_integral(item) for item in (value if flat else (i for ids in value for i in ids))):
        raise PydanticCustomError("token_ids", "token ids are integers (0 up to the vocabulary's size)")
    return value


def _is_integral(value: object) -> bool:
    return (type(value) is int) or (isinstance(value, float) and value.is_integer())


# Token ids as TEI's `/decode` takes them: one text's, or a list of texts'.
TokenIds = Annotated[list[JsonInt] | list[list[JsonInt]], BeforeValidator(_id_lists)]
# HTML pages as OpenAI's `input` or TEI's `inputs`: one string or a list of them.
Pages = Annotated[str | list[str], BeforeValidator(_not_token_ids)]
# The route answers an empty list 400 `empty_input`; the document says it needs one item.
_NOT_EMPTY: dict[str, JsonValue] = {"minItems": 1}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ErrorDetail(BaseModel):
    code: ErrorCode
    message: str

    @classmethod
    def of(cls, error: HtmllmError) -> ErrorDetail:
        """A typed error as an entry of a batch reports it (`/v1/embed` `on_error: report`, `/v1/extract`)."""
        return cls(code=error.code, message=error.message)


class ErrorBody(BaseModel):
    """Every error response: `{"error": {"code", "message"}}`."""

    error: ErrorDetail


class DocumentIn(_Strict):
    """One page: its raw HTML (already text; raw bytes go in a `text/html` body instead)."""

    html: str
    id: str | None = Field(None, description="echoed back with the result")
    url: str | None = Field(None, description="where the page was crawled from (not fetched)")


class EmbedRequest(_Strict):
    documents: list[DocumentIn] = Field(
        description="the pages, at most the server's `max_documents`", json_schema_extra=_NOT_EMPTY
    )
    heads: list[str] | None = Field(None, description="task heads to score; null: all, []: none")
    normalize: bool = Field(True, description="L2-normalise the embeddings")
    truncate: bool | None = Field(
        None, description="cut documents past the model's length (null: the server's policy)"
    )
    encoding_format: EncodingFormat = Field(
        "float", description="base64: little-endian float32 bytes, base64-encoded"
    )
    on_error: OnError = Field(
        "fail",
        description="fail: a failing document fails the request with its error; report: it gets its own "
        "`error` in `data` and the others keep their results (at the request timeout, those done by then)",
    )


class EmbedResult(BaseModel):
    id: str | None
    embedding: list[float] | Base64Embedding | None = Field(
        description="floats, or base64 (`encoding_format`); null when the document failed"
    )
    scores: Scores = Field(description="per head: {label: probability} or a regression value")
    tokens: int | None = Field(description="tokens fed to the model, [CLS] and [SEP] included")
    truncated: bool | None
    error: ErrorDetail | None = Field(
        None, description="`on_error: report` only: why this document has no embedding"
    )


class EmbedUsage(BaseModel):
    documents: int = Field(description="documents embedded (failed ones not counted)")
    tokens: int


class EmbedResponse(BaseModel):
    model: str
    data: list[EmbedResult]
    usage: EmbedUsage


class OpenAIEmbeddingsRequest(BaseModel):
    """OpenAI's `POST /v1/embeddings` body; `input` holds HTML pages."""

    model_config = ConfigDict(extra="ignore", strict=True)

    input: Pages = Field(json_schema_extra=_NOT_EMPTY)
    model: str | None = None
    encoding_format: EncodingFormat = "float"
    dimensions: JsonInt | None = Field(None, description="must equal the model's embedding size when given")
    user: str | None = None
    truncate: bool | None = Field(
        None,
        description="htmllm's extension, named as TEI names it (OpenAI's clients send it in `extra_body`): "
        "cut an over-long page to the model's length (true) or refuse it with 422 (false); absent, the "
        "server's HTMLLM_TRUNCATE decides",
    )


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | Base64Embedding = Field(description="floats, or base64 (`encoding_format`)")
    index: int


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


class OpenAIModel(BaseModel):
    id: str = Field(description="the model's name, as `/info` gives it")
    object: Literal["model"] = "model"
    created: int = Field(default=0, description="OpenAI's creation time: 0, as a checkpoint records none")
    owned_by: str = "htmllm"


class OpenAIModelList(BaseModel):
    """OpenAI's `GET /v1/models`: clients and tools list models before they embed."""

    object: Literal["list"] = "list"
    data: list[OpenAIModel]


# TEI's `prompt_name`: a prompt to prepend that these models do not define.
PROMPT_NAME_DESCRIPTION = (
    "TEI's prompt to prepend: these models define none, so a name is a 422, never ignored"
)


class TeiEmbedRequest(BaseModel):
    """text-embeddings-inference's `POST /embed` body; `inputs` holds HTML pages."""

    model_config = ConfigDict(extra="ignore", strict=True)

    inputs: Pages = Field(json_schema_extra=_NOT_EMPTY)
    normalize: bool = True
    truncate: bool | None = None
    truncation_direction: Annotated[Literal["Right", "right"], BeforeValidator(_right_only)] = "Right"
    dimensions: JsonInt | None = Field(None, description="must equal the model's embedding size when given")
    prompt_name: str | None = Field(None, description=PROMPT_NAME_DESCRIPTION)


class TeiTokenizeRequest(BaseModel):
    """text-embeddings-inference's `POST /tokenize` body; `inputs` holds HTML pages."""

    model_config = ConfigDict(extra="ignore", strict=True)

    inputs: Pages = Field(json_schema_extra=_NOT_EMPTY)
    add_special_tokens: bool = Field(
        True, description="list the [CLS] and [SEP] that frame every page the model reads"
    )
    prompt_name: str | None = Field(None, description=PROMPT_NAME_DESCRIPTION)


class TeiToken(BaseModel):
    """One token of a page's pruned HTML, as TEI's `SimpleToken`."""

    id: int
    text: str = Field(
        description="the pruned HTML from `start` to `stop`; for [CLS] and [SEP], and a token listed without "
        "offsets, the token itself"
    )
    special: bool = Field(
        description="[CLS] or [SEP] (`add_special_tokens`); an [UNK] that stands for a word is not special"
    )
    start: int | None = Field(
        description="offset of the token's first character (Unicode code points) in the page's pruned HTML, "
        "what /v1/preprocess answers as `html`, not in the page sent; null for [CLS] and [SEP], and for "
        "tokens past the characters whose offsets are computed (a page of words too long to read, each "
        "one [UNK])"
    )
    stop: int | None = Field(description="offset just past the token's last character, as `start`")


class TeiTokenizeResponse(RootModel[list[list[TeiToken]]]):
    """One list of tokens per input, in order."""


class TeiDecodeRequest(BaseModel):
    """text-embeddings-inference's `POST /decode` body: token ids of this model's tokenizer."""

    model_config = ConfigDict(extra="ignore", strict=True)

    ids: TokenIds = Field(
        description="one text's ids, or a list of texts' ids (at most the server's `max_documents`)",
        json_schema_extra=_NOT_EMPTY,
    )
    skip_special_tokens: bool = Field(
        True, description="leave the special tokens out: [PAD], [UNK], [CLS], [SEP] and [MASK]"
    )


class PreprocessRequest(_Strict):
    documents: list[DocumentIn] = Field(json_schema_extra=_NOT_EMPTY)


class PreprocessResult(BaseModel):
    id: str | None
    html: str = Field(description="the pruned HTML the tokenizer sees")
    tokens: int = Field(
        description="tokens of the pruned HTML, [CLS] and [SEP] included, before truncation; counted until "
        "past 16 times the model's max length (see `tokens_exact`)"
    )
    tokens_exact: bool = Field(
        description="false: counting stopped, and the page has at least `tokens` tokens (a count without "
        "bound cost seconds and gigabytes on a page of megabytes)"
    )


class PreprocessResponse(BaseModel):
    data: list[PreprocessResult]


ExtractorName = Literal["union", "resiliparse", "trafilatura", "justext"]


def _default_extractors() -> list[ExtractorName]:
    return ["union"]


class ExtractRequest(_Strict):
    documents: list[DocumentIn] = Field(json_schema_extra=_NOT_EMPTY)
    extractors: list[ExtractorName] = Field(
        default_factory=_default_extractors,
        min_length=1,
        max_length=4,
        description="union: the first extractor whose output passes the quality filter; each named once",
        # A default_factory is not written into the schema: a client generator had shown none.
        json_schema_extra={"uniqueItems": True, "default": ["union"]},  # the route refuses a repeat (422)
    )
    min_words: JsonInt = Field(
        50, ge=0, description="the filter: an output passes with at least this many words, and one at least"
    )
    language: str | None = Field(
        None,
        max_length=64,
        description="jusText's language for every page (ISO 639-1, e.g. de; en-US is en), instead of "
        "detecting each page's: one jusText has a stoplist for or the detector knows, else 422; 422 too "
        "where none of the extractors asked for runs jusText (justext or union)",
        examples=["de"],
    )


class ExtractionOut(BaseModel):
    """One extractor's output for one page, or why it failed (the other outputs still count)."""

    extractor: str = Field(description="the extractor asked for (union: see `chosen`)")
    chosen: str | None = Field(description="the extractor whose text this is")
    text: str | None
    words: int
    passed: bool
    language: str | None = Field(
        description="jusText's language (its stoplist's, or the page's where it has none); null for the "
        "other extractors and where no language is known"
    )
    encoding: str | None = Field(
        description="the encoding the page was read in, named as browsers name it (the WHATWG name, "
        "lower-cased: utf-8, windows-1250, shift_jis)"
    )
    reason: str | None = Field(
        default=None,
        description="why the output failed the quality filter (too few words, too many U+FFFD or control "
        "characters, text of a page read with the wrong codec); null when it passed or none ran",
    )
    error: ErrorDetail | None = None


class ExtractResult(BaseModel):
    id: str | None
    extractions: list[ExtractionOut]


class ExtractResponse(BaseModel):
    data: list[ExtractResult]


class HeadInfo(BaseModel):
    name: str
    kind: str
    labels: list[str]
    metrics: dict[str, int | float] = Field(
        description="evaluation figures from training: counts (pages, cv_folds) as integers"
    )


class Limits(BaseModel):
    max_body_bytes: int
    max_documents: int = Field(
        description="documents one request may carry: HTMLLM_MAX_DOCUMENTS, or HTMLLM_MAX_QUEUE_DOCUMENTS "
        "where that is smaller (a call larger than the whole queue is refused too)"
    )
    request_timeout_s: float
    max_length: int
    truncate: bool
    max_batch_tokens: int
    max_batch_requests: int
    max_wait_ms: float
    max_queue_documents: int
    max_inflight_bytes: int = Field(description="request bodies held at once; a body past it gets 429")
    extract_timeout_s: float = Field(
        description="each extractor's limit on one page (/v1/extract), within the request timeout"
    )
    preprocess_timeout_s: float | None = Field(
        description="one page's preprocessing limit (its worker is killed past it); null with threads"
    )
    preprocess_memory_limit_mb: int | None = Field(
        description="each preprocessing worker's data limit in MiB; null with threads or none set"
    )


class InfoResponse(BaseModel):
    model: str = Field(description="the checkpoint's name (its training config's): not unique to it")
    checkpoint_sha256: str = Field(
        description="sha256 over the checkpoint's files (config.json, htmllm.json, weights, heads), taken "
        "at start-up: servers that report the same one run the same model, whatever its name; "
        "`htmllm embed` records the same value in its output's `htmllm.run` metadata"
    )
    training_run_id: str | None = Field(
        description="the id of the training run that produced the checkpoint (htmllm.json's "
        "`training.run_id`); null for a checkpoint from before run ids"
    )
    version: str = Field(
        description="the service package's version: not bumped by every change, so two servers that report "
        "the same one may still prune or extract differently (`prune_version` and `extraction_version` say)"
    )
    prune_version: str = Field(
        description="the pruner this server runs on every page (`PRUNE_VERSION`): servers that report "
        "different ones may embed the same page differently"
    )
    checkpoint_prune_version: str = Field(
        description="the pruner the checkpoint was trained on (its htmllm.json's `prune_version`); when it "
        "is not `prune_version` the checkpoint is served anyway, the mismatch logged once at start-up"
    )
    extraction_version: str = Field(
        description="the version of /v1/extract's own code (`EXTRACTION_VERSION`; the extractor libraries "
        "have versions of their own): servers that report different ones may return other texts for a page"
    )
    embedding_dim: int
    max_length: int
    backend: str
    device: str
    dtype: str = Field(description="the weights' precision (or the ONNX graph's quantisation)")
    threads: int = Field(description="CPU threads one forward pass runs on (HTMLLM_INTRA_OP_THREADS)")
    attention: str = Field(
        description="the attention implementation the model runs (HTMLLM_ATTENTION): sdpa (padded batches), "
        "varlen or flash_attention_2 (packed, CUDA), eager, or graph (onnx)"
    )
    preprocess_pool: Literal["thread", "process"] = Field(
        description="what prunes and tokenizes: threads or processes (HTMLLM_PREPROCESS_POOL)"
    )
    preprocess_workers: int = Field(description="how many of them (HTMLLM_PREPROCESS_WORKERS)")
    inference_process: bool = Field(
        description="whether the model runs in a child process (HTMLLM_INFERENCE_PROCESS)"
    )
    heads: list[HeadInfo]
    limits: Limits
    auth: bool = Field(description="whether model routes need an API key")
    # text-embeddings-inference's `/info` keys, for its clients (huggingface_hub's `get_endpoint_info`,
    # batchers that size their requests by `max_client_batch_size`): the same values as above.
    model_id: str = Field(description="TEI's name for `model`")
    model_type: dict[str, dict[str, str]] = Field(
        description='TEI\'s model kind: `{"embedding": {"pooling": "cls"}}` (or "mean")'
    )
    max_input_length: int = Field(description="TEI's name for `limits.max_length`")
    max_client_batch_size: int = Field(description="TEI's name for `limits.max_documents`")
    max_batch_tokens: int = Field(description="TEI's name for `limits.max_batch_tokens`")
    auto_truncate: bool = Field(description="TEI's name for `limits.truncate`")


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"


class ReadyResponse(BaseModel):
    status: Literal["ready"] = "ready"
    model: str
