"""The HTML-LM preprocessor: raw page in, pruned HTML out (the paper's section 2.2, on selectolax/Lexbor).

The algorithm, as the paper gives it:

1. Parse the document into a DOM (Lexbor, an HTML5 tree builder: the tree a browser builds).
2. Depth first, remove `<script>`, `<style>`, comments, and every subtree without plain-text content.
3. Keep all text and the tags around it; keep the tags of `KEEP_TAGS` even when they contain no text.
4. Strip every attribute.
5. Replace every element that has exactly one child element and no text of its own by that child.
6. Collapse each run of whitespace to one space.

Decisions where the paper is silent (each has a test in `tests/core/test_prune.py`; the reasoning is in
`docs/preprocessing.md`):

- "Text" is a text node with a non-whitespace character (Python's `str.isspace`, so U+00A0 and the
  other Unicode spaces are whitespace, as the whitespace tokenizer sees them). Whitespace-only text
  neither keeps an element (rule 2) nor counts as "text of its own" (rule 5), but it stays where it was,
  as one space, so words in neighbouring elements never run together.
- A subtree survives rule 2 when it holds text *or a kept tag*: `<div><img></div>` keeps the `<img>`,
  so it keeps the `<div>` around it, which rule 5 then replaces by the `<img>`.
- `<head>` is processed like any element: the `<title>` is text and survives; `<meta>`, `<link>`,
  `<base>` hold no text and go. A page with a title prints as `<html><title>...</title>...</html>`.
- `<noscript>` is removed with its content, like `<script>`: its content is what a browser that runs
  scripts never shows (mostly "enable JavaScript" notices and tracking pixels).
- `<template>` is removed with its content: it is inert until a script clones it.
- `<iframe>` is kept (it is in the keep list) as an empty element: its text content is fallback markup
  for browsers without frames, never shown. `<noembed>` and `<noframes>` go for the same reason.
- `<svg>` is kept as an empty element; its inner drawing (paths, `<text>` labels) is not page text.
  MathML is processed like HTML (its `<mi>x</mi>` is text).
- What a browser does not render goes with its content, like `<noscript>`: `<input type="hidden">`
  (kept without its attribute it would become a visible input), elements with the `hidden`
  attribute, and elements whose inline style says `display:none` or `visibility:hidden`.
- `<xmp>` and `<plaintext>` (obsolete raw-text elements) become `<pre>`, their text escaped, so the
  output re-parses to the same text.
- Entities are decoded once, by the parser; the output escapes exactly `&`, `<` and `>` in text, so it
  is valid HTML that decodes back to the page's text. Attributes are gone, so nothing else needs it.
- Tag names are lowercase (the parser lowercases HTML and MathML names; SVG content is dropped).
- Rule 5 is not applied where the result would re-parse into a different tree, which would make the
  pruner's output depend on whether it had been pruned before: a table-structure element (`table`,
  `tbody`, `tr`, `td`, ...) is never replaced and never replaces its parent (`<td>` outside a `<tr>` is
  dropped by every HTML parser); nor are `li`, `dt`, `dd`, `option`, `optgroup`, ruby annotations and
  `frame` moved up (an `<li>` directly in an `<li>` closes it); a `button`, `object`, `applet`,
  `marquee` or `select` (scope boundaries of the HTML parser) is never replaced; a heading is never
  replaced (`<h2><a>...</a></h2>` stays: whether its child could move up would depend on the
  heading's own parent) and never replaces an element whose parent is a heading (an `<h2>` directly
  in an `<h1>` closes it).
- Rule 6 also drops a space next to a block-level tag (`BLOCK_TAGS`: `div`, `p`, `li`, `td`, `br`,
  ...): a browser does not render it, and words on either side stay apart because the tag separates
  them. Spaces between inline elements stay (`<b>a</b> <i>b</i>`).
- The output has no leading or trailing space; an empty page (or one without text or kept tags) gives "".

Robustness (cheap checks before expensive work): input over `max_bytes` raises `InputTooLargeError`
before decoding; before parsing, `_prune_document` refuses a page whose tree would break the memory
bound (`InputTooLargeError`), one nesting deeper than `max_depth` or too deep for its tags
(`NestingTooDeepError`), one with an element of more than `MAX_ATTRIBUTES` attributes
(`TooManyAttributesError`), and one whose names share the parser's hash buckets so that looking them
up would take too long (`TooManyNamesError`); the tree's memory counts its tags, attributes,
re-created formatting elements and the copies of text nodes grown in many pieces. The estimates it
decides on are in `service.core.precheck` (each module's docstring gives its model and measurements):
they return numbers, it compares them with its caps.
Everything else returns a result. There is no Python recursion anywhere: the pruning runs as one loop
over the tokens of Lexbor's serialisation of the cleaned tree, with an explicit stack.

How it is fast: Lexbor does the parsing, removes scripts, styles, templates, noscripts and hidden
elements, and serialises the tree (all C); valid UTF-8 pages reach it as bytes, without a decode and
re-encode; comments and raw-text content go with one C-level regex pass; one
`re.split` turns the serialisation into (end-slash, tag name, following text) triples; and one Python
loop over those triples applies rules 2-5 to a flat output list, deciding each element when its end tag
arrives (dropping it truncates the list, collapsing it blanks its start tag). The serialiser's output is
well-formed (every non-void element has an end tag, `<` in text is always `&lt;`), which is what makes a
regex tokenizer exact here.
"""

from __future__ import annotations

import html as _html
import re
import sys

from selectolax.lexbor import LexborDocumentOptions, LexborHTMLParser, SelectolaxError

from service.core.decoding import decode_html, parser_input
from service.core.errors import ErrorCode, HtmllmError
from service.core.precheck.attributes import (
    MAX_ATTRIBUTES,
    count_attributes,
    max_attributes,
    merged_root_attributes,
    tags_with_attributes,
)
from service.core.precheck.elements import VOID
from service.core.precheck.memory import (
    MEMORY_PER_ATTRIBUTE,
    MEMORY_PER_CLONE,
    MEMORY_PER_END_TAG,
    MEMORY_PER_TAG,
    end_tags_without_elements,
)
from service.core.precheck.names import SELECTOR_ATTRIBUTE, estimate_name_lookups
from service.core.precheck.nesting import DEFAULT_MAX_DEPTH, estimate_depth
from service.core.precheck.reconstruction import reconstruction_bytes
from service.core.precheck.text_growth import text_growth_memory

# (14 was a rule reverted before its release, so the number is not reused; docs/preprocessing.md tells
# what each version changed.)
PRUNE_VERSION = "15"  # recorded in checkpoints; bump whenever the output for some input changes

DEFAULT_MAX_BYTES = 16 * 1024 * 1024  # larger pages are refused before parsing
# Peak memory is bounded by 10x the input plus 200 MiB (the costs charged: `service.core.precheck.memory`).
_MEMORY_HEADROOM = 150 * 1024 * 1024
# What an end tag that makes no element saves against the per-tag charge.
_END_TAG_SAVING = MEMORY_PER_TAG - MEMORY_PER_END_TAG
# An attribute can be written in two bytes (" a", "/a"): see `MEMORY_PER_ATTRIBUTE`.
_MIN_ATTRIBUTE_BYTES = 2
# Refused too: a page whose nesting is legal but whose tags are so many that the parser's walks down
# the stack of open elements (about a nanosecond per element, at each of most tags) would cost more
# than this many element visits per byte of page: 7,000 nested <div>s and a megabyte of <p>x</p>
# took 1.3 s. Corpus pages need at most 0.8 per byte. The headroom (about 0.1 s of walking) keeps
# small deep pages, and every page with fewer tags than DEFAULT_MAX_DEPTH, clear of it.
_NESTING_WORK_PER_BYTE = 200
_NESTING_WORK_HEADROOM = 100_000_000
# Refused too: a page whose tag and attribute names share Lexbor's hash buckets so that looking them up
# would take more than this many steps per byte (`service.core.precheck.names`: steps of about 2.3 ns,
# weighted where they miss the cache; about 4 s for 16 MB at the cap; 20,000 colliding names and
# 200,000 uses took 9 s for 2.4 MB). Corpus pages need at most 2.7 per byte; the headroom is about
# 0.25 s of walking.
_NAME_STEPS_PER_BYTE = 100
_NAME_STEPS_HEADROOM = 100_000_000

# Rule 3: tags kept even without text.
KEEP_TAGS = frozenset(
    {
        "a", "address", "audio", "br", "button", "col", "embed", "figure", "footer", "form", "frame",
        "header", "hr", "iframe", "img", "input", "label", "menu", "meter", "nav", "option", "output",
        "picture", "progress", "search", "select", "td", "th", "tr", "textarea", "video", "i", "svg",
    }
)  # fmt: skip
# Rule 2: removed with their content (scripts and styles by the paper; the rest by our decisions).
REMOVED_TAGS = ("script", "style", "noscript", "template", "noembed", "noframes")
_REMOVED_LIST = list(REMOVED_TAGS)
# Without DOM mutation events: with them, every <option> added to a <select> re-runs the select's
# option bookkeeping (quadratic: 20,000 options take 3 s); they only mirror the selected option
# into the rare <selectedcontent>, and change no corpus page.
_PARSER_OPTIONS = LexborDocumentOptions.WO_EVENTS
# Removed with their content too: what the user agent style sheet or an inline style hides.
_STYLE_HIDDEN_SELECTOR = (
    '[style*="display:none" i], [style*="display: none" i], '
    '[style*="visibility:hidden" i], [style*="visibility: hidden" i]'
)
HIDDEN_SELECTOR = f"[{SELECTOR_ATTRIBUTE.decode()}], {_STYLE_HIDDEN_SELECTOR}"
# Block-level elements (their boundaries break the line, so whitespace next to them is not rendered).
BLOCK_TAGS = frozenset(
    {
        "address", "article", "aside", "blockquote", "body", "br", "caption", "center", "dd",
        "details", "dialog", "dir", "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer",
        "form", "frameset", "h1", "h2", "h3", "h4", "h5", "h6", "head", "header", "hgroup", "hr", "html",
        "legend", "li", "listing", "main", "menu", "nav", "ol", "optgroup", "option", "p", "pre",
        "search", "section", "select", "summary", "table", "tbody", "td", "tfoot", "th", "thead",
        "title", "tr", "ul",
    }
)  # fmt: skip
# Tags as written to the output; block-level ones fenced by NUL (no text holds one: the parser drops
# them), so that the final pass can find the spaces next to them without parsing again.
_START_TAG = {name: f"\x00<{name}>\x00" for name in BLOCK_TAGS}
_END_TAG = {name: f"\x00</{name}>\x00" for name in BLOCK_TAGS}

# Rule 5 exceptions (see the module docstring): never replaced by their only child ...
_NEVER_REPLACED = frozenset(
    {
        "table", "caption", "colgroup", "thead", "tbody", "tfoot", "tr", "td", "th",
        "button", "object", "applet", "marquee", "select", "h1", "h2", "h3", "h4", "h5", "h6",
    }
)  # fmt: skip
# ... never moved up to take their parent's place ...
_NEVER_MOVED_UP = frozenset(
    {
        "caption", "col", "colgroup", "thead", "tbody", "tfoot", "tr", "td", "th",
        "li", "dt", "dd", "option", "optgroup", "rb", "rt", "rp", "rtc", "frame", "frameset",
    }
)  # fmt: skip
# ... and a heading never becomes the child of a heading.
_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})

# One tag of the serialisation: group 1 is "/" for an end tag, group 2 the name (attributes follow).
_TAG_SPLIT = re.compile(r"<(/?)([a-zA-Z][^\s/>]*)[^>]*>")
# Removed or rewritten before tokenizing: comments, processing instructions, hidden inputs, and the
# raw-text elements we rewrite (the serialiser writes their content literally; it cannot contain
# their end tag).
_CLEANUP = re.compile(
    r"<(?:!--.*?-->"
    r"|\?[^>]*>"
    r"|input\b[^>]*\btype=\"(?i:\s*hidden\s*)\"[^>]*>"
    r"|(iframe|xmp)\b[^>]*>(.*?)</\1>)",
    re.DOTALL,
)
_COLLAPSE_CHUNK = 1 << 20  # larger outputs are whitespace-collapsed chunk by chunk
# Lexbor's tokenizer writes a named character reference's value over the reference in its buffer without
# checking for room, and two are longer than written (6 bytes for 5): at the buffer's end each writes a
# byte past it, and pages of a few thousand in a row (`"&nGt;" * 5000`, or in an attribute's value)
# corrupted the heap and aborted the process. They reach the parser as numeric references (the same two
# characters; that path makes room), spelled as no page writes them, and where raw text (`<xmp>`,
# `<plaintext>`) or a tag's name keeps the spelling, the output gets the page's own back.
_SURROGATE = re.compile("[\ud800-\udfff]")
_LONGER_REFERENCES = {"&nGt;": "&#08811;&#8402;", "&nLt;": "&#08810;&#8402;"}
_LONGER_REFERENCES_BYTES = {key.encode(): value.encode() for key, value in _LONGER_REFERENCES.items()}
# Either of them, found in one pass over the page (two `in` tests took three times as long).
_LONGER_REFERENCE = re.compile("&n[GL]t;")
_LONGER_REFERENCE_BYTES = re.compile(b"&n[GL]t;")
# The first "<plaintext" of a serialisation (see `_rewrite_plaintext`).
_PLAINTEXT_START = re.compile(r"<plaintext\b")
_PLAINTEXT_END = "</plaintext>"


class PruneError(HtmllmError):
    """A page that cannot be pruned."""

    code = ErrorCode.PREPROCESS_FAILED


class InputTooLargeError(PruneError):
    """The page is larger than the byte cap, or has more tags than its memory budget allows."""

    code = ErrorCode.PAYLOAD_TOO_LARGE


class NestingTooDeepError(PruneError):
    """The page nests elements deeper than the configured cap."""


class TooManyAttributesError(PruneError):
    """An element of the page has more attributes than the configured cap."""


class TooManyNamesError(PruneError):
    """The page's tag or attribute names share the parser's hash buckets so much that looking them up
    would take too long (`service.core.precheck.names`)."""


class InvalidInputError(PruneError):
    """The input is neither text nor bytes."""

    code = ErrorCode.VALIDATION


class ParseFailedError(PruneError):
    """The HTML parser gave up on the page (it reported an error or ran out of memory)."""


def prune_html(
    html: str | bytes,
    *,
    encoding: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
    text_growth: bool = True,
    name_lookups: bool = True,
) -> str:
    """The pruned HTML of one page (deterministic, pure); raises only `PruneError` subclasses.

    `text_growth=False` leaves out the text growth check (`service.core.precheck.text_growth`), the
    costliest (about 40% of the corpus's pruning CPU): for a process whose own memory limit fails such
    a page alone, typed (`service.core.preparation.prune_document`); `name_lookups=False` the name
    lookup check (`service.core.precheck.names`, as costly): for a process stopped after a time limit."""
    if isinstance(html, (bytearray, memoryview)):
        html = bytes(html)
    if not isinstance(html, (str, bytes)):
        raise InvalidInputError(f"a page is str or bytes, not {type(html).__name__}")
    size = _byte_size(html, max_bytes)
    if size > max_bytes:
        raise InputTooLargeError(f"page of {size} bytes exceeds the cap of {max_bytes} bytes")
    # (bytes: as they are where they are UTF-8, else decoded; each sniff once)
    payload = parser_input(html, encoding=encoding) if isinstance(html, bytes) else decode_html(html).text
    return _prune_document(payload, max_depth, text_growth, name_lookups)


def prune_text(
    text: str, *, max_depth: int = DEFAULT_MAX_DEPTH, text_growth: bool = True, name_lookups: bool = True
) -> str:
    """Prune already-decoded page text (`prune_html` after decoding and the size check)."""
    return _prune_document(text, max_depth, text_growth, name_lookups)


def _prune_document(
    document: str | bytes, max_depth: int, text_growth: bool = True, check_names: bool = True
) -> str:
    """Check, parse (text, or bytes known to be UTF-8) and prune."""
    size = len(document)  # (the page's, as sent: the budget is for it)
    if isinstance(document, str) and not document.isascii() and _SURROGATE.search(document):
        # The parser encodes text to UTF-8 dropping lone surrogates (`<\udc80a` is an `<a>` to it): the
        # checks read what it reads (`prune_html` decodes them to U+FFFD before; `prune_text` may not).
        document = _SURROGATE.sub("", document)
    respelled = respell_longer_references(document)  # (before the checks: what the parser reads)
    if respelled is not None:
        document = respelled
    tags = document.count(b"<" if isinstance(document, bytes) else "<")  # type: ignore[arg-type]
    need = tags * MEMORY_PER_TAG
    budget = 10 * size + _MEMORY_HEADROOM
    if isinstance(document, str) and not document.isascii():
        # A decoded page is held beside its bytes, at up to 4 bytes a character, and so is its serialisation
        # (one emoji makes every character 4 bytes): 15 MB of `<abcdefghijklmnop>x</abcdefghijklmnop>y`
        # after an emoji peaked 2 MiB over the bound, ASCII only 50 MiB under it. Its size is charged.
        need += sys.getsizeof(document)
    # The most the page's attributes could take (each written in two bytes at least): where it fits the
    # budget, they are not counted (pages under about a megabyte that are not tag-dense).
    most_attributes = size // _MIN_ATTRIBUTE_BYTES * MEMORY_PER_ATTRIBUTE
    # Most end tags make no element: counted where charging them as elements could refuse the page (its
    # attributes, counted below, could fill the budget).
    ends: int | None = None
    if need + most_attributes > budget:
        ends = end_tags_without_elements(document)
        need -= ends * _END_TAG_SAVING
    if need > budget:
        raise InputTooLargeError(
            f"page has {tags} tags ({ends} of them end tags that make no element); pruning it would "
            f"take about {need >> 20} MiB (the budget for {size} bytes is {budget >> 20} MiB)"
        )
    # The checks made of passes in C (the attribute count: 0.4 s for 16 MB of `<a href=x>a`, 1.5 s for
    # 16 MB of 20-attribute tags) before the estimates that walk every tag in Python (that page of links,
    # refused for its attributes, took 15 s of nesting and reconstruction estimates first). What these
    # refuse the checks below would refuse too (`need` only grows): only the error of a page refused on
    # two counts can differ.
    most = max_attributes(document)
    if most > MAX_ATTRIBUTES:
        raise TooManyAttributesError(f"an element has {most} attributes; the cap is {MAX_ATTRIBUTES}")
    # After the cap no start tag holds more than MAX_ATTRIBUTES (the count is linear in an end tag's).
    attributes: int | None = None  # (all the page's, where counted: once)
    if need + most_attributes > budget:
        attributes = _all_attributes(document)
        _check_attribute_memory(need + attributes * MEMORY_PER_ATTRIBUTE, budget, tags, attributes, size)
    list_bytes, roots = tags_with_attributes(
        document, within=(budget - need) // tags if tags else None, cap=True
    )
    if roots is not None and (merged := merged_root_attributes(roots)) > MAX_ATTRIBUTES:
        raise TooManyAttributesError(
            f"the page's <html> and <body> tags have {merged} attributes, which the parser merges into "
            f"one element each; the cap is {MAX_ATTRIBUTES}"
        )
    del roots
    depth = 0 if tags <= max_depth else estimate_depth(document, limit=max_depth)
    if depth > max_depth:
        raise NestingTooDeepError(f"page nests more than {max_depth} elements deep (the cap)")
    if depth * tags > _NESTING_WORK_PER_BYTE * size + _NESTING_WORK_HEADROOM:
        raise NestingTooDeepError(
            f"page nests about {depth} elements deep and has {tags} tags: parsing it would take "
            f"{depth * tags // size} stack steps per byte (the cap is {_NESTING_WORK_PER_BYTE})"
        )
    clone_bytes = list_bytes * tags  # (what re-created formatting elements take at most)
    clones: int | None = None  # (what they take, where counted)
    if need + clone_bytes > budget:
        if ends is None:  # the replay below costs far more than this count
            ends = end_tags_without_elements(document)
            need -= ends * _END_TAG_SAVING
        clones = reconstruction_bytes(document, limit=budget - need)
        need += clones
        if need > budget:
            raise InputTooLargeError(
                f"page leaves so many formatting elements open that the parser would re-create them, taking "
                f"more than {clones >> 20} MiB (the budget for {size} bytes is {budget >> 20} MiB)"
            )
    # Charged with the clones (checked above without them): before the name lookups, as costly as those.
    if need + most_attributes > budget:
        if attributes is None:
            attributes = _all_attributes(document)
        need += attributes * MEMORY_PER_ATTRIBUTE
        _check_attribute_memory(need, budget, tags, attributes, size)
    selector = HIDDEN_SELECTOR
    if check_names:
        cap = _NAME_STEPS_PER_BYTE * size + _NAME_STEPS_HEADROOM
        steps, per_element = estimate_name_lookups(document, within=cap)
        if not per_element:  # (no element has the attribute: its lookup at each would find nothing)
            selector = _STYLE_HIDDEN_SELECTOR
        # Elements: one per tag, one more each it may imply, the three every page has, and the clones
        # (counted where their cheap bound would refuse the page: a few pages in a hundred).
        elements = 2 * tags + 3
        if (
            steps <= cap
            and clones is None
            and steps + (elements + clone_bytes // MEMORY_PER_CLONE) * per_element > cap
        ):
            clones = reconstruction_bytes(document, limit=clone_bytes)
        steps += (
            elements + (clone_bytes if clones is None else min(clones, clone_bytes)) // MEMORY_PER_CLONE
        ) * per_element
        if steps > cap:
            raise TooManyNamesError(
                f"page has so many tag or attribute names sharing the parser's hash buckets that looking "
                f"them up would take about {steps // max(size, 1)} steps per byte (the cap is "
                f"{_NAME_STEPS_PER_BYTE})"
            )
    # A text node grown in many pieces with allocations between them: Lexbor copies it at each (a
    # megabyte of `<td>1</td>y` or `y</x a=b>` takes gigabytes). Last: within the budget, the estimate
    # may be a cheap bound.
    copied = 0
    if text_growth:
        copied = text_growth_memory(document, tags=tags, within=budget - need, respelled=True)
    if need + copied > budget:
        raise InputTooLargeError(
            f"page grows text nodes in so many pieces (text moved out of a table, or split by tags that "
            f"make no element) that the parser's copies would take about {copied >> 20} MiB (the budget "
            f"for {size} bytes is {budget >> 20} MiB)"
        )
    # Each stage's input is released before the next one peaks: the tree before tokenizing ends,
    # the token list before the output is joined.
    parts = _tokenize(_clean_serialization(document, selector))
    out = _apply_rules(parts)
    del parts
    pruned = _finish(out)
    if respelled is not None:  # (where raw text or a tag's name kept the spelling, the page's own back)
        for written, spelled in _LONGER_REFERENCES.items():
            # (Escaped: text, `<xmp>`'s; as is: a tag's name, which the parser lowercased.)
            pruned = pruned.replace(spelled, written.lower()).replace(
                _html.escape(spelled, quote=False), _html.escape(written, quote=False)
            )
    return pruned


def _all_attributes(document: str | bytes) -> int:
    """The attributes of all the page's tags, end tags' too: an end tag's attributes take memory as well
    (about 85 bytes each: 16 MB of `<b>x</b a b ... z>y` peaked at 720 MiB uncharged), so each end tag
    is counted read as a start tag."""
    ends_read_as_starts = (
        document.replace(b"</", b"<") if isinstance(document, bytes) else document.replace("</", "<")
    )
    return count_attributes(ends_read_as_starts)


def _check_attribute_memory(need: int, budget: int, tags: int, attributes: int, size: int) -> None:
    """Refuse a page whose tags and attributes (`need`, charged) break its memory `budget`."""
    if need > budget:
        raise InputTooLargeError(
            f"page has {tags} tags and {attributes} attributes; pruning it would take about "
            f"{need >> 20} MiB (the budget for {size} bytes is {budget >> 20} MiB)"
        )


def respell_longer_references(document: str | bytes) -> str | bytes | None:
    """The page with `_LONGER_REFERENCES` respelled, or None where it has none: for any caller that
    parses untrusted HTML with Lexbor (`model_training.evaluation.derive` too)."""
    if isinstance(document, bytes):
        if _LONGER_REFERENCE_BYTES.search(document) is None:
            return None
        for written_bytes, spelled_bytes in _LONGER_REFERENCES_BYTES.items():
            document = document.replace(written_bytes, spelled_bytes)
        return document
    if _LONGER_REFERENCE.search(document) is None:
        return None
    for written, spelled in _LONGER_REFERENCES.items():
        document = document.replace(written, spelled)
    return document


def _clean_serialization(document: str | bytes, selector: str = HIDDEN_SELECTOR) -> str:
    """Lexbor's serialisation of the page, `REMOVED_TAGS` and hidden elements (`selector`) removed."""
    try:
        tree = LexborHTMLParser(document, scripting=True, options=_PARSER_OPTIONS)
        tree.strip_tags(_REMOVED_LIST, recursive=True)
        for node in tree.css(selector):
            node.decompose()
        root = tree.root
        if root is None:
            return ""
        html = root.html
    except (SelectolaxError, MemoryError) as exc:
        raise ParseFailedError(f"the HTML parser failed: {exc}") from exc
    if html is None:  # what Lexbor returns when it cannot allocate the output (a memory limit): no page
        raise ParseFailedError("the HTML parser failed to write the page out (out of memory)")
    return html


def _byte_size(html: str | bytes, max_bytes: int) -> int:
    """The page's size in bytes (UTF-8 for text), computed only as far as the cap needs."""
    if isinstance(html, bytes):
        return len(html)
    if len(html) > max_bytes or len(html) * 4 <= max_bytes:
        return len(html)
    return len(html.encode("utf-8", errors="surrogatepass"))


def _rewrite_raw(match: re.Match[str]) -> str:
    """Removed elements, comments and hidden inputs vanish; an iframe loses its fallback text; xmp
    becomes pre with its text escaped."""
    tag = match.group(1)
    if tag is None:
        return ""
    if tag == "iframe":
        return "<iframe></iframe>"
    return "<pre>" + _html.escape(match.group(2), quote=False) + "</pre>"


def _rewrite_plaintext(serialized: str) -> str:
    """The serialisation with its <plaintext> element as a <pre> of its escaped text (Lexbor writes the
    element's text literally, up to its end tag at the end of the page).

    What `re.sub(r"<plaintext\\b[^>]*>(.*)</plaintext>", ..., flags=re.DOTALL)` does, in linear time:
    there the greedy `.*` ran from every "<plaintext" to the page's end and back, and "<plaintext>" is
    written literally in comments and iframe text too, so 300 KB of `<!--<plaintext>-->` held the GIL
    for 14 s. That regex replaces at most one span: from the first "<plaintext" whose tag's ">" comes
    before the last "</plaintext>" to that end tag (the match consumes it, and no end tag is left for
    a later start). Only the first "<plaintext" can be that one: a later one either shares its ">" or
    starts past the last end tag.
    """
    start = _PLAINTEXT_START.search(serialized)
    last = serialized.rfind(_PLAINTEXT_END)
    if start is None or last < 0:
        return serialized
    close = serialized.find(">", start.end())
    if close < 0 or close >= last:
        return serialized
    text = _html.escape(serialized[close + 1 : last], quote=False)
    return serialized[: start.start()] + "<pre>" + text + "</pre>" + serialized[last + len(_PLAINTEXT_END) :]


def _prune_serialization(serialized: str) -> str:
    """Rules 2-6 over Lexbor's serialisation of the tree (`REMOVED_TAGS` already removed)."""
    return _finish(_apply_rules(_tokenize(serialized)))


def _tokenize(serialized: str) -> list[str]:
    """[text, slash, name, text, ...] of the serialisation, comments and raw text dealt with."""
    if "<plaintext" in serialized:  # first: its literal content may hold anything
        serialized = _rewrite_plaintext(serialized)
    return _TAG_SPLIT.split(_CLEANUP.sub(_rewrite_raw, serialized))


def _finish(out: list[str]) -> str:
    """Rule 6 over the joined pieces (which it empties, to free them early)."""
    text = "".join(out)
    out.clear()
    # The serialiser writes U+00A0 as &nbsp; (the rules treat it as the whitespace it is).
    text = text.replace("&nbsp;", " ")
    # str.split() splits on exactly the whitespace str.isspace() sees.
    text = " ".join(text.split()) if len(text) < _COLLAPSE_CHUNK else _collapse_in_chunks(text)
    # Whitespace next to a block-level tag is not rendered: every piece between two fences touches a
    # block-level tag at both ends (or the page's start or end), so stripping each piece drops exactly
    # those spaces, and joining drops the fences.
    return "".join(map(str.strip, text.split("\x00")))


def _collapse_in_chunks(text: str) -> str:
    """`" ".join(text.split())` without a list of every word of a huge page at once."""
    pieces = []
    for i in range(0, len(text), _COLLAPSE_CHUNK):
        chunk = text[i : i + _COLLAPSE_CHUNK]
        words = " ".join(chunk.split())
        lead = " " if chunk[0].isspace() else ""
        trail = " " if chunk[-1].isspace() and words else ""
        pieces.append(lead + words + trail)
    text = "".join(pieces)
    del pieces
    while "  " in text:  # runs that straddled a chunk boundary
        text = text.replace("  ", " ")
    return text.strip()


def _apply_rules(parts: list[str]) -> list[str]:
    """One pass over [text, slash, name, text, slash, name, text, ...]: rules 2-5, iteratively.

    The output is a flat list of pieces. Each open element is a frame (tag, index of its start tag in
    `out`, kept element children, has own text, the tag its last kept child ended up as); the current
    frame lives in locals, its ancestors on `stack`. When an element ends, it is dropped (truncate
    `out` to its start), replaced by its only child (blank its start tag, write no end tag) or kept.
    """
    out: list[str] = []
    append = out.append
    stack: list[tuple[str, int, int, bool, str]] = []
    push, pop = stack.append, stack.pop
    start_tag, end_tag = _START_TAG.get, _END_TAG.get
    keep, void, never_replaced, never_moved_up, headings = (
        KEEP_TAGS,
        VOID,
        _NEVER_REPLACED,
        _NEVER_MOVED_UP,
        _HEADINGS,
    )
    tag, start, kids, has_text, last = "", 0, 0, False, ""
    svg_depth = 0  # > 0 while inside an <svg>, whose content is dropped

    first = parts[0]
    if first:
        if first.isspace() or ("&nbsp;" in first and first.replace("&nbsp;", " ").isspace()):
            append(" ")
        else:
            append(first)
            has_text = True

    for slash, name, text in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        if svg_depth:
            if name == "svg":
                svg_depth += -1 if slash else 1
            if svg_depth:
                continue
        elif slash:
            if name != tag:
                # The serialiser writes balanced tags, but never trust it blindly: close the frames
                # up to the matching element, or ignore an end tag without one.
                if all(frame[0] != name for frame in stack):
                    continue
                while tag != name:
                    tag, start, kids, has_text, last = _close(out, stack, tag, start, kids, has_text, last)
            ptag, pstart, pkids, ptext, plast = pop()
            if has_text or (kids == 0 and tag in keep):
                append(end_tag(tag) or "</" + tag + ">")
                tag, start, kids, has_text, last = ptag, pstart, pkids + 1, ptext, tag
            elif kids == 0:
                del out[start:]
                tag, start, kids, has_text, last = ptag, pstart, pkids, ptext, plast
            elif (
                kids == 1
                and tag not in never_replaced
                and last not in never_moved_up
                and not (last in headings and ptag in headings)
            ):
                out[start] = ""
                tag, start, kids, has_text, last = ptag, pstart, pkids + 1, ptext, last
            else:
                append(end_tag(tag) or "</" + tag + ">")
                tag, start, kids, has_text, last = ptag, pstart, pkids + 1, ptext, tag
        elif name in void:
            if name in keep:
                append(start_tag(name) or "<" + name + ">")
                kids += 1
                last = name
        elif name == "svg":
            append("<svg></svg>")
            kids += 1
            last = "svg"
            svg_depth = 1
            continue  # the text after <svg> is inside it
        else:
            push((tag, start, kids, has_text, last))
            tag, start, kids, has_text, last = name, len(out), 0, False, ""
            append(start_tag(name) or "<" + name + ">")

        if text:
            if text.isspace() or ("&nbsp;" in text and text.replace("&nbsp;", " ").isspace()):
                append(" ")
            else:
                append(text)
                has_text = True

    while stack:
        tag, start, kids, has_text, last = _close(out, stack, tag, start, kids, has_text, last)
    return out


def _close(
    out: list[str],
    stack: list[tuple[str, int, int, bool, str]],
    tag: str,
    start: int,
    kids: int,
    has_text: bool,
    last: str,
) -> tuple[str, int, int, bool, str]:
    """End the current element (the rare path: an unclosed element); return the parent's frame.

    The same decision as the inline one in `_apply_rules`.
    """
    parent, pstart, pkids, ptext, plast = stack.pop()
    if has_text or (kids == 0 and tag in KEEP_TAGS):
        out.append(_END_TAG.get(tag) or "</" + tag + ">")
        return parent, pstart, pkids + 1, ptext, tag
    if kids == 0:
        del out[start:]
        return parent, pstart, pkids, ptext, plast
    if (
        kids == 1
        and tag not in _NEVER_REPLACED
        and last not in _NEVER_MOVED_UP
        and not (last in _HEADINGS and parent in _HEADINGS)
    ):
        out[start] = ""
        return parent, pstart, pkids + 1, ptext, last
    out.append(_END_TAG.get(tag) or "</" + tag + ">")
    return parent, pstart, pkids + 1, ptext, tag
