"""Plain-text extraction from raw HTML: resiliparse, trafilatura, jusText, and their union.

"Beyond a Single Extractor" found that one fixed extractor silently loses pages that another would
have kept, and that taking, per page, the first extractor whose output passes the quality filter
raises yield at equal quality. This package serves that as one interface:

- `extract(html, "resiliparse" | "trafilatura" | "justext")`: one extractor;
- `extract(html, "union")`: the first extractor, in a preference order (default resiliparse ->
  trafilatura -> jusText, or `order="random"`, seeded, as in the paper), whose output passes the filter
  (at least `min_words` words and never none, at most `MAX_UNREADABLE_SHARE` of its characters U+FFFD,
  control or invisible format characters, no sign of a page read with the wrong single-byte codec
  (`misread_codec`), and, when a `scorer` is given, a finite score of at least `min_score`);
- `extract_all(html)`: every extractor's output (or its error).

Bytes are decoded with `service.core.decoding.decode_html`, exactly as the pruner decodes them. A page
whose structure predicts seconds of an extractor's work is refused before any worker sees it
(`service.core.extract.limits`); every other extraction runs in a killable worker process
(`service.core.extract.pool`) under its own time limit. Every extractor sees the page without its ruby
annotations and returns normalised text (`service.core.extract.normalize`). A worker killed from outside
under the page in each of its tries (the OOM killer) fails the whole call with `ExtractorLostError`
(`not_ready`): not one extractor's failure, so the union does not go on to the next extractor, nor does
`extract_all` record it as that extractor's.

The pool starts its workers from a forkserver, which imports the calling script as multiprocessing's
spawn does: a script must call `extract` under `if __name__ == "__main__":`, or each worker runs the
script's top level again and dies on start ("extractor worker died while starting").
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeGuard

from service.core.decoding import decode_html
from service.core.encoding_labels import whatwg_name
from service.core.errors import ErrorCode
from service.core.extract.extractors import (
    EXTRACTORS,
    JUSTEXT,
    JUSTEXT_STOPLISTS,
    RESILIPARSE,
    TRAFILATURA,
    RawOutput,
    detect_language,
    known_languages,
    stoplist_name,
)
from service.core.extract.limits import LIMITS, ExtractorLimits, PageShape, PageTooComplexError, check_page
from service.core.extract.pool import (
    ExtractionError,
    ExtractionTimeoutError,
    ExtractorLostError,
    ExtractorPool,
    InlineRunner,
    Runner,
    default_pool,
    default_workers,
)
from service.core.extract.word_count import TextCounts, count_words, text_counts

# What a page's texts depend on beyond the extractor libraries' versions: bumped whenever our own code
# gives other texts or verdicts for the same page and libraries (normalisation, thresholds, word counting),
# so that whatever keeps texts (`htmllm extract`'s run.json, the evaluation's text cache, the shards'
# manifest) never mixes two. Up to 5 such changes were counted as `htmllm extract`'s row format.
# 6: jusText's length thresholds divided by 3 on Chinese/Japanese pages run without a stoplist; words of
#    Thai, Lao, Khmer and Myanmar counted from their letters (were one per space-separated run).
# 7: pages decoded as prune version 10 decodes them (`decode_html`: an undeclared legacy encoding read from
#    its non-ASCII bytes in context, undeclared ISO-2022-JP, a declared UTF-16 over UTF-8 bytes with a
#    stray NUL ignored; prune version 9's decoding changes had not been counted here).
# 8: jusText's language detected on the page's main text (its visible text when that is short) and a
#    detection ranked past 600 none; C1 controls unreadable and text read with the wrong single-byte codec
#    failing the filter (`misread_codec`); trafilatura and jusText see characters XML cannot hold as a
#    space or U+FFFD (`normalize.xml_compatible`).
# 9: pages decoded as prune version 11 decodes them (a legacy CJK page with a character only the WHATWG
#    decoders read: detected as its encoding, and read as a browser reads it).
# 10: resiliparse keeps a lone character between tags written as a character reference (`&euro;`,
#     `&bdquo;`, `&#x89aa;`), as it kept the raw character (`extractors._LONE_CHARACTER`).
# 11: jusText runs language-independent where no language is known (had the English stoplist: 0 words of
#     an undetected Korean page), reported as no language; `encoding` is the WHATWG name (`windows-1250`,
#     was Python's `cp1250`).
EXTRACTION_VERSION: Final = "12"

__all__ = [
    "ALL",
    "DEFAULT_MIN_WORDS",
    "DEFAULT_ORDER",
    "DEFAULT_TIMEOUT_S",
    "EXTRACTION_VERSION",
    "EXTRACTORS",
    "JUSTEXT",
    "LIMITS",
    "MAX_LATIN_RUN_SHARE",
    "MAX_UNREADABLE_SHARE",
    "MAX_UTF8_MISREAD_SHARE",
    "MISREAD_MIN_CHARS",
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
    "ExtractorLostError",
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
    "misread_codec",
    "normalize_language",
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
# The share of an output's characters that may be U+FFFD, control characters (C0 other than whitespace,
# and C1) or invisible format characters for it to pass the filter. Text like that comes from binary
# input or a page read with the wrong codec (random bytes read as cp1252: 10-11%; a windows-1251 page
# read as the UTF-8 its wrong <meta> names: over 90%; a Shift_JIS page read as windows-1254: 9% C1
# controls, which passed before they were counted), and the word count alone let it pass. The most any
# corpus output holds is 0.2% (p0306, resiliparse: 25 of 12,000 characters); every other output of the
# 1,033 pages has none but one C1 control (p0364).
MAX_UNREADABLE_SHARE: Final = 0.05
# A UTF-8 page read with a single-byte codec ("ÐŸÑ€Ð¸Ð²ÐµÑ‚" for "Привет", "StraÃŸe" for "Straße"): the
# share of an output's non-ASCII characters that form UTF-8 sequences when written back as the bytes they
# were read from (`mojibake`), over this and at least `MISREAD_MIN_CHARS` of them, fails the filter. Such
# a page has all of them in sequences; the most a corpus output has is 36% (p0741, trafilatura: "É®",
# 4 of 11 characters) and 14% (p0213, which does hold some double-encoded text); no other page's over 4%.
MAX_UTF8_MISREAD_SHARE: Final = 0.5
# A page in another script read as Latin-1 ("Ïðèâåò" for windows-1251 "Привет"): the share of an
# output's letters and digits in runs of three or more Latin-1 letters (`mojibake`), over this and at
# least `MISREAD_MIN_CHARS`, fails the filter. Such a page has nearly all of them in runs (a word of its
# script is one); no language writes such runs but as emphasis, and the most a corpus output has is
# 0.2% (p0734: "ööööööööö").
MAX_LATIN_RUN_SHARE: Final = 0.2
MISREAD_MIN_CHARS: Final = 20
# A language as a caller may give it ("de", "DE", "pt-BR", "zh_Hans"): its primary subtag is the code.
_LANGUAGE_TAG: Final = re.compile(r"([a-z]{2,3})(?:[-_][a-z0-9]{1,8})*")

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
    `elapsed_s` covers decoding and every attempt; `attempts` lists the extractors tried, in order. An
    attempt's `elapsed_s` is the page's own work (its checks, the extraction as timed in the process that
    ran it, the filter), not the wait for a worker or a worker's start-up; a failed one's is the time the
    caller waited for it.
    """

    text: str
    extractor: str
    words: int
    elapsed_s: float
    passed: bool
    score: float | None
    language: str | None  # jusText's (given or detected); None where unknown, and for the other extractors
    encoding: str  # the page's encoding as browsers name it (`whatwg_name`: windows-1250, not cp1250)
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


def _is_number(value: object) -> TypeGuard[float]:
    # bool is an int, but True seconds or words is a mistake, not a number.
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_options(timeout_s: Timeouts, min_words: int, min_score: float, language: str | None) -> str | None:
    """Refuse unusable options typed, before any work (a string limit raised a bare TypeError, a NaN
    `min_words` passed every output); return `language` normalised."""
    limits = timeout_s.items() if isinstance(timeout_s, Mapping) else [(None, timeout_s)]
    for name, limit in limits:
        if name is not None:
            _check_name(name)
        if limit is None and name is None:
            continue
        what = "timeout_s" if name is None else f"the time limit for {name}"
        if not _is_number(limit) or not limit > 0:  # NaN fails the comparison; inf is no limit
            raise ExtractionOptionsError(f"{what} must be a positive number of seconds, got {limit!r}")
    if not _is_number(min_words) or not math.isfinite(min_words) or min_words < 0:
        raise ExtractionOptionsError(f"min_words must be a finite number >= 0, got {min_words!r}")
    if not _is_number(min_score) or math.isnan(min_score):
        raise ExtractionOptionsError(f"min_score must be a number, got {min_score!r}")
    return normalize_language(language)


def normalize_language(language: str | None) -> str | None:
    """The ISO 639-1 code of a language option, lower case ("EN", "en-US" -> "en"); None to detect it.

    `ExtractionOptionsError` for one that is no such code, or a code neither jusText has a stoplist for
    nor the detector knows (`known_languages`): "xx" or "ger" ran jusText without a stoplist, silently.
    """
    if language is None:
        return None
    tag = _LANGUAGE_TAG.fullmatch(language.strip().lower()) if isinstance(language, str) else None
    if tag is None:
        raise ExtractionOptionsError(
            f"language must be an ISO 639-1 code such as 'de' (or None to detect it), got {language!r}"
        )
    code = tag.group(1)
    if code not in known_languages():
        with_stoplist = ", ".join(sorted(JUSTEXT_STOPLISTS))
        without = ", ".join(sorted(known_languages() - JUSTEXT_STOPLISTS.keys()))
        raise ExtractionOptionsError(
            f"language {language!r} is not one jusText has a stoplist for ({with_stoplist}) nor one the "
            f"language detector knows, which run without a stoplist ({without})"
        )
    return code


def _decode(html: str | bytes, encoding: str | None) -> tuple[str, str]:
    """The page's text and its encoding's name as browsers and HTTP clients know it (`whatwg_name`):
    Python's codec names (`cp1250`, `cp932`) are no charset label, and some name another decoder."""
    if not isinstance(html, str | bytes):
        raise ExtractionOptionsError(f"html must be str or bytes, got {type(html).__name__}")
    # decode_html gives text without lone surrogates (from surrogateescape-decoded text, as crawlers
    # write it), which made resiliparse and jusText raise and trafilatura return nothing.
    decoded = decode_html(html, encoding=encoding)
    return decoded.text, whatwg_name(decoded.encoding)


@dataclass(frozen=True)
class _Filter:
    min_words: int
    scorer: QualityScorer | None
    min_score: float

    def judge(self, name: str, text: str, counts: TextCounts) -> tuple[bool, float | None, str | None]:
        """(passed, score, why it failed); the scorer runs only on outputs that pass otherwise.

        A scorer that raises (or returns no number) raises `ExtractionError`: the attempt fails as an
        extractor's failure does, and the union goes on to the next extractor.
        """
        words, unreadable = counts.words, counts.unreadable
        if words == 0:
            # Whatever min_words says: with min_words=0, an empty output passed (0 >= 0) and the union
            # stopped at an extractor that found nothing, before one that found the text.
            return False, None, "no words"
        if words < self.min_words:
            return False, None, f"{words} words, fewer than the {self.min_words} needed"
        if unreadable > MAX_UNREADABLE_SHARE * len(text):
            return (
                False,
                None,
                f"{unreadable} of its {len(text)} characters are U+FFFD, control or invisible format "
                f"characters (over {MAX_UNREADABLE_SHARE:.0%}): binary input, or a page read with the "
                "wrong encoding",
            )
        misread = misread_codec(counts)
        if misread is not None:
            return False, None, misread
        if self.scorer is None:
            return True, None, None
        try:
            score = float(self.scorer(text))
        except Exception as exc:
            raise ExtractionError(
                f"the quality scorer failed on {name}'s output: {type(exc).__name__}: {str(exc)[:500]}"
            ) from exc
        if not math.isfinite(score):  # NaN compares False with everything: it passed
            return False, score, f"score {score:g}, not a finite number"
        if score < self.min_score:
            return False, score, f"score {score:g}, under the {self.min_score:g} needed"
        return True, score, None


def misread_codec(counts: TextCounts) -> str | None:
    """Why a text's counts say its page was read with the wrong single-byte codec, or None."""
    if (
        counts.utf8_misread >= MISREAD_MIN_CHARS
        and counts.utf8_misread > MAX_UTF8_MISREAD_SHARE * counts.non_ascii
    ):
        return (
            f"{counts.utf8_misread} of its {counts.non_ascii} non-ASCII characters are UTF-8 read one byte a "
            f"character (over {MAX_UTF8_MISREAD_SHARE:.0%}; 'Ã©' for 'é'): a UTF-8 page read with the wrong "
            "encoding"
        )
    if counts.latin_runs >= MISREAD_MIN_CHARS and counts.latin_runs > MAX_LATIN_RUN_SHARE * counts.alnum:
        return (
            f"{counts.latin_runs} of its {counts.alnum} letters and digits are in runs of Latin-1 letters no "
            f"language writes (over {MAX_LATIN_RUN_SHARE:.0%}; 'Ïðèâåò' for 'Привет'): a page in another "
            "script read with the wrong encoding"
        )
    return None


def unreadable_chars(text: str) -> int:
    """How many of `text`'s characters are U+FFFD, control characters (C0 other than whitespace, C1), or
    invisible format characters (`normalize.INVISIBLE_FORMAT`)."""
    return text_counts(text).unreadable


def _attempt(
    runner: Runner,
    name: str,
    shape: PageShape,
    text: str,
    language: str | None,
    timeout_s: Timeouts,
    flt: _Filter,
) -> tuple[Attempt, RawOutput | None, ExtractionError | None]:
    """One extractor's run and verdict; its failure is returned, for the caller to record. An
    `ExtractorLostError` (no `ExtractionError`) is raised through: the page was not tried."""
    started = time.perf_counter()
    try:
        # A page over the extractor's structural limits is refused here, before any worker sees it.
        check_page(name, shape)
        sent = time.perf_counter()
        out = runner.run(name, text, language=language, timeout_s=_timeout_for(timeout_s, name))
        # What the runner's call took beyond the extraction (`RawOutput.elapsed_s`, timed where it ran):
        # the wait for an idle worker, a new worker's start-up (a first job's took a second), the pipe.
        # A runner that does not time its extractions (a caller's own) has none: its whole call counts.
        overhead = 0.0 if out.elapsed_s is None else max(0.0, time.perf_counter() - sent - out.elapsed_s)
        counts = text_counts(out.text)
        words = counts.words
        passed, score, reason = flt.judge(name, out.text, counts)
    except ExtractionError as exc:
        elapsed = time.perf_counter() - started
        attempt = Attempt(
            name, 0, elapsed, False, error=str(exc), timed_out=isinstance(exc, ExtractionTimeoutError)
        )
        return attempt, None, exc
    elapsed = time.perf_counter() - started - overhead
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
    number for all, or a mapping per name; None means no bound (trusted input only). `language` (ISO
    639-1; "EN" and "en-US" are "en"; `normalize_language`) skips jusText's detection. `runner` defaults
    to the shared process pool. A single extractor's failure raises `ExtractionError`
    (`ExtractionTimeoutError` past the limit); the union raises only when every extractor failed.
    `ExtractorLostError` when the process running an extractor was killed from outside in each try: the
    page is to be tried again later, as a whole (the union does not take the next extractor's text for
    it).
    """
    started = time.perf_counter()
    if extractor == ALL:
        raise ExtractionOptionsError("extractor 'all' returns several texts: call extract_all")
    if extractor != UNION:
        _check_name(extractor)
    language = _check_options(timeout_s, min_words, min_score, language)
    text, codec = _decode(html, encoding)
    decode_s = time.perf_counter() - started
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
        elapsed_s=decode_s + sum(a.elapsed_s for a in attempts),
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
    the union would have accepted. Bad options raise; one extractor's failure does not, and neither does
    `ExtractorLostError` count as one: it raises, as in `extract`.
    """
    names = resolve_order(extractors)
    language = _check_options(timeout_s, min_words, min_score, language)
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
