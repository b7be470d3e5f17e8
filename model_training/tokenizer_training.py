"""Training the HTML-aware WordPiece tokenizer on pruned pages (the paper's recipe, section 2.3).

The pipeline every tokenizer we train shares:
- normalizer: Unicode NFC, then each whitespace run to one space. No lowercasing: casing is kept.
- pre-tokenizer: Metaspace (a space becomes a `▁` glued to the next word, nothing is dropped), then
  each Han/kana character isolated (as BERT does), then punctuation isolated, so `<`, `/`, `>` of tags
  that have no token of their own stay separate pieces.
- model: WordPiece with `##` continuation pieces; decoder: strip `##`, `▁` back to a space, concatenate,
  so `decode(encode(x)) == x` for pruned HTML (whose whitespace is already collapsed).
- tag tokens: `<t>` and `</t>` for each of the N most frequent tags (only `<t>` for void elements), and
  the same with the preceding space (` <t>`, ` </t>`), added as non-special added tokens *after*
  training. Added before training they would be fed to the trainer as words and corrupt the merges; as
  special tokens `decode` would drop them.

The trainer must see the text the finished tokenizer will see: at encode time the added tag tokens are cut
out of the raw text first, so `<p>Hello` leaves the word `Hello` with no space marker. We therefore feed
the trainer each document split at the top-N tags, and the vocabulary is not spent on the pieces of tags
that get their own tokens anyway.

The final vocabulary size is rounded up to a multiple of 64 (tensor-core friendly embedding and output
matrices); room for the tag tokens is reserved out of it, and when a small corpus cannot fill it, unused
`[unusedN]` special tokens pad it to the next multiple of 64, as BERT's vocabulary does.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, processors
from tokenizers.trainers import WordPieceTrainer

from service.core.errors import ErrorCode, HtmllmError
from service.core.progress import progress_bar
from service.core.tokenizer import SPECIAL_TOKENS, HtmlTokenizer
from service.core.words import CJK_CLASS, html_normalizer, html_pre_tokenizer

VOCAB_MULTIPLE = 64

# HTML void elements: they never have a closing tag, so only `<t>` gets a token.
VOID_TAGS: frozenset[str] = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track",
     "wbr", "keygen"}
)  # fmt: skip

# Opening tags (optionally self-closed, as some serializers write void elements) and closing tags.
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]*)\s*/?>")

# Han ideographs and kana, each a piece of its own (service.core.words).
_CJK = re.compile(CJK_CLASS)

# Characters always in the alphabet, so that a rare symbol missing from a small training sample does not
# turn its whole word into [UNK].
_BASE_ALPHABET: list[str] = sorted(set(string.ascii_letters + string.digits + string.punctuation))


class TokenizerTrainingError(HtmllmError):
    """Impossible training options (a vocabulary too small for its special and tag tokens, no text)."""

    code = ErrorCode.VALIDATION


def round_up(value: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """`value` rounded up to a multiple of `multiple`."""
    return -(-value // multiple) * multiple


def count_tags(texts: Iterable[str]) -> Counter[str]:
    """Occurrences of each tag name (opening forms, plus closing forms of tags never seen opened)."""
    opened: Counter[str] = Counter()
    closed: Counter[str] = Counter()
    for text in texts:
        for match in _TAG.finditer(text):
            (closed if match.group(1) else opened)[match.group(2)] += 1
    for name, count in closed.items():
        if name not in opened:
            opened[name] = count
    return opened


def tag_tokens(tags: Sequence[str], *, spaced: bool = False) -> list[str]:
    """The token strings for `tags`: `<t>` and `</t>`, or only `<t>` for a void element.

    With `spaced`, each also gets a form with the space before it (` <t>`, ` </t>`): pruned HTML has a
    space at about half of all tag boundaries (`</a> <a>`, `Home </a>`), and without these forms each
    such space is a `▁` token of its own, about a tenth of all tokens.
    """
    tokens: list[str] = []
    for name in tags:
        forms = [f"<{name}>"] if name.lower() in VOID_TAGS else [f"<{name}>", f"</{name}>"]
        tokens.extend(forms)
        if spaced:
            tokens.extend(" " + form for form in forms)
    return tokens


def top_tags(counts: Counter[str], n: int) -> list[str]:
    """The `n` most frequent tag names, ties broken by name so the choice is deterministic."""
    return [name for name, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def new_tokenizer() -> Tokenizer:
    """An untrained tokenizer with our normalizer, pre-tokenizer, decoder and [CLS]/[SEP] template."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = html_normalizer()
    tok.pre_tokenizer = html_pre_tokenizer()
    # `##` is only ever a continuation prefix: `#` is punctuation, so it is always a piece of its own.
    tok.decoder = decoders.Sequence(
        [decoders.Replace(Regex("^##"), ""), decoders.Replace("▁", " "), decoders.Fuse()]
    )
    return tok


def _with_template(tok: Tokenizer) -> None:
    # The [CLS] ... [SEP] template makes the file usable as-is by transformers' fast tokenizers;
    # HtmlTokenizer adds the two itself so that truncation never cuts them.
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )


def _is_punctuation(char: str) -> bool:
    # The definition of the `Punctuation` pre-tokenizer: ASCII punctuation or a Unicode P* category.
    return char in string.punctuation or unicodedata.category(char).startswith("P")


def _complete_alphabet(tok: Tokenizer, budget: int) -> Tokenizer:
    """Make every alphabet character encodable at the start and inside a word, within `budget` ids.

    WordPiece turns a whole word into [UNK] when one of its characters has no piece in the position it
    occurs in. The trainer only creates `c` for characters it saw word-initially and `##c` for those it saw
    inside words, so on a small sample `Weather` after a space (`▁` + `##W` ...) can be [UNK] although `W`
    is known. We add the missing forms and, to stay within the budget, drop as many of the last-learned
    merges (the highest ids, the least useful) as were added: the same as training a slightly smaller
    vocabulary.
    """
    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    ordered = [token for token, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    known = set(ordered)
    chars = set(_BASE_ALPHABET)
    for token in ordered:
        if token.startswith("##") and len(token) == 3:
            chars.add(token[2])
        elif len(token) == 1:
            chars.add(token)
    missing: list[str] = []
    for char in sorted(chars):
        if char not in known:
            missing.append(char)
        # Punctuation, CJK and the space marker are always pieces of their own: never inside a word.
        inside = char != "▁" and not _is_punctuation(char) and not _CJK.fullmatch(char)
        if inside and "##" + char not in known:
            missing.append("##" + char)
    excess = len(ordered) + len(missing) - budget
    if excess > 0:
        # Merges only: never a special token or a one-character piece (`c`, `##c`).
        removable = [
            i
            for i, t in enumerate(ordered)
            if t not in SPECIAL_TOKENS and len(t) > 1 and not (t.startswith("##") and len(t) == 3)
        ]
        dropped = set(removable[-excess:])
        ordered = [t for i, t in enumerate(ordered) if i not in dropped]
    ordered.extend(missing)
    data["model"]["vocab"] = {token: i for i, token in enumerate(ordered)}
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def _segments(texts: Sequence[str], tokens: Sequence[str]) -> Iterator[str]:
    """Each text cut at the tag tokens, as the finished tokenizer cuts it before pre-tokenizing."""
    if not tokens:
        yield from texts
        return
    splitter = re.compile("|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True)))
    for text in texts:
        for piece in splitter.split(text):
            if piece:
                yield piece


def _option(name: str, flags: bool) -> str:
    return "--" + name.replace("_", "-") if flags else name


def check_training_options(*, vocab_size: int, min_frequency: int, tags: int, flags: bool = False) -> None:
    """Refuse counts `train_tokenizer` cannot take; public so a caller can check them before it spends
    minutes pruning the pages. With `flags`, the message names the command line's flags (`--tags`)."""
    for name, value in (("tags", tags), ("min_frequency", min_frequency)):
        # (min_frequency: the trainer takes it unsigned, an OverflowError otherwise)
        if value < 0:
            raise TokenizerTrainingError(f"{_option(name, flags)} must be >= 0, got {value}")
    # What no corpus can change; what this corpus's characters and tags need is known after pruning.
    floor = len(SPECIAL_TOKENS) + len(_BASE_ALPHABET)
    if round_up(vocab_size) < floor:
        raise TokenizerTrainingError(
            f"{_option('vocab_size', flags)} {vocab_size} is too small: the special tokens and base "
            f"alphabet alone need {floor} ids"
        )


def check_room_for_tags(*, vocab_size: int, tags: int, spaced_tags: bool, flags: bool = False) -> None:
    """Refuse a vocabulary without room for every tag token `tags` may add, besides the special tokens
    and the base alphabet: `htmllm tokenizer train` checks this before it reads a page.

    How many tag tokens there will be is known only once the pages are pruned and their tags counted (a
    corpus may have fewer distinct tags; void elements have no closing form), so `train_tokenizer`
    checks the exact count, after the pruning. Before it, `--vocab-size 300` with the default 100 tags was
    refused only once every page was pruned. The most the tags may take is checked: on a corpus with
    fewer distinct tags (or many void ones) that refuses a size that would have fitted, and the message
    says what does (fewer `tags`, which choose the same tags where the corpus has no more than that, or
    the size that holds them all).
    """
    per_tag = 4 if spaced_tags else 2  # <t>, </t> (and ` <t>`, ` </t>)
    floor = len(SPECIAL_TOKENS) + len(_BASE_ALPHABET)
    room = round_up(vocab_size) - floor
    if tags * per_tag <= room:
        return
    fits = max(room, 0) // per_tag
    fewer = f"{_option('tags', flags)} {fits} or fewer" if fits else f"{_option('tags', flags)} 0"
    raise TokenizerTrainingError(
        f"{_option('vocab_size', flags)} {vocab_size} ({round_up(vocab_size)} ids) leaves {room} ids after "
        f"the {floor} of the special tokens and base alphabet, and {_option('tags', flags)} {tags} may take "
        f"up to {tags * per_tag} ({per_tag} forms per tag): use {fewer}, or "
        f"{_option('vocab_size', flags)} {round_up(floor + tags * per_tag)} or more"
    )


def check_sample(sample: int | None, *, flags: bool = False) -> None:
    """Refuse a page count `pruned_pages` cannot take (it had read -1 as "no page" and pruned nothing)."""
    if sample is not None and sample < 1:
        raise TokenizerTrainingError(f"{_option('sample', flags)} must be at least 1, got {sample}")


def train_tokenizer(
    texts: Iterable[str],
    *,
    vocab_size: int,
    min_frequency: int = 2,
    tags: int = 100,
    spaced_tags: bool = True,
    show_progress: bool = False,
) -> HtmlTokenizer:
    """Train a WordPiece tokenizer on pruned `texts` with tokens for the `tags` most frequent tags.

    The result has `round_up(vocab_size, 64)` ids, or fewer (still a multiple of 64) when the corpus has
    fewer distinct pieces of at least `min_frequency` occurrences than that. Never more: a size below what
    the corpus's characters (each as a word start and a continuation) and the tag tokens need is refused,
    naming the size that would do.
    """
    docs = [t for t in texts if t]
    if not docs:
        raise TokenizerTrainingError("no text to train a tokenizer on")
    check_training_options(vocab_size=vocab_size, min_frequency=min_frequency, tags=tags)
    target = round_up(vocab_size)
    chosen = top_tags(count_tags(docs), tags)
    added = tag_tokens(chosen, spaced=spaced_tags)
    budget = target - len(added)
    floor = len(SPECIAL_TOKENS) + len(_BASE_ALPHABET)
    if budget < floor:
        fits = max(
            k
            for k in range(len(chosen) + 1)
            if len(tag_tokens(chosen[:k], spaced=spaced_tags)) <= target - floor
        )
        raise TokenizerTrainingError(
            f"vocab_size {vocab_size} (rounded to {target}) leaves {budget} ids after {len(added)} tag "
            f"tokens (of the {len(chosen)} most frequent tags); the special tokens and base alphabet alone "
            f"need {floor}: use a vocab_size of at least {round_up(floor + len(added))}, or tags {fits} or "
            "fewer"
        )

    tok = new_tokenizer()
    trainer = WordPieceTrainer(
        vocab_size=budget,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=_BASE_ALPHABET,
        continuing_subword_prefix="##",
        show_progress=show_progress,
    )
    tok.train_from_iterator(_segments(docs, added), trainer=trainer)
    tok = _complete_alphabet(tok, budget)
    pieces = tok.get_vocab_size(with_added_tokens=True)
    if pieces > budget:
        # Every merge is dropped and the alphabet still does not fit: the tokenizer would have more ids
        # than asked (512 became 768), and a model sized for the asked vocabulary would not fit it.
        raise TokenizerTrainingError(
            f"vocab_size {vocab_size} (rounded to {target}) is too small for this corpus: the special "
            f"tokens and its characters need {pieces} ids, {pieces + len(added)} with the {len(added)} tag "
            f"tokens; use a vocab_size of at least {round_up(pieces + len(added))} (or fewer tags)"
        )
    # After training: as added tokens they are matched in the raw text, before the pre-tokenizer.
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in added])
    size = tok.get_vocab_size(with_added_tokens=True)
    padded = round_up(size)
    if padded > size:
        tok.add_special_tokens([f"[unused{i}]" for i in range(padded - size)])
    _with_template(tok)
    return HtmlTokenizer.from_tokenizers(tok)


def split_of(page_id: str, *, heldout_percent: int = 20) -> str:
    """`"train"` or `"heldout"` for a page, from a hash of its id: deterministic and order-independent."""
    bucket = int.from_bytes(hashlib.sha256(page_id.encode("utf-8")).digest()[:8], "big") % 100
    return "heldout" if bucket < heldout_percent else "train"


SPLITS = ("train", "heldout", "all")


# The reason recorded for a page that prunes to nothing (`pruned_pages`).
EMPTY = "empty"


@dataclass
class PrunedCorpus:
    """The pruned text of the pages of one split, and what was skipped on the way."""

    ids: list[str]
    texts: list[str]
    raw_bytes: int
    failed: dict[str, str]  # page id -> error code of a page the pruner rejected (`EMPTY`: nothing left)


def pruned_pages(
    source: str | Path,
    *,
    split: str = "all",
    heldout_percent: int = 20,
    sample: int | None = None,
    progress: bool = False,
) -> PrunedCorpus:
    """Read pages with `iter_pages`, keep those of `split`, prune the first `sample` of them.

    A page the pruner rejects (a typed `PruneError`, or a page over its byte cap, which the reader
    refuses first: `data.pages_within_cap`) is recorded and skipped, never fatal: one bad page must not
    stop a training run. So is a page that prunes to nothing (`EMPTY`: a blank page, an empty 200, a
    WARC's bare redirect): nothing to learn from, it had been a document of two tokens in every window of
    `eval` and taken a place of `--sample` (`htmllm data prepare` and the evaluation leave it out too).
    """
    # Here, not at the top: it brings pyarrow, which the many users of `train_tokenizer` do not need.
    from model_training.data import pages_within_cap
    from service.core.prune import PruneError, prune_html

    check_sample(sample)
    if split not in SPLITS:
        raise TokenizerTrainingError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if not 0 <= heldout_percent <= 100:
        raise TokenizerTrainingError(f"heldout_percent must be within 0..100, got {heldout_percent}")
    corpus = PrunedCorpus(ids=[], texts=[], raw_bytes=0, failed={})
    bar = progress_bar(total=sample, unit="page", desc="prune", disable=not progress, leave=False)
    with bar:
        for page in pages_within_cap(source):
            if sample is not None and len(corpus.ids) + len(corpus.failed) >= sample:
                break
            if split != "all" and split_of(page.id, heldout_percent=heldout_percent) != split:
                continue
            bar.update(1)
            if page.error is not None:  # over the cap, or still compressed (`pages_within_cap`)
                corpus.failed[page.id] = str(page.error_code)
                continue
            try:
                text = prune_html(page.html)
            except PruneError as exc:
                corpus.failed[page.id] = str(exc.code)
                continue
            if not text.strip():
                corpus.failed[page.id] = EMPTY
                continue
            corpus.ids.append(page.id)
            corpus.texts.append(text)
            corpus.raw_bytes += len(page.html)
    return corpus


DEFAULT_WINDOWS: tuple[int, ...] = (512, 2048, 4096, 8192)


@dataclass
class TokenizerStats:
    """The paper's Table 1 figures for one tokenizer on one set of pruned documents."""

    name: str
    vocab_size: int
    tag_tokens: int
    documents: int
    within: dict[int, float]  # window -> % of documents whose full encoding fits it
    mean_tokens: float
    median_tokens: float
    vocab_used: float  # % of the vocabulary's ids that occur at least once
    unk_rate: float  # % of content tokens that are [UNK]
    chars_per_token: float
    round_trip: float  # % of documents with decode(encode(text)) == text exactly
    percentiles: dict[str, float]  # "min", "p10", "p25", "p75", "p90", "max" of tokens per document
    sha256: str = ""


def evaluate_tokenizer(
    name: str,
    tok: HtmlTokenizer,
    texts: Sequence[str],
    *,
    windows: Sequence[int] = DEFAULT_WINDOWS,
    batch_size: int = 64,
    progress: bool = False,
) -> TokenizerStats:
    """Encode every text whole (no truncation) and summarize lengths, vocabulary use and round trips."""
    if not texts:
        raise TokenizerTrainingError("no documents to evaluate on")
    lengths: list[int] = []
    used: set[int] = set()
    unk = content = exact = 0
    steps = range(0, len(texts), batch_size)
    for start in progress_bar(iterable=steps, desc=name, disable=not progress, leave=False):
        batch = texts[start : start + batch_size]
        for text, encoding in zip(batch, tok.encode_batch(batch), strict=True):
            exact += tok.decode(encoding.ids) == text
            lengths.append(encoding.full_length)
            used.update(encoding.ids)
            body = encoding.ids[1:-1]
            content += len(body)
            unk += body.count(tok.special_ids.unk)
    n = len(lengths)
    chars = sum(len(t) for t in texts)
    return TokenizerStats(
        name=name,
        vocab_size=tok.vocab_size,
        tag_tokens=len(tok.tag_token_ids),
        documents=n,
        within={w: 100.0 * sum(1 for x in lengths if x <= w) / n for w in windows},
        mean_tokens=statistics.fmean(lengths),
        median_tokens=float(statistics.median(lengths)),
        vocab_used=100.0 * len(used) / tok.vocab_size,
        unk_rate=100.0 * unk / max(content, 1),
        chars_per_token=chars / max(content, 1),
        round_trip=100.0 * exact / n,
        percentiles=_percentiles(lengths),
        sha256=tok.sha256,
    )


def _percentiles(values: Sequence[int]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        # Nearest rank: an actual document's length, not an interpolation between two.
        return float(ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))])

    return {"min": at(0), "p10": at(0.1), "p25": at(0.25), "p75": at(0.75), "p90": at(0.9), "max": at(1)}


def markdown_table(stats: Sequence[TokenizerStats]) -> str:
    """Table 1 as Markdown: one row per tokenizer, windows as columns."""
    windows = sorted({w for s in stats for w in s.within})
    head = ["Tokenizer", "Vocab", *(f"≤ {w}" for w in windows), "Mean", "Median", "Vocab used", "[UNK]"]
    head.append("Round trip")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for s in stats:
        cells = [
            s.name,
            f"{s.vocab_size:,}",
            *(f"{s.within.get(w, float('nan')):.1f}%" for w in windows),
            f"{s.mean_tokens:,.0f}",
            f"{s.median_tokens:,.0f}",
            f"{s.vocab_used:.1f}%",
            f"{s.unk_rate:.2f}%",
            f"{s.round_trip:.1f}%",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
