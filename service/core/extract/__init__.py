"""Plain-text extraction from raw HTML: resiliparse, trafilatura, jusText, and their union.

"Beyond a Single Extractor" found that one fixed extractor silently loses pages that another would
have kept, and that taking, per page, the first extractor whose output passes the quality filter
raises yield at equal quality. This package serves that as one interface:

- `extract(html, "resiliparse" | "trafilatura" | "justext")`: one extractor;
- `extract(html, "union")`: the first extractor, in a preference order (default resiliparse ->
  trafilatura -> jusText, or `order="random"`, seeded, as in the paper), whose output passes the filter
  (at least `min_words` words, at most `MAX_UNREADABLE_SHARE` of its characters U+FFFD or control
  characters, and, when a `scorer` is given, a score of at least `min_score`);
- `extract_all(html)`: every extractor's output (or its error).

Bytes are decoded with `service.core.decoding.decode_html`, exactly as the pruner decodes them. A page
whose structure predicts seconds of an extractor's work is refused before any worker sees it
(`service.core.extract.limits`); every other extraction runs in a killable worker process
(`service.core.extract.pool`) under its own time limit.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from service.core.decoding import decode_html
from service.core.errors import ErrorCode
from service.core.extract.extractors import (
    EXTRACTORS,
    JUSTEXT,
    RESILIPARSE,
    TRAFILATURA,
    RawOutput,
    detect_language,
    stoplist_name,
)
from service.core.extract.limits import LIMITS, ExtractorLimits, PageShape, PageTooComplexError, check_page
from service.core.extract.pool import (
    ExtractionError,
    ExtractionTimeoutError,
    ExtractorPool,
    InlineRunner,
    Runner,
    default_pool,
    default_workers,
)
from service.core.extract.word_count import count_words

__all__ = [
    "ALL",
    "DEFAULT_MIN_WORDS",
    "DEFAULT_ORDER",
    "DEFAULT_TIMEOUT_S",
    "EXTRACTORS",
    "JUSTEXT",
    "LIMITS",
    "MAX_UNREADABLE_SHARE",
    "RANDOM",
    "RESILIPARSE",
    "TRAFILATURA",
    "UNION",
    "Attempt",
    "Extraction",
    "ExtractionError",
    "ExtractionOptionsError",
    "ExtractionTimeoutError",
    "ExtractorLimits",
    "ExtractorPool",
    "InlineRunner",
    "PageTooComplexError",
    "QualityScorer",
    "Runner",
    "Timeouts",
    "count_words",
    "default_pool",
    "default_workers",
    "detect_language",
    "extract",
    "extract_all",
    "resolve_order",
    "stoplist_name",
    "unreadable_chars",
]

UNION: Final = "union"
ALL: Final = "all"
RANDOM: Final = "random"
DEFAULT_ORDER: Final[tuple[str, ...]] = (RESILIPARSE, TRAFILATURA, JUSTEXT)
DEFAULT_MIN_WORDS: Final = 50
# Per extractor. On the shared 2-core machine the slowest corpus page takes jusText 3.3 s (trafilatura
# 1.0 s, resiliparse 0.1 s): five seconds keeps every real page and still bounds a pathological one.
DEFAULT_TIMEOUT_S: Final = 5.0
# The share of an output's characters that may be U+FFFD or C0 control characters (other than
# whitespace) for it to pass the filter. Text like that comes from binary input or a page read with the
# wrong codec (random bytes read as cp1252: 10-11%; a windows-1251 page read as the UTF-8 its wrong
# <meta> names: over 90%), and the word count alone let it pass. The most any corpus output holds is
# 0.2% (p0306, resiliparse: 25 of 12,000 characters); every other output of the 1,033 pages has none.
MAX_UNREADABLE_SHARE: Final = 0.05
# U+FFFD (what undecodable bytes and lone surrogates become) and the C0 controls str.isspace() rejects.
_UNREADABLE: Final = ("\ufffd", *(chr(c) for c in range(0x20) if not chr(c).isspace()))

Timeouts = float | Mapping[str, float] | None
"""Seconds per extractor: one limit for all, a limit per name (others get the default), or None."""

QualityScorer = Callable[[str], float]
"""A quality model's hook: extracted text -> score; an output passes when the score >= `min_score`."""


class ExtractionOptionsError(ExtractionError):
    """Unusable options: an unknown extractor name, an empty or repeating order, a bad limit."""

    code = ErrorCode.VALIDATION


@dataclass(frozen=True)
class Attempt:
    """One extractor's run within a request: what it yielded and whether it passed the filter."""

    extractor: str
    words: int
    elapsed_s: float
    passed: bool
    score: float | None = None
    error: str | None = None  # the failure's message; words is 0 then
    timed_out: bool = False
    reason: str | None = None  # why an output that ran failed the filter; None when it passed


@dataclass(frozen=True)
class Extraction:
    """The text chosen for a page and how it was chosen.

    `passed` says whether the text passed the filter; for the union, False means no extractor's output
    passed and the longest output is returned, so callers filtering a corpus drop the page.
    `elapsed_s` covers decoding and every attempt; `attempts` lists the extractors tried, in order.
    """

    text: str
    extractor: str
    words: int
    elapsed_s: float
    passed: bool
    score: float | None
    language: str | None  # the language jusText's stoplist was chosen for; None for the others
    encoding: str  # the codec `decode_html` used
    attempts: tuple[Attempt, ...]


def resolve_order(order: Sequence[str] | str, *, seed: int | None = None, text: str = "") -> tuple[str, ...]:
    """The extractors to try, in order; `"random"` shuffles them per page.

    With a seed, a page's order depends only on the seed and the page's text, so a bulk run gives the
    same choice for the same page whatever order pages arrive in.
    """
    if isinstance(order, str):
        if order != RANDOM:
            raise ExtractionOptionsError(f"order must be a sequence of extractor names or {RANDOM!r}")
        if seed is None:
            rng = random.Random()
        else:
            digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
            rng = random.Random(f"{seed}:{digest}")
        shuffled = list(EXTRACTORS)
        rng.shuffle(shuffled)
        return tuple(shuffled)
    names = tuple(order)
    if not names:
        raise ExtractionOptionsError("the union's order names no extractor")
    for name in names:
        _check_name(name)
    if len(set(names)) != len(names):
        raise ExtractionOptionsError(f"the union's order repeats an extractor: {list(names)}")
    return names


def _check_name(name: str) -> None:
    if name not in EXTRACTORS:
        raise ExtractionOptionsError(f"unknown extractor {name!r}; expected one of {', '.join(EXTRACTORS)}")


def _timeout_for(timeout_s: Timeouts, name: str) -> float | None:
    if timeout_s is None or isinstance(timeout_s, int | float):
        return timeout_s
    return timeout_s.get(name, DEFAULT_TIMEOUT_S)


def _check_limits(timeout_s: Timeouts, min_words: int) -> None:
    if isinstance(timeout_s, Mapping):
        for name, limit in timeout_s.items():
            _check_name(name)
            if not limit > 0:
                raise ExtractionOptionsError(f"the time limit for {name} must be positive, got {limit}")
    elif timeout_s is not None and not timeout_s > 0:
        raise ExtractionOptionsError(f"timeout_s must be positive, got {timeout_s}")
    if min_words < 0:
        raise ExtractionOptionsError(f"min_words must be >= 0, got {min_words}")


def _decode(html: str | bytes, encoding: str | None) -> tuple[str, str]:
    if not isinstance(html, str | bytes):
        raise ExtractionOptionsError(f"html must be str or bytes, got {type(html).__name__}")
    # decode_html gives text without lone surrogates (from surrogateescape-decoded text, as crawlers
    # write it), which made resiliparse and jusText raise and trafilatura return nothing.
    decoded = decode_html(html, encoding=encoding)
    return decoded.text, decoded.encoding


@dataclass(frozen=True)
class _Filter:
    min_words: int
    scorer: QualityScorer | None
    min_score: float

    def judge(self, text: str, words: int) -> tuple[bool, float | None, str | None]:
        """(passed, score, why it failed); the scorer runs only on outputs that pass otherwise."""
        if words < self.min_words:
            return False, None, f"{words} words, fewer than the {self.min_words} needed"
        unreadable = unreadable_chars(text)
        if unreadable > MAX_UNREADABLE_SHARE * len(text):
            return (
                False,
                None,
                f"{unreadable} of its {len(text)} characters are U+FFFD or control characters (over "
                f"{MAX_UNREADABLE_SHARE:.0%}): binary input, or a page read with the wrong encoding",
            )
        if self.scorer is None:
            return True, None, None
        score = float(self.scorer(text))
        if score < self.min_score:
            return False, score, f"score {score:g}, under the {self.min_score:g} needed"
        return True, score, None


def unreadable_chars(text: str) -> int:
    """How many of `text`'s characters are U+FFFD or C0 control characters other than whitespace."""
    # One C-speed pass per character sought: a 16 MiB output takes milliseconds, builds no strings.
    return sum(text.count(c) for c in _UNREADABLE)


def _attempt(
    runner: Runner,
    name: str,
    shape: PageShape,
    text: str,
    language: str | None,
    timeout_s: Timeouts,
    flt: _Filter,
) -> tuple[Attempt, RawOutput | None, ExtractionError | None]:
    started = time.perf_counter()
    try:
        # A page over the extractor's structural limits is refused here, before any worker sees it.
        check_page(name, shape)
        out = runner.run(name, text, language=language, timeout_s=_timeout_for(timeout_s, name))
    except ExtractionError as exc:
        elapsed = time.perf_counter() - started
        attempt = Attempt(
            name, 0, elapsed, False, error=str(exc), timed_out=isinstance(exc, ExtractionTimeoutError)
        )
        return attempt, None, exc
    elapsed = time.perf_counter() - started
    words = count_words(out.text)
    passed, score, reason = flt.judge(out.text, words)
    return Attempt(name, words, elapsed, passed, score, reason=reason), out, None


def extract(
    html: str | bytes,
    extractor: str = UNION,
    *,
    encoding: str | None = None,
    timeout_s: Timeouts = DEFAULT_TIMEOUT_S,
    min_words: int = DEFAULT_MIN_WORDS,
    order: Sequence[str] | str = DEFAULT_ORDER,
    seed: int | None = None,
    scorer: QualityScorer | None = None,
    min_score: float = 0.0,
    language: str | None = None,
    runner: Runner | None = None,
) -> Extraction:
    """Extract a page's text with one extractor or with the union.

    `encoding` is the HTTP-declared charset, if any. `timeout_s` bounds each extractor separately: a
    number for all, or a mapping per name; None means no bound (trusted input only). `language`
    (ISO 639-1) skips jusText's detection. `runner` defaults to the shared process pool. A single
    extractor's failure raises `ExtractionError` (`ExtractionTimeoutError` past the limit); the union
    raises only when every extractor failed.
    """
    started = time.perf_counter()
    if extractor == ALL:
        raise ExtractionOptionsError("extractor 'all' returns several texts: call extract_all")
    if extractor != UNION:
        _check_name(extractor)
    _check_limits(timeout_s, min_words)
    text, codec = _decode(html, encoding)
    names = (extractor,) if extractor != UNION else resolve_order(order, seed=seed, text=text)
    flt = _Filter(min_words, scorer, min_score)
    run_with = runner or default_pool()
    shape = PageShape(text)

    attempts: list[Attempt] = []
    outputs: dict[str, RawOutput] = {}
    errors: list[ExtractionError] = []
    for name in names:
        attempt, out, error = _attempt(run_with, name, shape, text, language, timeout_s, flt)
        attempts.append(attempt)
        if error is not None:
            errors.append(error)
            if extractor != UNION:
                raise error
            continue
        assert out is not None
        outputs[name] = out
        if attempt.passed:
            break

    if not outputs:
        summary = "; ".join(str(e) for e in errors)
        if all(isinstance(e, ExtractionTimeoutError) for e in errors):
            raise ExtractionTimeoutError(f"every extractor timed out: {summary}")
        if all(isinstance(e, PageTooComplexError) for e in errors):
            raise PageTooComplexError(f"every extractor refused the page: {summary}")
        raise ExtractionError(f"every extractor failed: {summary}")
    # The passing attempt when there is one, else the longest output (earliest in order on ties).
    chosen = next((a for a in attempts if a.passed), None)
    if chosen is None:
        chosen = max((a for a in attempts if a.error is None), key=lambda a: a.words)
    out = outputs[chosen.extractor]
    return Extraction(
        text=out.text,
        extractor=chosen.extractor,
        words=chosen.words,
        elapsed_s=time.perf_counter() - started,
        passed=chosen.passed,
        score=chosen.score,
        language=out.language,
        encoding=codec,
        attempts=tuple(attempts),
    )


def extract_all(
    html: str | bytes,
    *,
    extractors: Sequence[str] = EXTRACTORS,
    encoding: str | None = None,
    timeout_s: Timeouts = DEFAULT_TIMEOUT_S,
    min_words: int = DEFAULT_MIN_WORDS,
    scorer: QualityScorer | None = None,
    min_score: float = 0.0,
    language: str | None = None,
    runner: Runner | None = None,
) -> dict[str, Extraction | ExtractionError]:
    """Every extractor's output for a page, keyed by name; a failed extractor maps to its error.

    `passed` on each entry applies the same filter as the union, so a caller can see which outputs
    the union would have accepted. Bad options raise; one extractor's failure does not.
    """
    names = resolve_order(extractors)
    _check_limits(timeout_s, min_words)
    started = time.perf_counter()
    text, codec = _decode(html, encoding)
    decode_s = time.perf_counter() - started
    flt = _Filter(min_words, scorer, min_score)
    run_with = runner or default_pool()
    shape = PageShape(text)
    results: dict[str, Extraction | ExtractionError] = {}
    for name in names:
        attempt, out, error = _attempt(run_with, name, shape, text, language, timeout_s, flt)
        if error is not None:
            results[name] = error
            continue
        assert out is not None
        results[name] = Extraction(
            text=out.text,
            extractor=name,
            words=attempt.words,
            elapsed_s=decode_s + attempt.elapsed_s,
            passed=attempt.passed,
            score=attempt.score,
            language=out.language,
            encoding=codec,
            attempts=(attempt,),
        )
    return results
