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
before decoding, and so does a page with so many tags that its tree would break the memory bound
(peak RSS under 10x the input plus 200 MB: about `_MEMORY_PER_TAG` bytes per `<` and
`_MEMORY_PER_ATTRIBUTE` per attribute, and `_MEMORY_PER_CLONE` for each element the parser would
re-create from formatting elements left open: `reconstruction_bytes`); a page nesting
deeper than `max_depth` raises `NestingTooDeepError` (Lexbor's tree builder is quadratic in nesting
depth: 100,000 nested `<div>`s take half a minute), and so does one whose depth times its tags passes
`_NESTING_WORK_PER_BYTE` per byte (each tag walks the open elements: 7,000 nested `<div>`s and a
megabyte of `<p>x</p>` took 1.3 s); an element with more than `MAX_ATTRIBUTES` attributes raises
`TooManyAttributesError` (its tokenizer is quadratic in them too: a million would take an hour). The
depth, attribute and formatting-element checks read the page's tags as the HTML tokenizer does
(`_tag_tokens`: a `</b>` or `<!--` in an attribute value, a bogus comment or raw text is no tag,
comments end where the tokenizer ends them, raw text inside `<svg>` is markup), each in linear time;
where the parser's reading depends on the tree (an `<svg>` integration point holding HTML, a
`<frameset>`), they read every `<` and a letter as a tag and trust no end tag, erring long.
Everything else returns a result. There is no Python recursion anywhere: the pruning runs as one loop
over the tokens of Lexbor's serialisation of the cleaned tree, with an explicit stack.

How it is fast: Lexbor does the parsing, removes scripts, styles, templates, noscripts and hidden
elements, and serialises the tree (all C); UTF-8 pages reach it as bytes, without a decode and
re-encode; comments and raw-text content go with one C-level regex pass; one
`re.split` turns the serialisation into (end-slash, tag name, following text) triples; and one Python
loop over those triples applies rules 2-5 to a flat output list, deciding each element when its end tag
arrives (dropping it truncates the list, collapsing it blanks its start tag). The serialiser's output is
well-formed (every non-void element has an end tag, `<` in text is always `&lt;`), which is what makes a
regex tokenizer exact here.
"""

from __future__ import annotations

import bisect
import html as _html
import itertools
import operator
import re
from collections.abc import Iterator

from selectolax.lexbor import LexborDocumentOptions, LexborHTMLParser, SelectolaxError

from service.core.decoding import decode_html, utf8_payload
from service.core.errors import ErrorCode, HtmllmError

PRUNE_VERSION = "7"  # recorded in checkpoints; bump whenever the output for some input changes

DEFAULT_MAX_BYTES = 16 * 1024 * 1024  # larger pages are refused before parsing
DEFAULT_MAX_DEPTH = 8192  # deeper nesting is refused before parsing (see the module docstring)
# Peak memory is bounded by 10x the input plus 200 MiB: Lexbor's tree and the pruning lists take at
# most about _MEMORY_PER_TAG bytes per "<" (measured on pages made of nothing but "<p>x"), so a page
# with more tags than its budget allows is refused before parsing (the interpreter keeps the rest).
_MEMORY_PER_TAG = 400
_MEMORY_HEADROOM = 150 * 1024 * 1024
# Each attribute takes Lexbor about 250 bytes more (measured: 250-300 on pages of `<b a b c d e f>x</b>`
# and of tags with 26 to 1,000 distinct names), and one can be written in two bytes (" a", "/a"): a
# 16 MiB page of 676-attribute tags took 1.35 GB under the per-tag charge alone. Counted only where
# the most attributes a page could hold would break its budget (pages over about a megabyte).
_MEMORY_PER_ATTRIBUTE = 250
_MIN_ATTRIBUTE_BYTES = 2
# A formatting element the parser re-creates (see `reconstruction_bytes`) costs about a tag's memory and
# 2 us: 60 KB of `<p><b id=N>x` made 8 million of them (16 s, 3.2 GB).
_MEMORY_PER_CLONE = _MEMORY_PER_TAG
MAX_ATTRIBUTES = 1024  # an element with more is refused before parsing (see max_attributes)
_LONG_TAG_CHARS = 2 * MAX_ATTRIBUTES  # a tag with that many attributes is at least this long

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
HIDDEN_SELECTOR = (
    '[hidden], [style*="display:none" i], [style*="display: none" i], '
    '[style*="visibility:hidden" i], [style*="visibility: hidden" i]'
)
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

# Elements the serialiser writes without an end tag (HTML void elements).
_VOID = frozenset(
    {
        "area", "base", "basefont", "bgsound", "br", "col", "embed", "frame", "hr", "img", "input",
        "keygen", "link", "meta", "param", "source", "track", "wbr",
    }
)  # fmt: skip

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
# The first "<plaintext" of a serialisation (see `_rewrite_plaintext`).
_PLAINTEXT_START = re.compile(r"<plaintext\b")
_PLAINTEXT_END = "</plaintext>"
# For the nesting pre-check: elements that cannot nest without bound, void elements and those the parser
# closes when another one of them opens (`<p>`, `<li>`, `<td>`, `<a>`, ...), which real pages leave
# unclosed by the thousand. `dt`, `dd`, `optgroup`, the ruby annotations, `form` and `select` nest:
# `<li><dt><li><dt>` and `<nobr><select><nobr><select>` are chains, `<optgroup>` and `<rb>` nest
# outside a `<select>`, a `<ruby>`, and `<form>` inside a `<template>`. Inside <svg> and <math> every
# element nests (`<td>`, `<a>`, `<input>` there are foreign elements) but a self-closing one. Only
# where the scan cannot follow the parser (in a `<select>`, ...) are they left uncounted: where it does,
# each counts, as the estimate pops it where the parser does (behind a scope boundary a chain of
# them nests: `<td><li><button><li><p><option>` nine levels deep a `<table>`).
_NOT_NESTING = frozenset(
    b"""area base basefont bgsound br col embed frame hr img input keygen link meta param source track wbr
    p li td th tr option tbody thead tfoot colgroup caption html head body button""".split()
)
# Raw-text and RCDATA elements: the tokenizer reads no tags in them up to their end tag.
_RAW_TEXT_NAMES = rb"script|style|textarea|title|xmp|iframe|noembed|noframes|noscript|plaintext"
_COMMENT_CLOSE = re.compile(rb"--!?>")
_RAW_TEXT_CLOSE = {name: re.compile(b"</" + name + rb"[\t\n\f\r />]") for name in _RAW_TEXT_NAMES.split(b"|")}
# The rest of a tag as the HTML tokenizer reads it: attribute names, each maybe with "=" and a value; a
# ">" inside a quoted value does not end the tag (an unterminated one runs to the end). A value follows
# only a name: where a name may start (after the tag's name, a space, a "/" or a quoted value) "=" and
# quotes are the name's first character (`<br ="><div>">` is one tag `<br =">`: read as a value, it
# hid the `<div>`s of a page that took 16 s a megabyte to parse).
_TAG_ATTRIBUTES_REST = (
    rb"""(?:[\t\n\f\r /]++|[^\t\n\f\r />][^\t\n\f\r />=]*+"""
    rb"""(?:[\t\n\f\r ]*+=[\t\n\f\r ]*+(?:"[^"]*+"?|'[^']*+'?|[^\t\n\f\r >]*+))?)*+"""
)
_TAG_REST = rb"[^\t\n\f\r />]*+" + _TAG_ATTRIBUTES_REST
# Refused too: a page whose nesting is legal but whose tags are so many that the parser's walks down
# the stack of open elements (about a nanosecond per element, at each of most tags) would cost more
# than this many element visits per byte of page: 7,000 nested <div>s and a megabyte of <p>x</p>
# took 1.3 s. Corpus pages need at most 0.8 per byte. The headroom (about 0.1 s of walking) keeps
# small deep pages, and every page with fewer tags than DEFAULT_MAX_DEPTH, clear of it.
_NESTING_WORK_PER_BYTE = 200
_NESTING_WORK_HEADROOM = 100_000_000

# The HTML Standard's formatting elements but <a>, which the list holds once after its last marker (see
# `_FORMATTING`): three copies of each, and every one with attributes, bound the list
# (`_tags_with_attributes`, on lowercased bytes).
_FORMATTING_NAMES = b"b big code em font i nobr s small strike strong tt u".split()
_FORMATTING_WITH_ATTRIBUTES = re.compile(  # (the first letters first: most "<" start none of these)
    rb"<(?=[abcefhinstu])(?:b(?:ig)?|code|em|font|i|nobr|s(?:mall|trike|trong)?|tt|u|(html|body)|(a))"
    rb"(?=[\t\n\f\r /])"
    rb"(" + _TAG_ATTRIBUTES_REST + rb")"
)
# Every formatting start tag (with or without attributes): the list holds no more entries than the page
# has of those (a clone replaces the entry it copies).
_FORMATTING_START = re.compile(
    rb"<(?=[abcefinstu])(?:b(?:ig)?|code|em|font|i|nobr|s(?:mall|trike|trong)?|tt|u|a)(?=[\t\n\f\r />])"
)
# The attributes of an <html> or <body> start tag: the parser merges those of every repeated one into the
# one element, checking each against those it has (90,000 `<html aN>` took 30 s).
_ROOT_ATTRIBUTES = re.compile(rb"<(?:html|body)(?=[\t\n\f\r /])(" + _TAG_ATTRIBUTES_REST + rb")")
_FEW_ROOT_TAGS = 16  # <html>/<body> tags with attributes a page may have before they are counted
_NOAHS_ARK = 3  # entries of one name and attributes the list keeps
_ADOPTION_ROUNDS = 8  # the adoption agency's outer loop gives up after this many
# Elements that bound the parser's "in scope" (an end tag of a formatting element outside it is
# ignored), and the special elements its adoption agency stops at (void ones never stay open).
_SCOPE_BOUNDARIES = frozenset(
    b"""applet caption marquee object table td template th svg math desc foreignobject title
    mi mo mn ms mtext annotation-xml select""".split()
)  # a <select> ignores end tags but its own
_SPECIAL = frozenset(
    b"""address article aside blockquote body button center dd details dir div dl dt fieldset
    figcaption figure footer form frameset h1 h2 h3 h4 h5 h6 head header hgroup html iframe li listing main
    menu nav noembed noframes noscript ol p plaintext pre search section summary tbody textarea tfoot
    thead tr ul xmp""".split()
)
# <a> is a formatting element too, of which the parser keeps one after the last marker: a new <a>
# takes the open one off the list (`reconstruction_bytes`). One <a> of 1,000 attributes left open was
# re-created in each of 60,000 paragraphs: 9.7 GB.
_FORMATTING = frozenset((*_FORMATTING_NAMES, b"a"))
_CLOSED_BY_BLOCKS = frozenset((b"p", b"li", b"dd", b"dt"))  # a block start closes one left open
_CELLS = frozenset((b"td", b"th", b"caption"))  # what the parser closes, clearing its marker, in a table
# Start tags that, in a table, close its open cell or caption and then pop every element above the
# table (or its row group or row): those it holds, and those foster-parented out of it (`<table><b>`
# leaves the <b> on the list, and text in the table re-creates it), without clearing their markers.
_TABLE_STARTS = frozenset(b"caption col colgroup tbody thead tfoot tr td th".split())
# End tags whose work in a table the estimate follows (`reconstruction_bytes`).
_TABLE_ENDS = frozenset(b"table tbody thead tfoot tr td th caption template".split())
# Tags whose reading by the parser, where the scan cannot follow it (a <select>, a taint), may pop or
# insert a table, a cell or a marker the estimate then does not know of.
_PIVOTS = _TABLE_STARTS | _TABLE_ENDS | {b"applet", b"marquee", b"object"}
# End tags that may make the parser clear its list to the last marker (start tags: `_TABLE_STARTS`, which
# close an open cell or caption): what closes a cell, a caption, an <object>, ... or a template.
_CLEARING_ENDS = _TABLE_ENDS | {b"applet", b"marquee", b"object"}
# Start tags the parser never reconstructs the active formatting elements for, whatever its insertion
# mode (a <div>, a table's parts, what goes to the head's rules, void elements it inserts and pops at
# once, raw text, ...): what is off the stack stays off, to be re-created by the text or tag after.
_NO_RECONSTRUCTION = frozenset(
    b"""address article aside blockquote center details dialog dir div dl fieldset figcaption figure footer
    header hgroup main menu nav ol p search section summary ul h1 h2 h3 h4 h5 h6 pre listing plaintext
    li dd dt hr form table caption col colgroup tbody thead tfoot tr td th frame frameset html head body
    base basefont bgsound link meta noframes script style template title textarea iframe noembed
    noscript param source track rb rp rt rtc""".split()
)
# ... and those it reconstructs for in some modes only (an <input type=hidden> in a table is none).
_MAY_RECONSTRUCT = frozenset((b"input",))
# Start tags after which the text is no HTML text (raw text, a select's, foreign content).
_NOT_HTML_AFTER = frozenset(
    (*_RAW_TEXT_NAMES.split(b"|"), b"select", b"svg", b"math", b"frameset", b"template")
)
_TEXT_CHARACTER = re.compile(rb"[^\t\n\f\r \x00]")
_CHARACTER = re.compile(rb"[^\x00]")
_SCAN_AFTER = 64  # live entries looked at for the adoption agency's inner clones (then: the heaviest)
# Start tags that close a <p> in button scope (<table> only in no-quirks mode, <form> only when no form
# is open: both handled apart).
_CLOSES_P = frozenset(
    b"""address article aside blockquote center details dialog dir div dl fieldset figcaption figure footer
    header hgroup main menu nav ol p search section summary ul h1 h2 h3 h4 h5 h6 pre listing plaintext xmp
    li dd dt hr""".split()
)
# Start tags that close an element left open (and with it what it holds): a block start the open
# <p>, an <li> the open <li>, and so on. (Not a <button>, a <tbody> outside a table, ...: the parser
# leaves the <p> open, and its end pops what it holds then.)
_IMPLIED_ENDS: dict[bytes, tuple[bytes, ...]] = {
    **{name: (b"p",) for name in _CLOSES_P},
    b"li": (b"p", b"li"),
    b"dd": (b"p", b"dd", b"dt"),
    b"dt": (b"p", b"dd", b"dt"),
    b"td": (b"td", b"th"),
    b"th": (b"td", b"th"),
    b"tr": (b"td", b"th", b"tr"),
    b"option": (b"option",),
    b"optgroup": (b"option", b"optgroup"),
}
# Boundaries that insert a marker in the list of active formatting elements: closing one clears the
# list up to it (each table cell of an old layout leaves its <font> open, and the next cell clears it).
_MARKERS = frozenset(b"td th caption applet marquee object template".split())
# For the attribute pre-check: a whole tag (see _TAG_REST), and what follows its name.
_TAG_EXTENT = re.compile(rb"<[a-zA-Z]" + _TAG_REST)
_TAG_ATTRIBUTES = re.compile(rb"<[a-zA-Z][^\t\n\f\r />]*+(" + _TAG_ATTRIBUTES_REST + rb")")
# The unquoted attribute value a final "/" may belong to (`<g a=x/>` is no self-closing tag).
_UNQUOTED_TAIL = re.compile(rb"""=[\t\n\f\r ]*+[^\t\n\f\r >"'][^\t\n\f\r >]*+\Z""")
_ATTRIBUTE_VALUE = re.compile(rb"""=[\t\n\f\r ]*+(?:"[^"]*+"?|'[^']*+'?|[^\t\n\f\r >]*+)""")
_ATTRIBUTE_NAME = re.compile(rb"[^\t\n\f\r />]+")
# For counting names: their characters to "a", the characters between them (`_ATTRIBUTE_NAME`'s) to " ".
_NAME_RUNS = bytes.maketrans(bytes(range(256)), bytes(32 if c in b"\t\n\f\r />" else 97 for c in range(256)))
_COUNT_TAGS = 64
# The same, keeping the ">" between tags, to count each tag's names apart.
_NAME_RUNS_BY_TAG = bytes(62 if c == 62 else b for c, b in enumerate(_NAME_RUNS))
_COUNT_RUNS = operator.methodcaller("count", b" a")
# A quoted attribute value with a ">" in it: the only way a tag outgrows the run of text around it.
_QUOTED_GT = re.compile(rb"""=[\t\n\f\r ]*+(?:"[^">]*+>|'[^'>]*+>)""")
_TAG_START = re.compile(rb"<[a-zA-Z]")


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
) -> str:
    """The pruned HTML of one page (deterministic, pure); raises only `PruneError` subclasses."""
    if isinstance(html, (bytearray, memoryview)):
        html = bytes(html)
    if not isinstance(html, (str, bytes)):
        raise InvalidInputError(f"a page is str or bytes, not {type(html).__name__}")
    size = _byte_size(html, max_bytes)
    if size > max_bytes:
        raise InputTooLargeError(f"page of {size} bytes exceeds the cap of {max_bytes} bytes")
    payload: str | bytes | None = utf8_payload(html, encoding=encoding) if isinstance(html, bytes) else None
    if payload is None:
        payload = decode_html(html, encoding=encoding).text
    return _prune_document(payload, max_depth)


def prune_text(text: str, *, max_depth: int = DEFAULT_MAX_DEPTH) -> str:
    """Prune already-decoded page text (`prune_html` after decoding and the size check)."""
    return _prune_document(text, max_depth)


def _prune_document(document: str | bytes, max_depth: int) -> str:
    """Check, parse (text, or bytes known to be UTF-8) and prune."""
    tags = document.count(b"<" if isinstance(document, bytes) else "<")  # type: ignore[arg-type]
    need = tags * _MEMORY_PER_TAG
    budget = 10 * len(document) + _MEMORY_HEADROOM
    if need > budget:
        raise InputTooLargeError(
            f"page has {tags} tags; pruning it would take about {need >> 20} MiB "
            f"(the budget for {len(document)} bytes is {budget >> 20} MiB)"
        )
    depth = 0 if tags <= max_depth else estimate_depth(document, limit=max_depth)
    if depth > max_depth:
        raise NestingTooDeepError(f"page nests more than {max_depth} elements deep (the cap)")
    if depth * tags > _NESTING_WORK_PER_BYTE * len(document) + _NESTING_WORK_HEADROOM:
        raise NestingTooDeepError(
            f"page nests about {depth} elements deep and has {tags} tags: parsing it would take "
            f"{depth * tags // len(document)} stack steps per byte (the cap is {_NESTING_WORK_PER_BYTE})"
        )
    attributes = max_attributes(document)
    if attributes > MAX_ATTRIBUTES:
        raise TooManyAttributesError(f"an element has {attributes} attributes; the cap is {MAX_ATTRIBUTES}")
    list_bytes, roots = _tags_with_attributes(
        document, within=(budget - need) // tags if tags else None, cap=True
    )
    if roots is not None and (merged := merged_root_attributes(roots)) > MAX_ATTRIBUTES:
        raise TooManyAttributesError(
            f"the page's <html> and <body> tags have {merged} attributes, which the parser merges into "
            f"one element each; the cap is {MAX_ATTRIBUTES}"
        )
    del roots
    if need + list_bytes * tags > budget:
        clones = reconstruction_bytes(document, limit=budget - need)
        need += clones
        if need > budget:
            raise InputTooLargeError(
                f"page leaves so many formatting elements open that the parser would re-create them, taking "
                f"more than {clones >> 20} MiB (the budget for {len(document)} bytes is {budget >> 20} MiB)"
            )
    # After the cap: no tag holds more than MAX_ATTRIBUTES, which bounds the count's work per tag.
    if need + len(document) // _MIN_ATTRIBUTE_BYTES * _MEMORY_PER_ATTRIBUTE > budget:
        attributes = count_attributes(document)
        need += attributes * _MEMORY_PER_ATTRIBUTE
        if need > budget:
            raise InputTooLargeError(
                f"page has {tags} tags and {attributes} attributes; pruning it would take about "
                f"{need >> 20} MiB (the budget for {len(document)} bytes is {budget >> 20} MiB)"
            )
    # Each stage's input is released before the next one peaks: the tree before tokenizing ends,
    # the token list before the output is joined.
    parts = _tokenize(_clean_serialization(document))
    out = _apply_rules(parts)
    del parts
    return _finish(out)


def _clean_serialization(document: str | bytes) -> str:
    """Lexbor's serialisation of the page, `REMOVED_TAGS` and hidden elements removed."""
    try:
        tree = LexborHTMLParser(document, scripting=True, options=_PARSER_OPTIONS)
        tree.strip_tags(_REMOVED_LIST, recursive=True)
        for node in tree.css(HIDDEN_SELECTOR):
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


def max_attributes(document: str | bytes) -> int:
    """The most attributes any one element of the page has, counted only for very long tags.

    Lexbor's tokenizer is quadratic in the distinct attributes of one element (4,000 per tag cost
    0.7 s per MB of such tags, 10,000 half a second for one tag, a million would take an hour). An
    element with more than `MAX_ATTRIBUTES` needs a tag of at least `_LONG_TAG_CHARS` characters. Such
    a tag either spans a run of that many characters without a `>` (any such run covers a multiple of
    half that length, so a few `find` calls per page find them), or holds a quoted attribute value with
    a `>` in it (one regex search finds those). Only the tags found that way are measured; a count over
    the cap is confirmed on the page without its raw text (`i<n` in a long inline script is no tag).
    """
    data = document if isinstance(document, bytes) else document.encode("utf-8", "surrogatepass")
    counts = [(start, _attribute_count(tag)) for start, tag in _long_tags(data)]
    most = max((count for _, count in counts), default=0)
    if most <= MAX_ATTRIBUTES:
        return most
    # Confirmed: a tag that starts where the tokenizer reads no markup (a comment, raw text) is none.
    hidden: list[tuple[int, int]] = []
    for _ in _tag_tokens(data, hidden):
        pass
    starts = [low for low, _ in hidden]
    return max(
        (
            count
            for start, count in counts
            if not (index := bisect.bisect_right(starts, start)) or hidden[index - 1][1] <= start
        ),
        default=0,
    )


def count_attributes(document: str | bytes) -> int:
    """The attributes of all the page's tags (as `_attribute_count` counts them; text read as a tag
    counts too, which errs on the safe side), in a few passes over the page (about 5 ms per MB).

    Each tag's attributes (what follows its name) go `_COUNT_TAGS` tags at a time, joined by ">" (no
    value runs across it), so the value substitution holds a bounded number of pieces (one call over a
    whole page of `a=""` attributes held hundreds of megabytes of them); names are counted as runs of
    name characters in a translated copy, which allocates nothing per name. A page holds no tag of
    more than `MAX_ATTRIBUTES` attributes when this runs.
    """
    data = document if isinstance(document, bytes) else document.encode("utf-8", "surrogatepass")
    sections = _TAG_ATTRIBUTES.findall(data)
    return _names_in(sections)


def _names_in(sections: list[bytes]) -> int:
    """The attribute names in tags' attribute sections (what follows each name), `_COUNT_TAGS` at a
    time, joined by ">" (no value runs across it): the value substitution holds a bounded number of
    pieces, and names are counted as runs in a translated copy, which allocates nothing per name."""
    names = 0
    for first in range(0, len(sections), _COUNT_TAGS):
        joined = b">" + b">".join(sections[first : first + _COUNT_TAGS])
        names += _ATTRIBUTE_VALUE.sub(b" ", joined).translate(_NAME_RUNS).count(b" a")
    return names


def _long_tags(data: bytes) -> list[tuple[int, bytes]]:
    """The tags of at least `_LONG_TAG_CHARS` characters that start in a long run without `>` or in the
    run before a quoted attribute value with a `>` in it (all of them, and some text read as tags)."""
    starts: list[int] = []
    step = _LONG_TAG_CHARS // 2
    size = len(data)
    point = step
    while point < size:  # a long run covers a multiple of `step`: look around those points only
        run_start = data.rfind(b">", 0, point) + 1
        run_end = data.find(b">", point)
        if run_end < 0:
            run_end = size
        if run_end - run_start >= _LONG_TAG_CHARS:
            # Every later "<" of the run is inside the tag that its first one starts.
            first = _TAG_START.search(data, run_start, run_end)
            if first is not None:
                starts.append(first.start())
        point = (run_end // step + 1) * step
    for value in _QUOTED_GT.finditer(data):
        # The tag holding the value starts in the run before it: an earlier quoted ">" of the same tag
        # was found first, and its tag reaches past this one (skipped below).
        first = _TAG_START.search(data, data.rfind(b">", 0, value.start()) + 1, value.start())
        if first is not None:
            starts.append(first.start())
    tags = []
    covered = 0  # the end of the last tag measured: starts before it are inside it
    for start in sorted(starts):
        if start < covered:
            continue
        tag = _TAG_EXTENT.match(data, start)
        if tag is None:  # never: a start comes from "<" and a letter
            continue
        covered = tag.end()
        if covered - start >= _LONG_TAG_CHARS:
            tags.append((start, tag.group()))
    return tags


def _attribute_count(tag: bytes) -> int:
    """The attributes of one tag: its names once the values are blanked (`a="x"b` holds two)."""
    name = _ATTRIBUTE_NAME.match(tag)
    rest = tag[name.end() if name is not None else 0 :]
    return len(_ATTRIBUTE_NAME.findall(_ATTRIBUTE_VALUE.sub(b" ", rest)))


def _tags_with_attributes(
    document: str | bytes, *, within: int | None = None, cap: bool = False
) -> tuple[int, bytes | None]:
    """(An upper bound of the bytes a reconstruction of the parser's list of active formatting elements
    takes: three of each element without attributes, every start tag of one with attributes with what
    its attributes take, and the one `<a>` the list can hold after its last marker, with the most
    attributes an `<a>` has; the lowercased page where it has more than a few `<html>`/`<body>` tags
    with attributes, else None), from one cheap scan. Where a bound from the attributes' lengths (each
    takes two bytes at least) is `within` bytes, that one, without counting them (most pages). With `cap`,
    no more entries than the page has formatting start tags (a clone replaces the entry it copies)."""
    data = document if isinstance(document, bytes) else document.encode("utf-8", "surrogatepass")
    lowered = data.lower()
    found = _FORMATTING_WITH_ATTRIBUTES.findall(lowered)  # (root name or b"", b"a" or b"", attributes)
    sections = [attributes for root, link, attributes in found if not root and not link]
    links = [attributes for _, link, attributes in found if link]
    entries = _NOAHS_ARK * len(_FORMATTING_NAMES) + len(sections) + 1
    if cap:
        # None: nothing to re-create, and no replay (2 MB of table markup without one paid 0.9 s for it).
        entries = min(entries, sum(1 for _ in itertools.islice(_FORMATTING_START.finditer(lowered), entries)))
    roots = len(found) - len(sections) - len(links)
    if within is not None:
        # Each name counted (a run of name characters after a separator) takes two bytes at least.
        most = (sum(map(len, sections)) + len(sections) + max(map(len, links), default=0) + 1) // 2
        loose = entries * _MEMORY_PER_CLONE + most * _MEMORY_PER_ATTRIBUTE
        if loose <= within:
            return loose, lowered if roots > _FEW_ROOT_TAGS else None
    attributes = _names_in(sections)
    # The most attributes one <a> has (each counted as `_names_in` counts, the ">" between them kept).
    widest = 0
    for first in range(0, len(links), _COUNT_TAGS):
        joined = _ATTRIBUTE_VALUE.sub(b" ", b">".join(links[first : first + _COUNT_TAGS]))
        runs = (b" " + joined).translate(_NAME_RUNS_BY_TAG).split(b">")
        widest = max(widest, *map(_COUNT_RUNS, runs))
    list_bytes = entries * _MEMORY_PER_CLONE + (attributes + widest) * _MEMORY_PER_ATTRIBUTE
    return list_bytes, lowered if roots > _FEW_ROOT_TAGS else None


def merged_root_attributes(lowered: bytes) -> int:
    """The attributes of all the `<html>` and `<body>` start tags of a lowercased page (those in text
    read as tags count too: the safe side), which the parser merges into one element each."""
    sections = _ROOT_ATTRIBUTES.findall(lowered)
    return _names_in(sections)


# The replay's budget of steps (entries and boundaries its walks visit): per tag of the page (`<`), per
# clone it charged (`_MEMORY_PER_CLONE` of its estimate), and for every page. Corpus pages take at most
# 0.63 a tag; see `reconstruction_bytes`.
_REPLAY_STEPS_PER_TAG = 16
_REPLAY_STEPS_PER_CLONE = 4
_REPLAY_STEPS_HEADROOM = 1 << 20


def reconstruction_bytes(document: str | bytes, *, limit: int | None = None) -> int:
    """An upper estimate of the memory the HTML parser takes for the elements it re-creates while
    "reconstructing the active formatting elements" (stopping once past `limit` bytes): each clone
    `_MEMORY_PER_CLONE`, and `_MEMORY_PER_ATTRIBUTE` for each attribute it copies (clones of 60-attribute
    tags took 3 GB where 400 bytes a clone said 140 MB).

    A formatting element (`<b>`, `<font>`, ...) left open stays on the parser's list of active
    formatting elements after its parent closes, and is cloned at the next text or tag; clones nest in
    each other, so a page that leaves N distinct ones open before M paragraphs makes about N x M
    elements: 60 KB of `<p><b id=N>x` took 16 s and 3.2 GB (the nesting estimate cannot see it: each
    clone chain is closed by the next paragraph). The list keeps at most three entries of one name and
    attributes (the "Noah's Ark" clause).

    The estimate replays the list over the page's tags as the tokenizer reads them (`_tag_tokens`: a
    `</b>` in a script, an attribute value or a bogus comment closes nothing, nor does one in a
    `<select>`), and with it which entries' elements are off the stack of open elements: those opened
    inside an element that has since closed (by its end tag, or a block that closes a `<p>`, a cell that
    closes a cell, a table tag that pops what is above the table, foster-parented elements too, a new
    `<a>` or `<nobr>` what is above the open one, a `<select>` or `<table>` that closes a select, ...).
    The parser re-creates those where it reconstructs: at text, at `</br>`, and at most start tags, but
    not at a `<div>`, a table's part or any other of `_NO_RECONSTRUCTION`; each such point is charged
    what is off the stack then. Where it surely re-creates them (a start tag it surely reads as HTML, text
    it surely reads: no comment, not only spaces in a table) they stay on the stack, inside what the tag
    opens or what is open at the text, until that closes; where it may not (a comment, an end tag's
    spaces in a table, a tag in a `<select>`, after a taint), they float: charged once, and off the stack
    again at the next closing (the parser's clone may sit inside any element opened since). An end tag
    re-creates nothing itself. Reconstruction stops at the list's last marker: what is off the stack
    before a marker the parser surely has (a cell or caption surely in a table, an `<object>`, ... or
    template read as HTML, no template open) waits uncharged until a tag that may clear a marker comes
    (`_TABLE_STARTS`, `_CLEARING_ENDS`), which takes the last such fence. The list's markers are kept
    apart from the elements that inserted them (a table pops an `<object>` in it and leaves its marker):
    a surely closed cell, caption, `<object>`, ... or template clears the list to the last marker, a cell
    the parser may have ignored clears nothing, and a new `<a>` takes the open one off. Each run of the
    adoption agency (an end tag, a new `<a>` or `<nobr>`) is charged its clones: up to eight rounds, one
    per special element after the entry, each a clone of it and of three entries after it.
    It errs long: attributes are compared as written (`id=1 b=2` and `b=2 id=1` count as two; after a
    taint, where a tag's extent is unsure, no two are the same); and an end tag takes the last entry of
    its name off only where the parser surely does, which it does not when the element is out of scope
    (`<b id=1><svg><desc></b>` left every `<b>` open) or after eight rounds of its adoption agency: so
    not while a scope boundary (`_SCOPE_BOUNDARIES`) opened since the entry's own tag is open, nor eight
    special elements; and after a table tag where the scan cannot follow the parser (in a `<select>`,
    after a taint) it clears nothing more. Corpus pages need at most 73 KB.

    Its own cost is bounded too (it runs in Python over every tag of a page whose cheap bound breaks
    the budget). Each walk visits what a tag or a charged clone put there: the entries a closing takes
    off the stack, the sets of entries it merges (the smaller into the larger), the boundaries and
    entries a clear pops, the closed copies the Noah's Ark count passes (a closed copy is left in place,
    not searched for); a `</template>` finds its template at once, and an adoption agency looks at
    `_SCAN_AFTER` entries at most. These steps are counted against a budget of
    `_REPLAY_STEPS_PER_TAG` a tag, `_REPLAY_STEPS_PER_CLONE` a clone charged and
    `_REPLAY_STEPS_HEADROOM` (corpus pages take at most 0.63 a tag, random tag soups 3 a tag
    beyond their clones'). Past it the replay gives up and returns `_reconstruction_bound`, which needs
    no replay and is above the cheap bound the caller ran it for: the page is refused. That refusal is
    the cheap bound's (it cannot show that the page fits), of a page with enough tags and formatting
    elements to break its budget on that bound, never of ordinary markup, which stays far below the
    budget. Steps paid by clones end at `limit` (each clone charges `_MEMORY_PER_CLONE` at least):
    0.15 s for the 150 MiB of headroom. What remains is the scan's and the loop's constant work, about
    2 us a tag; the memory pre-check leaves at most 0.025 tags a byte and 390,000 (1-1.6 s for 2 MB of
    `<a>`, 1.8-2.8 s for 16 MB). A tighter cheap bound would not spare that page the replay: its tags
    leave 3 bytes a tag of the budget, under what one re-created `<a>` takes.
    """
    data = document if isinstance(document, bytes) else document.encode("utf-8", "surrogatepass")
    entries_of: dict[bytes, list[int]] = {}  # element name -> its entries, oldest first
    # The tag as written -> its entries, oldest first; one removed stays until the Noah's Ark count
    # passes it (a `deque.remove` from the front, at each of thousands of copies, was a hidden walk).
    copies: dict[bytes, list[int]] = {}
    key_of: dict[int, bytes] = {}  # the live entries
    weight: dict[int, int] = {}  # entry -> the bytes a clone of it takes
    weight_of: dict[bytes, int] = {}  # the same, by the tag as written
    since: dict[int, int] = {}  # entry -> the serial of the last element opened before it
    # Scope boundaries and special elements open (as far as the scan can tell: an end tag closes one
    # only when it is the last one open, a table pops what is above it), with the serial of their start
    # tag; a boundary also with whether its closing surely clears the list to a marker, and its tag.
    boundaries: list[tuple[bytes, int, bool, int]] = []
    specials: list[tuple[bytes, int]] = []
    contexts: list[int] = []  # where in `boundaries` the open tables and templates are
    # Of those, the templates (in one, a <col> first makes the parser ignore cells), kept apart so that a
    # `</template>` finds the last one at once (a walk over 2,000 open tables at each of 170,000 of them
    # took 8.6 s).
    templates: list[int] = []
    # The list's markers (the entry before each), oldest first. A marker stays when its element is
    # popped without clearing (a table pops an <object> in it), and the parser's next clear stops
    # there: so every tag that may insert one adds one, and only a surely closed cell, caption,
    # <object>, ... or template clears to the last.
    marks: list[int] = []
    # Where the scan cannot follow the parser (a table tag in a <select> or after a taint), the tables
    # and cells it has open may differ from the estimate's: nothing more is popped or cleared.
    unsure = False
    order: list[int] = []  # the entries in the order they were added (some since removed)
    # An entry's element is on the parser's stack of open elements until an element around it closes;
    # only then does the next text or tag re-create it (inside the element then current, where it
    # stays until that one closes). `on_stack` holds (the tag it was opened at, entry), in that order.
    on_stack: list[tuple[int, int]] = []
    off: set[int] = set()  # off the stack (after the last fence), re-created where the parser reconstructs
    # Charged where the parser may have re-created them (a tag or text it may read otherwise, a
    # comment), but not surely: re-created there, they may have been popped by any element that closed
    # since (the parser's clone may be inside one opened after), so the next closing puts them off.
    floating: set[int] = set()
    # Fences: the markers the parser surely has (the entry before each, oldest first). Reconstruction
    # stops at the last marker, so what is off the stack before a fence waits, uncharged, in that
    # fence's set (each set holds the entries after the fence before it), until the fence goes. A
    # marker the parser may not have would hide what it re-creates: so only a cell or caption surely
    # in a table, and an <object>, ... or template read as HTML (no template open: there a <col> may
    # have made the parser ignore them) add one, and every tag that may clear a marker takes the last.
    fences: list[int] = []
    fenced: list[set[int]] = []
    fenced_weights: list[int] = []
    starts: dict[bytes, list[int]] = {}  # name -> the tags its elements opened at, the open ones
    serial = entry = work = off_weight = floating_weight = heaviest = 0
    # The replay's own work: entries and boundaries its walks visit (each is paid for by a tag or by a
    # clone charged, so a page takes a few per tag), against a budget (see the docstring).
    steps = 0
    most_steps = _REPLAY_STEPS_PER_TAG * data.count(b"<") + _REPLAY_STEPS_HEADROOM
    # The last tag: where it ends, and whether text after it is surely read as HTML (which re-creates).
    last_end = 0
    last_html = False
    last_part = 0  # the last start tag of a table's part (not foreign)

    def last_live(name: bytes) -> int | None:
        """The newest entry of `name` still on the list (the Noah's Ark clause drops some early)."""
        nonlocal steps
        stack = entries_of.get(name, [])
        while stack and stack[-1] not in key_of:
            stack.pop()
            steps += 1
        return stack[-1] if stack else None

    def remove(gone: int) -> None:
        nonlocal off_weight, floating_weight
        del key_of[gone]  # (it stays in `copies` until the count passes it)
        if gone in off:
            off.discard(gone)
            off_weight -= weight[gone]
        elif gone in floating:
            floating.discard(gone)
            floating_weight -= weight[gone]
        elif fences and gone <= fences[-1]:
            level = bisect.bisect_left(fences, gone)
            if gone in fenced[level]:
                fenced[level].discard(gone)
                fenced_weights[level] -= weight[gone]
        del weight[gone]

    def closed_after(opened: int) -> None:
        """An element opened at tag `opened` may have closed: what was opened after it is off the stack."""
        nonlocal off_weight, steps
        if floating:
            land()
        steps += len(on_stack)  # (less what stays: the entries popped)
        while on_stack and on_stack[-1][0] > opened:
            _, popped = on_stack.pop()
            if popped not in key_of or popped in off:
                continue
            if fences and popped <= fences[-1]:  # before a marker: not re-created while it stays
                level = bisect.bisect_left(fences, popped)
                if popped not in fenced[level]:
                    fenced[level].add(popped)
                    fenced_weights[level] += weight[popped]
            else:
                off.add(popped)
                off_weight += weight[popped]
        steps -= len(on_stack)

    def union(into: set[int], other: set[int]) -> set[int]:
        """`into` and `other` as one set: the smaller merged into the larger (a step an entry moved)."""
        nonlocal steps
        steps += min(len(into), len(other))
        if len(into) < len(other):
            into, other = other, into
        into |= other
        return into

    def land() -> None:
        """The floating entries are off the stack (again, or still)."""
        nonlocal off, off_weight, floating, floating_weight
        off = union(off, floating)
        off_weight += floating_weight
        floating, floating_weight = set(), 0

    def maybe_recreated() -> int:
        """The parser may re-create what is off the stack here: the bytes that takes (they float)."""
        nonlocal off, off_weight, floating, floating_weight
        charged = off_weight
        floating = union(floating, off)
        floating_weight += off_weight
        off, off_weight = set(), 0
        return charged

    def recreated(position: int) -> int:
        """The parser surely re-creates what is off the stack here (and has what floats): the bytes the
        off ones take; all stay on the stack at `position` until an element around it closes."""
        nonlocal off_weight, floating_weight, steps
        charged = off_weight
        steps += len(off) + len(floating)
        if floating:
            off.update(floating)
            floating.clear()
            floating_weight = 0
        on_stack.extend((position, again) for again in sorted(off))
        off.clear()
        off_weight = 0
        return charged

    def fence() -> None:
        """The parser surely has a marker after the last entry: what is off the stack waits behind it."""
        nonlocal off, off_weight
        if floating:
            land()  # a re-creation it may have skipped comes after the marker goes
        fences.append(entry)
        fenced.append(off)
        fenced_weights.append(off_weight)
        off, off_weight = set(), 0

    def unfence() -> None:
        """The parser may have cleared its last marker: what waited behind the last fence is re-created."""
        nonlocal off, off_weight
        fences.pop()
        off = union(off, fenced.pop())
        off_weight += fenced_weights.pop()

    def pop_to(index: int, *, clear: bool) -> None:
        """Pop the boundaries from `index` on (and the special elements opened since), as the parser
        pops their elements; with `clear`, clear the list to its last marker, as it does once then."""
        nonlocal steps
        if index < len(boundaries):
            opened = boundaries[index][1]
            steps += len(boundaries) - index  # (the open tables and templates among them too)
            while contexts and contexts[-1] >= index:
                contexts.pop()
            while templates and templates[-1] >= index:
                templates.pop()
            del boundaries[index:]
            while specials and specials[-1][1] > opened:
                specials.pop()
                steps += 1
        if clear and marks and not unsure:
            last = marks.pop()
            while order and order[-1] > last:
                added = order.pop()
                steps += 1
                if added in key_of:
                    remove(added)

    def table_end(name: bytes) -> None:
        """An end tag of the table's structure (or `</template>`), as the parser reads it in a table."""
        if name == b"template":
            if templates:  # it pops all above its template
                pop_to(templates[-1], clear=True)
            return
        inner = contexts[-1] if contexts and boundaries[contexts[-1]][0] == b"table" else None
        if inner is None:  # no table: only a cell of a template (never one that clears) may close
            if name in _CELLS and boundaries and boundaries[-1][0] == name:
                pop_to(len(boundaries) - 1, clear=False)
            return
        cell = boundaries[inner + 1] if inner + 1 < len(boundaries) else None
        if cell is not None and cell[0] not in _CELLS:
            cell = None
        if name == b"table":  # it closes the open cell or caption, and the table
            pop_to(inner, clear=cell is not None and cell[2])
        elif cell is None:
            return  # a row or row group may or may not be open: it pops what is above it, or nothing
        elif name == cell[0] or (name == b"tr" and cell[0] != b"caption"):
            pop_to(inner + 1, clear=cell[2])  # </td>, </caption>, and a </tr> around the cell
        elif name in (b"tbody", b"thead", b"tfoot") and cell[0] != b"caption":
            boundaries[inner + 1] = (*cell[:2], False, cell[3])  # may close the cell (if that group is open)

    def adoption(newest: int) -> int:
        """The bytes the adoption agency's clones may take when run for entry `newest`: in each of up to
        eight rounds (one per special element opened after it) a clone of it and of three entries
        between it and that element."""
        if not specials or specials[-1][1] <= since[newest]:
            return 0  # (the common case, without the search)
        later = len(specials) - bisect.bisect_right(specials, since[newest], key=lambda open_: open_[1])
        between = 0
        for looked, added in enumerate(reversed(order)):
            if added <= newest:
                break
            if looked == _SCAN_AFTER:
                between = heaviest
                break
            between = max(between, weight.get(added, 0))
        return min(later, _ADOPTION_ROUNDS) * (weight[newest] + 3 * between)

    # An integration point open in <svg> or <math> (its name, the last entry, its tag and the last serial
    # before it), and the names its island's start tags opened (`_tag_tokens` yields those as TAINTED).
    point: tuple[bytes, int, int, int] | None = None
    island_names: set[bytes] = set()

    for tick, (end_tag, name, start, end, where) in enumerate(_tag_tokens(data), 1):
        if steps > most_steps and steps > most_steps + _REPLAY_STEPS_PER_CLONE * (work // _MEMORY_PER_CLONE):
            return max(work, _reconstruction_bound(data))  # (never on the corpus: see the docstring)
        if where == TAINTED:
            if point is not None and not end_tag:
                island_names.add(name)
        elif point is not None and where == FOREIGN and end_tag and name == point[0]:
            # The point's end tag after an island (only TAINTED tags since it opened, and the scan still
            # in the zone): every island end tag closed the element on top (`_tag_tokens`), so each of
            # its formatting elements left the parser's list at its end tag (or the Noah's Ark clause
            # dropped it), and every element it opened is closed. Read as tainted they stayed (their
            # end tags trusted for nothing): a diagram's 1,050 labels, one `<font>` each, were charged
            # 159 MiB, quadratic in the labels; the parser re-creates none.
            _, first, opened_at, before = point
            steps += len(island_names) + entry - first
            for gone in range(first + 1, entry + 1):
                if gone in key_of:
                    remove(gone)
            for island_name in island_names:
                named_starts = starts.get(island_name)
                while named_starts and named_starts[-1] > opened_at:
                    named_starts.pop()
                    steps += 1
            while specials and specials[-1][1] > before:
                specials.pop()
                steps += 1
            point = None
        else:
            point = None
        if (
            where == FOREIGN
            and not end_tag
            and name in _ISLAND_POINTS
            and not is_self_closing(data[start:end].rstrip(b">"))
        ):
            point = (name, entry, 2 * tick, serial)
            island_names = set()
        if (off or floating) and start > last_end:
            # What is between the last tag and this one may be text, which re-creates what is off the
            # stack, in the element then current. Only surely text (no comment; spaces only outside
            # tables, which ignore them) surely does; else they float: placed there, they could hide a
            # later re-creation deeper (`</div><!---->` + `<div><div>x</div>y` re-creates twice).
            # (Every open template is among `contexts`: outside them all, spaces count as text too.)
            if last_html and not templates and _surely_text(data, last_end, start, spaces=not contexts):
                work += recreated(2 * tick - 1)
            else:
                work += maybe_recreated()
            if limit is not None and work > limit:
                return work
        last_end = end
        # Text after an end tag (but `</select>`'s, `</svg>`'s, ...: then read as HTML too) or after a
        # start tag that opens no raw text, <select> or foreign content, is read as HTML.
        last_html = where == HTML and (end_tag or name not in _NOT_HTML_AFTER)
        trusted = where < SELECT  # not in a <select> nor after a taint, where an end tag may close nothing
        if not trusted and name in _PIVOTS:
            unsure = True
        if end_tag and starts.get(name):
            # Its element, if open, closes with what it holds (an end tag that may close nothing
            # leaves it counted as open).
            closed_after(starts[name].pop() if trusted else starts[name][-1])
        elif not end_tag:
            ends = _IMPLIED_ENDS.get(name)
            implied = [starts[closes].pop() for closes in ends if starts.get(closes)] if ends else None
            if implied:
                closed_after(min(implied))  # a <p> the block closes, the <li> before an <li>, ...
            elif name in (b"table", b"form") and starts.get(b"p"):
                closed_after(starts[b"p"][-1])  # it may close the <p> (not in quirks mode, ...)
            if where >= SELECT and name in _LEAVES_SELECT and starts.get(b"select"):
                # It closes the <select> and what it holds; after a taint too (`<select><svg><em>`
                # leaves the <svg>, the <select> stays open: 30 <b>s were re-created at each of 60
                # `<select>`s, none estimated).
                closed_after(starts[b"select"][-1])
        if where != FOREIGN and contexts and name in (_TABLE_ENDS if end_tag else _TABLE_STARTS):
            # In a table these pop everything above it (its row or group): what was opened after it
            # (after the first one still open, where the scan cannot follow) is off the stack.
            closed_after(boundaries[contexts[0] if unsure else contexts[-1]][3])
        elif name == b"table" and not end_tag and where != FOREIGN and contexts:
            last = contexts[-1]
            if (
                boundaries[last][0] == b"table"
                and last + 1 < len(boundaries)
                and boundaries[last + 1][0] in _CELLS
                and not boundaries[last + 1][2]
            ):
                # A cell that a row group's end tag may have closed: the <table> nests in it, or closes
                # the table (and what was foster-parented out of it: `<td></tbody>` + `<b>`s + `<table>`
                # popped them, and 30 were re-created at each of 60 tables, none estimated). Which
                # table the parser is in is then unknown.
                unsure = True
            if where != HTML or unsure:  # in a <select> in a table it closes both: any may be open
                closed_after(boundaries[contexts[0]][3])
            elif boundaries[last][0] == b"table" and (
                last + 1 == len(boundaries) or boundaries[last + 1][0] not in _CELLS
            ):
                closed_after(boundaries[last][3])  # a <table> in a table (not in its cell) closes it
        if where != FOREIGN and name in _FORMATTING and (end_tag or name in (b"a", b"nobr")):
            newest = last_live(name)
            if newest is not None:  # an end tag, a new <a> or <nobr> runs the adoption agency
                if specials and specials[-1][1] > since[newest]:
                    work += adoption(newest)
                if not end_tag and not (fences and newest <= fences[-1]):  # (marker: none)
                    # It pops the open one and what is above it, which the next text re-creates; an
                    # <a> leaves the list (a <nobr> where surely in scope). Off the stack, it is
                    # re-created first, with what is off after it, which is popped and re-created again.
                    # Where the scan cannot follow the parser (in a <select>, after a taint) it may run
                    # too: what is above the open one is off (`<svg><desc><tr>` and then
                    # `<i></td>x<a></col><nobr><em>` x N made 0.75 clones a tag, none estimated), and it
                    # stays on the list.
                    opened_at = since[newest]
                    if (
                        trusted
                        and (not boundaries or boundaries[-1][1] <= opened_at)
                        and (name == b"a" or _surely_in_scope(opened_at, boundaries, specials))
                    ):
                        if newest in off or newest in floating:
                            work += off_weight + floating_weight
                        remove(newest)
                    if starts.get(name):
                        closed_after(starts[name][-1])
        if end_tag and trusted:
            if name in _FORMATTING:
                newest = last_live(name)
                if newest is not None and _surely_in_scope(since[newest], boundaries, specials):
                    remove(newest)  # the last live entry of its name leaves
            elif where == HTML and name in _TABLE_ENDS:
                if not unsure:
                    table_end(name)
            elif name in _SCOPE_BOUNDARIES:
                if boundaries and boundaries[-1][0] == name:
                    pop_to(len(boundaries) - 1, clear=boundaries[-1][2])
            elif name in _SPECIAL and specials and specials[-1][0] == name:
                specials.pop()  # an end tag closes the special element only when it is the last open
        if fences and where != FOREIGN and name in (_CLEARING_ENDS if end_tag else _TABLE_STARTS):
            unfence()  # it may close a cell, a caption, an <object>, ...: the parser clears to a marker
        if (
            not end_tag
            and name in _CELLS
            and where == HTML
            and not unsure
            and not templates
            and contexts
            and boundaries[contexts[-1]][0] == b"table"
        ):
            fence()  # a cell or caption of a table: the text in it re-creates nothing from before it
        if end_tag and name != b"br":  # `</br>` is a <br> to the parser
            continue  # an end tag re-creates nothing: the text after it (above) or the next tag does
        if (off or floating) and name not in _NO_RECONSTRUCTION:
            # The tag may re-create what is off the stack. One the parser surely reads as a
            # reconstructing start tag re-creates them before the element it opens, where they stay
            # until an element around them closes: counted inside it (it closing pops them too).
            if where == HTML and not templates and name not in _MAY_RECONSTRUCT:
                work += recreated(2 * tick + 1)
            else:
                work += maybe_recreated()
            if limit is not None and work > limit:
                return work
        if end_tag:
            continue
        opened = starts.get(name)  # its element opens here, what it holds after
        if opened is None:
            starts[name] = [2 * tick]
        else:
            opened.append(2 * tick)
        if name in _TABLE_STARTS and where != FOREIGN:
            last_part = 2 * tick
        if where == FOREIGN and is_self_closing(data[start:end].rstrip(b">")):
            continue
        if name in _SCOPE_BOUNDARIES:
            html = where == HTML  # in <svg> a <td> or an <object> is a foreign element, no marker
            inner = contexts[-1] if contexts and boundaries[contexts[-1]][0] == b"table" else None
            if html and not unsure and inner is not None and (name in _CELLS or name == b"table"):
                cell = inner + 1 < len(boundaries) and boundaries[inner + 1][0] in _CELLS
                if name != b"table" or not cell:
                    # A cell or caption closes the open one (clearing its marker) and pops what is
                    # above the table; a <table> there closes the open table first.
                    pop_to(inner + 1, clear=cell and boundaries[inner + 1][2])
                    if name == b"table":  # what it held is off the stack (above)
                        pop_to(inner, clear=False)
                        inner = None
            if where != FOREIGN and name in _MARKERS:
                marks.append(entry)  # a marker, or one the parser may insert (a cell outside a table)
                if html and name not in _CELLS and (name == b"template" or not (unsure or templates)):
                    fence()  # inserted after the reconstruction this tag makes
            if name in _CELLS and html and not contexts:
                continue  # outside a table (or template) the parser ignores a cell's tags
            serial += 1
            # Closing it surely clears the list: a cell or caption of a table, an <object>, ...
            clears = html and (inner is not None if name in _CELLS else name in _MARKERS)
            opened_at = 2 * tick
            if (
                name == b"table"
                and contexts
                and boundaries[contexts[-1]][0] == b"template"
                and last_part > boundaries[contexts[-1]][3]
            ):
                # Right in a template whose content a table's part made a table, a row group, a
                # column group, ..., the parser ignores a <table> (but in a cell or caption): what
                # pops what is above it pops what is above the template (taken for opened at its own
                # tag, 30 <b>s the parser popped at each of 60 `<tfoot>`s were never re-created).
                opened_at = boundaries[contexts[-1]][3]
            boundaries.append((name, serial, clears, opened_at))
            if where != FOREIGN and name in (b"table", b"template"):
                contexts.append(len(boundaries) - 1)
                if name == b"template":
                    templates.append(len(boundaries) - 1)
        elif name in _TABLE_STARTS and where == HTML:
            inner = contexts[-1] if contexts and boundaries[contexts[-1]][0] == b"table" else None
            if inner is not None and not unsure:
                cell = inner + 1 < len(boundaries) and boundaries[inner + 1][0] in _CELLS
                pop_to(inner + 1, clear=cell and boundaries[inner + 1][2])
        elif name in _SPECIAL:
            if (
                trusted
                and specials
                and specials[-1][0] in _CLOSED_BY_BLOCKS
                and (not boundaries or boundaries[-1][1] < specials[-1][1])
            ):
                specials.pop()  # a <p> (or <li>, <dd>, <dt>) the new block closes
            serial += 1
            specials.append((name, serial))
        elif name in _FORMATTING:
            key = data[start:end]  # as written: attributes in their own case
            entry += 1
            if where == TAINTED:
                key += b"\x00%d" % entry  # its extent is unsure: a copy of nothing
            same = copies.get(key)
            if same is None:
                same = copies[key] = []
            elif len(same) >= _NOAHS_ARK:
                # The newest three copies still on the list (those removed since go on the way).
                kept: list[int] = []
                while same and len(kept) < _NOAHS_ARK:
                    copy = same.pop()
                    steps += 1
                    if copy in key_of:
                        kept.append(copy)
                same.extend(reversed(kept))
                # The parser keeps three copies after the last marker only: a copy from before a marker
                # the parser may have (a boundary's, left in place when a table popped it, ...) stays.
                if len(kept) == _NOAHS_ARK and (not marks or kept[-1] > marks[-1]):
                    remove(kept[-1])
            same.append(entry)
            order.append(entry)
            on_stack.append((2 * tick + 1, entry))
            named = entries_of.get(name)
            if named is None:
                entries_of[name] = [entry]
            else:
                named.append(entry)
            key_of[entry] = key
            cost = weight_of.get(key)
            if cost is None:
                cost = weight_of[key] = _MEMORY_PER_CLONE + _MEMORY_PER_ATTRIBUTE * _attribute_count(key)
            weight[entry] = cost
            if cost > heaviest:
                heaviest = cost
            since[entry] = serial
    if off and len(data) > last_end:
        work += off_weight  # text after the last tag
    return work


def _reconstruction_bound(data: bytes) -> int:
    """A bound of the bytes the parser's re-creations take that needs no replay (far above the
    replay's: what the replay gives up for): each tag and each run of text reconstructs at most once
    (once done, nothing is off the stack until a tag closes something), re-creating at most the whole
    list after its last marker (`_tags_with_attributes`), and each tag runs the adoption agency at most
    once, `_ADOPTION_ROUNDS` rounds of at most four clones, none heavier than the list."""
    list_bytes, _ = _tags_with_attributes(data)
    return (2 + 4 * _ADOPTION_ROUNDS) * (data.count(b"<") + 1) * list_bytes


def _surely_text(data: bytes, start: int, end: int, *, spaces: bool) -> bool:
    """Whether `data[start:end]` (between two tags) holds a character the parser surely inserts as text
    and reconstructs for: no "<" (a comment is no text), and one not NUL (nor a space, without
    `spaces`)."""
    if data.find(b"<", start, end) >= 0:
        return False
    return (_CHARACTER if spaces else _TEXT_CHARACTER).search(data, start, end) is not None


def _surely_in_scope(
    opened: int, boundaries: list[tuple[bytes, int, bool, int]], specials: list[tuple[bytes, int]]
) -> bool:
    """Whether an element opened after serial `opened` is surely reached by the parser's end tag: no
    scope boundary opened since is open, nor `_ADOPTION_ROUNDS` special elements."""
    if boundaries and boundaries[-1][1] > opened:
        return False
    later = len(specials) - bisect.bisect_right(specials, opened, key=lambda open_: open_[1])
    return later < _ADOPTION_ROUNDS


# The tag scan (`_tag_tokens`): what the HTML tokenizer reads as tags, for the pre-parse checks.
# The next markup: a tag (an end tag's "/", its name, its attributes, its ">": none where the page's end
# cuts it off), or (no name) "<!", "<?" or "</" and no letter: a comment or a bogus comment.
_NEXT_MARKUP = re.compile(rb"<(?:(/?)([a-z][^\t\n\f\r />]*+)(" + _TAG_ATTRIBUTES_REST + rb")(>?)|[!?/])")
_ANY_TAG = re.compile(rb"<(/?)([a-z][^\t\n\f\r />]*+)([^<>]*+)")  # after a taint: no quote hides anything
_RAW_TEXT = frozenset(_RAW_TEXT_NAMES.split(b"|")) - {b"plaintext"}
_ZONES = {b"svg": b"foreignobject desc title".split(), b"math": b"mi mo mn ms mtext annotation-xml".split()}
# Start tags that end foreign content (the HTML Standard's list; `<font>` only with a color, face or size:
# `_breaks_out`).
_BREAKOUT = frozenset(
    b"""b big blockquote body br center code dd div dl dt em embed font h1 h2 h3 h4 h5 h6 head hr i img li
    listing menu meta nobr ol p pre ruby s small span strong strike sub sup table tt u ul var""".split()
) - {b"font"}
HTML, FOREIGN, SELECT, TAINTED = 0, 1, 2, 3  # where a tag was read (`_tag_tokens`)
# Integration points whose content the parser reads as HTML, start tags and text (`<annotation-xml>`
# only with an HTML encoding: not one), and the start tags an island of HTML there may not hold: raw
# text and what hides tags, what leaves an element open or opens one without a start tag (a table's
# parts), inserts a marker or a scope limit, changes the insertion mode or the form pointer, and
# foreign content (`<mglyph>` in `<mi>` is MathML).
_ISLAND_POINTS = frozenset(b"foreignobject desc title mi mo mn ms mtext".split())
_NOT_IN_ISLANDS = _RAW_TEXT | frozenset(
    b"""plaintext svg math mglyph malignmark select template frameset frame html head body form isindex
    table caption colgroup col tbody thead tfoot tr td th applet marquee object""".split()
)


def _tag_tokens(
    data: bytes, hidden: list[tuple[int, int]] | None = None
) -> Iterator[tuple[bool, bytes, int, int, int]]:
    """(end tag, lowercase name, start and end of the tag in `data`, where) for every tag the HTML
    tokenizer reads on the page, in order, in linear time; `hidden` collects the spans it reads as no
    markup (comments, bogus comments, raw text).

    Read as the tokenizer reads: a tag's quoted attribute values are part of it (`<br title="</b>">`
    closes nothing, `<br a="<!--">` opens no comment), comments end where it ends them, `<!x>`, `<?x>`
    and `</ x>` are bogus comments, and raw-text elements (`<script>`, `<style>`, `<title>`, ...) hold
    no tags up to their end tag. Inside `<svg>` and `<math>` (FOREIGN) raw-text names are ordinary
    elements and `<![CDATA[...]]>` is text; inside `<select>` (SELECT) nothing is read as raw text
    (counting more is the safe side). Either ends with its own end tag, read the same way; but an
    integration point (`<foreignObject>`, `<desc>`, `<title>`, `<mi>`, ...) that holds tags makes the
    parser's content model there HTML again, where a `</svg>` may close nothing: from there on
    (TAINTED) every `<` and a letter is a tag and nothing is hidden; so too after a `<frameset>`. But
    an island of plain HTML in one (a diagram's label: `<foreignObject><div><span>x</span></div>
    </foreignObject>`) whose every end tag closes the element on top of it, and whose integration
    point's own end tag comes when all is closed, leaves the parser in the zone again (those of its
    tags that may leave an element open, or hide tags, taint: raw text, tables, a <select>, ...): its
    tags are yielded as TAINTED (nothing there closes surely for the estimates), what follows as in the
    zone. In a `<template>` whose content starts with a `<col>` (a column group, where the
    parser ignores every other start tag) raw-text names hold no raw text, up to the `</template>`.
    """
    lowered = data.lower()
    size = len(lowered)
    position = 0
    zone = HTML
    zone_name = b""
    opened: dict[bytes, int] = {}  # the foreign elements open in the zone, by name
    zone_open: list[bytes] = []  # the same, in the order they opened
    html_names: set[bytes] = set()  # the names of the HTML start tags read so far
    parent: bytes | None = None  # the HTML start tag just read; in a zone, the one just before it
    previous: bytes | None = None
    point: bytes | None = None  # an integration point of the zone, open, holding no tag or an island
    island: list[bytes] = []  # the island's HTML elements open in it (see above), in order
    template_first = False  # the last HTML start tag was a <template>
    template_cols = 0  # <template>s opened with a <col> first, not closed since
    select_limit = False  # the <select> being read holds a scope limit (an <object>, a <td>, ...)
    while position < size:
        if zone == TAINTED:
            for any_tag in _ANY_TAG.finditer(lowered, position):
                yield bool(any_tag.group(1)), any_tag.group(2), any_tag.start(), any_tag.end(), TAINTED
            return
        found = _NEXT_MARKUP.search(lowered, position)
        if found is None:
            return
        start = found.start()
        slash, name, attributes, closed = found.groups()
        if name is None:
            if lowered.startswith(b"<!--", start):
                end = _comment_end(lowered, start + 4)
            elif zone == FOREIGN and lowered.startswith(b"<![cdata[", start):
                if island:  # in an HTML element a bogus comment, in the point text: either
                    zone = TAINTED
                    position = start
                    continue
                end = lowered.find(b"]]>", start + 9)
                end = -1 if end < 0 else end + 3
            elif lowered.startswith(b"</>", start):
                end = start + 3
            else:
                end = lowered.find(b">", start + 2)
                end = -1 if end < 0 else end + 1
            if hidden is not None:
                hidden.append((start, size if end < 0 else end))
            if end < 0:
                return
            position = end
            continue
        if not closed:
            return  # a tag the page's end cuts off is no tag
        end_tag = bool(slash)
        position = found.end()
        if point is not None:
            if end_tag and name == point and not island:
                point = None
            elif point in _ISLAND_POINTS and (
                (end_tag and island and island[-1] == name) or (not end_tag and name not in _NOT_IN_ISLANDS)
            ):
                if end_tag:
                    island.pop()
                elif name not in _VOID_B:  # (`<div/>` opens a <div> in HTML content)
                    island.append(name)
                yield end_tag, name, start, position, TAINTED
                continue
            else:
                zone = TAINTED
                yield end_tag, name, start, position, TAINTED
                continue
        if zone == FOREIGN:
            self_closing = not end_tag and is_self_closing(attributes)  # an end tag's "/" is nothing
            if (end_tag and name in (b"br", b"p")) or (not end_tag and _breaks_out(name, attributes)):
                zone = HTML  # the parser leaves foreign content for this tag and what follows
            elif end_tag and not opened.get(name):
                # Not a foreign element open here: the parser looks for it among the HTML elements
                # around the <svg>. The one just before the <svg> is surely open, and its end tag
                # takes the parser out (`<div><svg><use/></div>`); a name no HTML start tag had cannot
                # be open (`</path></path>`), and is ignored; any other may be either.
                if name == parent:
                    zone = HTML
                    yield end_tag, name, start, position, HTML
                    continue
                if name not in html_names and not (
                    (name in _HEADINGS_B and html_names & _HEADINGS_B)  # `</h1>` closes any heading
                    or (name in _IMPLIED_BY_TABLES and b"table" in html_names)  # or one the parser made
                ):
                    yield end_tag, name, start, position, FOREIGN
                    continue
                zone = TAINTED
                yield end_tag, name, start, position, TAINTED
                continue
            else:
                if end_tag:  # the parser pops its last element of the name and what is above it
                    while zone_open:
                        popped = zone_open.pop()
                        opened[popped] -= 1
                        if popped == name:
                            break
                elif not self_closing:
                    zone_open.append(name)
                    opened[name] = opened.get(name, 0) + 1
                if name == zone_name and not self_closing and not opened[name]:
                    zone = HTML  # the zone's own end tag: yielded as HTML, and read so after
                elif not end_tag and not self_closing and name in _ZONES[zone_name]:
                    point = name
                if zone == FOREIGN:
                    yield end_tag, name, start, position, FOREIGN
                    continue
                yield end_tag, name, start, position, HTML
                continue
        elif zone == SELECT:
            if not end_tag and (name in _ZONES or (name in _RAW_TEXT and name not in _SCRIPTING)):
                # The parser builds <svg> and <math> inside a <select>; an <xmp>, <title>, ... there
                # it may ignore (then what follows is markup) or not (raw text).
                zone = TAINTED
                yield end_tag, name, start, position, TAINTED
                continue
            if not end_tag and name in _LEAVES_SELECT and select_limit:
                # Past a scope limit (an <object>, a <td>, ...) it may close nothing (Lexbor builds
                # what a <select> holds): where the parser is, the scan cannot tell.
                zone = TAINTED
                yield end_tag, name, start, position, TAINTED
                continue
            if not end_tag and name in _LEAVES_SELECT:
                # It closes the <select> (yielded as in it: the estimate closes it); an <input> then
                # opens in the body.
                zone = HTML
                yield end_tag, name, start, position, SELECT
                previous, parent = parent, None
                html_names.add(name)
                continue
            if not (end_tag and name == b"select"):
                select_limit = select_limit or (not end_tag and name in _SCOPE_BOUNDARIES)
                yield end_tag, name, start, position, SELECT
                if not end_tag and name in _SCRIPTING:  # in the <select> too, raw text
                    closer = _skip_raw_text(lowered, name, position, hidden)
                    if closer is None:
                        return
                    position = closer
                continue
            zone = HTML  # its own end tag, read as HTML (it closes the <select>)
        yield end_tag, name, start, position, zone
        previous, parent = parent, None
        if end_tag:
            if name == b"template" and template_cols:
                template_cols -= 1
            continue
        html_names.add(name)
        parent = None if name in _NO_PARENTS or (name in _ZONES and is_self_closing(attributes)) else name
        if template_first:  # a <template> whose content starts with a <col> holds a column group
            template_first = False
            template_cols += name == b"col"
        template_first = name == b"template"
        if template_cols and (name in _RAW_TEXT or name in (b"plaintext", b"select") or name in _ZONES):
            continue  # there the parser ignores every other start tag: no raw text or zone follows
        if name in _RAW_TEXT:
            closer = _skip_raw_text(lowered, name, position, hidden)
            if closer is None:
                return
            position = closer
        elif name == b"plaintext":
            if hidden is not None:
                hidden.append((position, size))
            return
        elif name in _ZONES and not is_self_closing(attributes):  # `<svg/>` opens nothing
            zone, zone_name, opened, parent = FOREIGN, name, {name: 1}, previous
            zone_open = [name]
        elif name == b"select":
            zone, select_limit = SELECT, False
        elif name == b"frameset":
            # The parser then ignores tags but <frameset>, <frame> and <noframes> (a <title> holds
            # markup), unless text came first and it ignores the <frameset> instead: either way.
            zone = TAINTED


# Elements the parser makes without a start tag in a table: their end tags may close them.
_IMPLIED_BY_TABLES = frozenset((b"tbody", b"tr", b"colgroup"))
# Start tags that take this Lexbor out of a <select> (it closes it first; a <keygen> or <textarea> it
# builds inside), and the raw-text elements it builds in one (as in the document's head).
_LEAVES_SELECT = frozenset((b"select", b"input"))
_SCRIPTING = frozenset((b"script", b"style"))
# Script data (HTML Standard 13.2.5.4 and on): "<!--" escapes it, a "<script" in the escaped text
# double-escapes it (there "</script>" does not end the script), "-->" ends either escape.
_SCRIPT_MARKS = re.compile(rb"<!--|-->|<(/?)script[\t\n\f\r />]")


def _skip_raw_text(
    lowered: bytes, name: bytes, position: int, hidden: list[tuple[int, int]] | None
) -> int | None:
    """`_raw_text_end`, noting the raw text in `hidden` (to the page's end when it has no end)."""
    closer = _raw_text_end(lowered, name, position)
    if hidden is not None:
        hidden.append((position, len(lowered) if closer is None else closer))
    return closer


def _raw_text_end(lowered: bytes, name: bytes, position: int) -> int | None:
    """Where the raw text of a `name` element opened before `position` ends (the start of its end tag;
    None: the page's end). A `<script>`'s follows the tokenizer's escapes: `<script><!--<script>
    </script></div>--></script>` is one script (read to the first `</script>`, its `</div>`s hid 4,000
    levels of nesting; 82 s for 2 MB)."""
    if name != b"script":
        closer = _RAW_TEXT_CLOSE[name].search(lowered, position)
        return None if closer is None else closer.start()
    escaped = double = False
    while (mark := _SCRIPT_MARKS.search(lowered, position)) is not None:
        token = mark.group()
        if token == b"<!--":
            escaped = escaped or not double  # in script data it escapes; escaped it changes nothing
            position = mark.start() + 2  # "<!-->" escapes and ends the escape at once
        elif token == b"-->":
            escaped = double = False
            position = mark.end()
        elif mark.group(1):  # "</script"
            if not double:
                return mark.start()
            double = False  # back to escaped
            position = mark.end() - 1
        else:  # "<script"
            double = double or escaped
            position = mark.end() - 1
    return None


# Start tags whose end tag does not take the parser out of an <svg> right inside them: void elements
# (never open; `<image>` is an `<img>`), <html>, <head>, <body> and <form>, whose end tags pop nothing,
# and a table's parts, which the parser ignores outside a table (`<tr/><svg></tr>` x N: 20 s a
# megabyte). Nor is a self-closing `<svg/>` one (`<math/><svg></math>`: 34 s for 540 KB).
_NO_PARENTS = frozenset(
    b"""area base basefont bgsound br col embed frame hr img input keygen link meta param source track wbr
    html head body form caption colgroup tbody thead tfoot tr td th image""".split()
)


def is_self_closing(attributes: bytes) -> bool:
    """Whether a start tag with these attributes (what follows its name) ends in "/>" (`<g a=x/>` does
    not: the "/" is its value's)."""
    return attributes.endswith(b"/") and _UNQUOTED_TAIL.search(attributes) is None


def _breaks_out(name: bytes, attributes: bytes) -> bool:
    """Whether this start tag takes the parser out of foreign content (`<font>` only with a color, face
    or size)."""
    if name != b"font":
        return name in _BREAKOUT
    names = _ATTRIBUTE_NAME.findall(_ATTRIBUTE_VALUE.sub(b" ", attributes))
    return any(attribute in (b"color", b"face", b"size") for attribute in names)


# The parser's stack of open elements as the nesting estimate follows it (`estimate_depth`).
# Special elements (the HTML Standard's, void ones aside): an end tag of another element does not reach
# past one, nor does the walk a <li>, <dd> or <dt> makes back to the last one open (but address, div, p).
_SPECIAL_OPEN = frozenset(
    b"""address applet article aside blockquote body button caption center colgroup dd details dir div dl
    dt fieldset figcaption figure footer form frameset h1 h2 h3 h4 h5 h6 head header hgroup html iframe li
    listing main marquee menu nav noembed noframes noscript object ol p plaintext pre script search section
    select style summary table tbody td template textarea tfoot th thead title tr ul xmp
    mi mo mn ms mtext annotation-xml foreignobject desc""".split()
)
# Where an element is "in scope" for the parser's end tags stops (MathML and SVG ones by name).
# (`_SCOPE_BOUNDARIES` as the parser's default scope has them: no <svg>, <math> or <select>, and <html>.)
_SCOPE_LIMITS = (_SCOPE_BOUNDARIES - {b"svg", b"math", b"select"}) | {b"html"}
# Names special only as MathML or SVG elements: an HTML element of the name ends as any other.
_FOREIGN_SPECIAL = frozenset(b"mi mo mn ms mtext annotation-xml foreignobject desc".split())
_TABLE_FAMILY = frozenset(b"table tbody thead tfoot tr td th caption colgroup template".split())
_TABLE_PARTS = frozenset(b"caption colgroup col tbody thead tfoot tr td th".split())  # start tags
_ROW_GROUPS = frozenset((b"tbody", b"thead", b"tfoot"))
_HEADINGS_B = frozenset(b"h1 h2 h3 h4 h5 h6".split())
# What "generate implied end tags" pops while it is the current node.
_IMPLIED = frozenset(b"dd dt li optgroup option p rb rp rt rtc".split())
_VOID_B = frozenset(name.encode() for name in _VOID) | {b"image"}
# No-quirks mode: the page as the parser gets it starts with the doctype. (No byte-order mark: Lexbor
# reads one as text, which ends the doctype's place; `utf8_payload` strips the first, but a second one,
# or a str starting with U+FEFF, left the page in quirks mode while the estimate assumed no-quirks.)
_STANDARDS_DOCTYPE = re.compile(rb"\A[\t\n\f\r ]*<!doctype[\t\n\f\r ]+html[\t\n\f\r ]*>", re.I)
# Start tags that do more than open their element (or open none).
_STARTS_WITH_MORE = (
    _CLOSES_P
    | _TABLE_PARTS
    | _VOID_B
    | _MARKERS
    | frozenset(_ZONES)
    | _FORMATTING
    | {b"table", b"button", b"option", b"optgroup", b"rb", b"rp", b"rt", b"rtc"}
    | {b"html", b"head", b"body", b"form"}
)
# End tags that do more than pop their element when it is on top (clear the formatting list to a marker,
# clear the form pointer, close nothing).
_CLOSES_WITH_MORE = _TABLE_FAMILY | {b"applet", b"marquee", b"object", b"form", b"body", b"html"}
# The model's walks down its entries (removed ones count) stop after this many, and then assume what
# errs long: the parser may have popped any entry (doubt), an end tag closes nothing, an element stays
# counted. The walk back to the last <li>, <dd> or <dt> stops sooner (the parser's own stops at most
# special elements).
_MODEL_REACH = 256
_ITEM_REACH = 64
# The model's own work: its walks may look at this many entries per `<` of the page, in all (corpus
# pages: at most 0.23, and 860 of 1,033 none); then each looks at a few only. So its cost stays linear
# in the page's tags (cells a template left unsure, markers a table left, options a <select> left:
# each end tag walked them all, from 37 s for 2 MB to minutes for 37 KB), and the estimate only grows:
# a page pays for its walks in depth, refused only where that takes it past the cap, not for them (a
# refusal outright would refuse pages the parser reads in no time; the cheap bound, a level per `<`,
# refuses every page the model runs on).
_MODEL_STEPS_PER_TAG = 8
_MODEL_REACH_SPENT = 4


class _OpenElements:
    """The parser's stack of open elements, as far as the tag scan can follow it (`estimate_depth`).

    The depth estimate must never fall far below the parser's: so an entry leaves only where the parser
    surely pops its element, and what the scan cannot follow only keeps entries (they count, and a
    special one stops end tags below it, as the parser's would). An end tag pops what is above its
    element only when that element is surely still open ("sure"): every entry that may have left the
    parser's stack unseen (by a rule the scan does not model or cannot decide: a re-created formatting
    element's adoption agency, a heading closing another, quirks mode, more than seven rounds of the
    adoption agency) is marked unsure, and from then on its end tag removes it alone.
    """

    def __init__(self, steps: int) -> None:
        # (name, serial, counted, sure, marker); None: removed. Not sure: pushed where the scan cannot
        # follow. Marker: which of `markers` was the last when it opened.
        self.entries: list[tuple[bytes, int, bool, bool, int] | None] = []
        self.positions: dict[bytes, list[int]] = {}  # name -> where its live entries are, oldest first
        self.special: list[int] = []  # where the special ones are (some may have been removed)
        self.limits: list[int] = []  # where the scope limits are (same)
        self.family: list[int] = []  # where the table's structure is (same)
        # Formatting elements an end tag of another element popped: the parser may re-create them (each
        # counts) until an end tag of their name, or until the cell, caption, <object>, ... they were
        # opened in closes (it clears its list of them to the marker it inserted): by name, one dict per
        # marker (`markers` names them), oldest first. If the scan cannot tell where the parser put a
        # marker, none clears.
        # Each held as the serial at which it left the stack: a re-created one opened after that.
        self.dangling: list[dict[bytes, list[int]]] = [{}]
        self.held_total = 0  # how many are held in all of them (a heading asks at each tag: no rescan)
        self.markers: list[int] = [0]  # increasing: found by bisection
        self.next_marker = 1
        # Open formatting elements the parser may have taken off its list (a fourth of the name after
        # the same marker: Noah's Ark, by tag and attributes): their end tag may be ignored.
        self.off_list: set[int] = set()
        self.markers_known = True
        self.depth = 0
        self.serial = 0
        self.unsure = 0  # entries of a serial up to this may have left the parser's stack unseen
        # The model's own work (`spend`): the entries its walks look at, against a budget per tag.
        self.reach = _MODEL_REACH
        self.steps_left = steps

    def spend(self, steps: int) -> None:
        """Charge a walk's steps to the budget. Spent, every walk stops after a few entries: what it
        then does (doubt, close nothing, leave entries counted) errs long, as past the usual reach, so
        the estimate stays an upper one while the model's work stays linear in the page's tags."""
        self.steps_left -= steps
        if self.steps_left < 0:
            self.reach = _MODEL_REACH_SPENT

    def push(self, name: bytes, counted: bool, *, sure: bool = True) -> None:
        self.serial += 1
        position = len(self.entries)
        self.entries.append((name, self.serial, counted, sure, self.markers[-1]))
        self.positions.setdefault(name, []).append(position)
        if name in _SPECIAL_OPEN:
            self.special.append(position)
            if name in _TABLE_FAMILY:
                self.family.append(position)
        if name in _SCOPE_LIMITS:
            self.limits.append(position)
        if counted:
            self.depth += 1

    def held(self, name: bytes) -> int:
        """How many formatting elements of `name` popped since the last marker may be re-created."""
        return len(self.dangling[-1].get(name, ()))

    def held_behind_limit(self, name: bytes) -> bool:
        """Whether a scope limit (a table, a template, a cell, ...) opened after the first held
        `name` left the stack, and is open: re-created before it, that one is out of the parser's scope
        behind it (`<a><nobr></table><td><q><table>` x N: the next unit's <a> and <nobr> pop nothing)."""
        limit = self._live(self.limits)
        if limit < 0:
            return False
        entry = self.entries[limit]
        return entry is not None and entry[1] > self.dangling[-1][name][0]

    def release(self, name: bytes) -> None:
        """An end tag takes one of them off the parser's list, or pops (or moves) a re-created one and
        what is above it up to a special element: what opened since the first of them left the stack
        and is not special is not surely open any more."""
        held = self.dangling[-1][name]
        since = held[0]
        held.pop()
        self.held_total -= 1
        self.depth -= 1
        self.unsure_above(since, keep_special=True)

    def unsure_from(self, position: int) -> None:
        """The parser may have popped the element at `position` and everything above it, unseen."""
        if position < len(self.entries):
            entry = self.entries[position]
            self.unsure_above(entry[1] - 1 if entry is not None else self.serial, keep_special=False)

    def unsure_above(self, serial: int, *, keep_special: bool) -> None:
        """Entries opened after `serial` are not surely open (special ones stay sure with `keep_special`:
        a formatting element's end tag pops none). Past the walk's reach (removed entries count: a
        run of them is walked too), nothing open is."""
        entries = self.entries
        size = len(entries)
        index = size - 1
        while index >= 0:
            entry = entries[index]
            if entry is not None and entry[1] <= serial:
                break
            if size - index > self.reach:
                self.doubt()
                break
            if entry is not None and entry[3] and not (keep_special and entry[0] in _SPECIAL_OPEN):
                entries[index] = (entry[0], entry[1], entry[2], False, entry[4])
            index -= 1
        self.spend(size - index)

    def marker(self, surely: bool) -> None:
        """A cell, caption, <object>, ... opened: the parser put a marker on its list."""
        if surely:
            self.dangling.append({})
            self.markers.append(self.next_marker)
            self.next_marker += 1
        else:
            self.markers_known = False

    def clear(self) -> None:
        """A cell, caption, <object>, ... surely closed: the parser cleared its list to the last marker."""
        if self.markers_known and len(self.dangling) > 1:
            cleared = sum(len(held) for held in self.dangling.pop().values())
            self.depth -= cleared
            self.held_total -= cleared
            self.markers.pop()

    def doubt(self) -> None:
        """Something the scan cannot follow may have popped any entry open now."""
        self.unsure = self.serial

    def last(self, name: bytes) -> int:
        """Where the last live entry of `name` is (-1: none)."""
        found = self.positions.get(name)
        return found[-1] if found else -1

    def _live(self, positions: list[int]) -> int:
        while positions and self.entries[positions[-1]] is None:
            positions.pop()
        return positions[-1] if positions else -1

    def special_after(self, position: int) -> bool:
        return self._live(self.special) > position

    def limit_after(self, position: int, *more: bytes) -> bool:
        """Whether the element at `position` is out of the parser's scope (with `more` as limits too)."""
        if self._live(self.limits) > position:
            return True
        return any(self.last(name) > position for name in more)

    def last_family(self) -> int:
        return self._live(self.family)

    def is_sure(self, position: int) -> bool:
        entry = self.entries[position]
        return entry is not None and entry[3] and entry[1] > self.unsure

    def name_at(self, position: int) -> bytes:
        entry = self.entries[position]
        assert entry is not None
        return entry[0]

    def top(self) -> bytes | None:
        """The current node's name, as far as the scan knows (the parser may have re-created
        formatting elements above it)."""
        return self.entries[-1][0] if self.entries and self.entries[-1] is not None else None

    def settled(self) -> bool:
        """Nothing has happened that the scan cannot follow, and nothing may be re-created."""
        return (
            self.unsure == 0
            and not self.held_total
            and all(entry is None or entry[3] for entry in self.entries[-1:])
        )

    def pop_from(self, position: int, *, hold_first: bool = False, hold: bool = True) -> None:
        """The parser pops the element at `position` and everything above it (a formatting element
        among those stays counted: the parser may re-create it, `dangling`; not with `hold`: each of
        those surely left the parser's list too)."""
        for index in range(len(self.entries) - 1, position - 1, -1):
            entry = self.entries[index]
            if entry is None:
                continue
            name, _, counted, _, marker = entry
            self.positions[name].pop()
            popped_by_another = (index > position or hold_first) and hold
            held = self._held_after(marker) if name in _FORMATTING and popped_by_another else None
            if held is not None:
                held.setdefault(name, []).append(self.serial)
                self.held_total += 1
            elif counted:
                self.depth -= 1
        del self.entries[position:]
        self._forget_from(position)

    def remove(self, position: int, *, pops_above: bool = True) -> None:
        """The parser removes this element (and, with `pops_above`, pops what is above it: the
        formatting elements there are held as popped, the rest is not surely open any more)."""
        entry = self.entries[position]
        assert entry is not None
        if pops_above and position < len(self.entries) - 1:
            # The formatting elements within the walk's reach are held; one further up stays as it is
            # (counted, and made unsure below): as deep, and the walk stays bounded (a <select> left
            # 240,000 <option>s above the spans each end tag removed: 37 s).
            top = len(self.entries) - 1
            lowest = max(position, top - self.reach)
            for index in range(top, lowest, -1):
                above = self.entries[index] if index < len(self.entries) else None
                if above is not None and above[0] in _FORMATTING:
                    held = self._held_after(above[4])
                    if held is not None:
                        self.remove(index, pops_above=False)
                        held.setdefault(above[0], []).append(self.serial)
                        self.held_total += 1
                        self.depth += 1
            self.spend(top - lowest)
            self.unsure_above(entry[1], keep_special=False)
        name, _, counted, _, _ = entry
        same = self.positions[name]
        if same[-1] == position:
            same.pop()
        else:  # from the end: it is one of the last (held, adopted, a zone's), and the walk is charged
            index = len(same) - 2
            while same[index] != position:
                index -= 1
            del same[index]
            self.spend(len(same) - index)
        self.entries[position] = None
        if counted:
            self.depth -= 1
        while self.entries and self.entries[-1] is None:
            self.entries.pop()
        self._forget_from(len(self.entries))

    def close_top(self, name: bytes) -> bool:
        """The common case, fast: an end tag of the element on top, surely open (what `_end_tag` does
        then, without its lookups). False: not that case."""
        if not self.entries:
            return False
        entry = self.entries[-1]
        if entry is None or entry[0] != name or not entry[3] or entry[1] <= self.unsure:
            return False
        if name in _FORMATTING and self.dangling[-1].get(name):
            return False
        self.entries.pop()
        self.positions[name].pop()
        if entry[2]:
            self.depth -= 1
        self._forget_from(len(self.entries))
        return True

    def _forget_from(self, size: int) -> None:
        """Drop the special, scope-limit and table positions at `size` and above (gone from the stack)."""
        for positions in (self.special, self.limits, self.family):
            while positions and positions[-1] >= size:
                positions.pop()

    def _held_after(self, marker: int) -> dict[bytes, list[int]] | None:
        """The dangling elements filed after `marker` (None: it was cleared, and with it the parser's
        entries for the elements opened after it): a cell's that an <object> in it follows stays.
        (Markers a table left, popping their <object>s, pile up: found by bisection, not a walk.)"""
        index = bisect.bisect_left(self.markers, marker)
        if index < len(self.markers) and self.markers[index] == marker:
            return self.dangling[index]
        return None

    def note_formatting(self, name: bytes) -> None:
        """A formatting element of `name` is about to open: with three of the name after the last marker
        (open, or popped and held), the parser may drop the earliest from its list (Noah's Ark compares
        attributes too; by name is the safe side)."""
        marker = self.markers[-1]
        listed = [  # open after the marker, and not already taken off the list
            e[1]
            for p in self.positions.get(name, ())[-64:]
            if (e := self.entries[p]) and e[4] == marker and e[1] not in self.off_list
        ]
        if listed and len(listed) + self.held(name) >= _NOAHS_ARK:
            self.off_list.add(listed[0])

    def marker_of(self, position: int) -> int:
        entry = self.entries[position]
        assert entry is not None
        return entry[4]

    def maybe_off_list(self, position: int) -> bool:
        entry = self.entries[position]
        return entry is not None and entry[1] in self.off_list

    def adopt(self, position: int) -> bool:
        """The adoption agency for the formatting element at `position`, with special elements above it
        (False: where the scan cannot follow it; nothing changes). Round by round the element leaves
        the stack and a clone goes right above the first special element above it, the elements between
        that are not formatting elements leave the stack, and the last round (no special element above
        the clone) pops the clone and what is above it: the special elements stay, with the formatting
        elements between them (re-created in place; the parser drops those past three)."""
        if len(self.entries) - position > self.reach or not self.is_sure(position):
            return False
        self.spend(3 * (len(self.entries) - position))  # (the walks below: specials, sureness, removal)
        specials: list[int] = []
        for index in range(len(self.special) - 1, -1, -1):
            found = self.special[index]
            if found <= position:
                break
            if self.entries[found] is not None:
                specials.append(found)
        if not specials or len(specials) >= _ADOPTION_ROUNDS:
            return False
        if not all(
            self.is_sure(index) for index in range(position, len(self.entries)) if self.entries[index]
        ):
            return False
        last = specials[0]
        self.pop_from(last + 1, hold_first=True)  # the last round pops the clone's contents
        for index in range(last - 1, position, -1):
            entry = self.entries[index]
            if entry is not None and entry[0] not in _SPECIAL_OPEN and entry[0] not in _FORMATTING:
                self.remove(index, pops_above=False)
        self.remove(position, pops_above=False)
        return True

    def close(self, position: int) -> bool:
        """The parser pops the element at `position` and what is above it: surely (True), if it is surely
        open."""
        if self.is_sure(position):
            self.pop_from(position)
            return True
        self.remove(position)
        return False


def estimate_depth(document: str | bytes, *, limit: int = DEFAULT_MAX_DEPTH) -> int:
    """An upper estimate of the page's nesting depth (exact enough to refuse pathological pages).

    Follows the parser's stack of open elements over the page's tags (`_OpenElements`) and returns the
    running maximum of the elements open (or the first count past `limit`; `<p>`, `<li>`, `<option>`,
    table rows and cells count where the scan follows the parser, which closes them itself, not in a
    `<select>` or where the scan cannot tell: `_NOT_NESTING`). Tags are read
    as the tokenizer reads them (`_tag_tokens`): an end tag in an attribute value (`<div a="</div>">`,
    60,000 of which hid their nesting) or in raw text closes nothing. The parser's rules followed, each
    only where the scan can tell the parser surely applies it (elsewhere the entries stay, counted):
    an end tag pops its element and what is above it, but not past a special element (the generic rule:
    `<span><div></span>` leaves both open) nor, for a special one, past a scope limit (`<div><table>
    </div>`); a formatting element's end tag with special elements above it runs the adoption agency
    (`adopt`: the element leaves, the special ones stay), and one popped by another's end tag stays
    counted while the parser may re-create it (`dangling`); a new `<a>` or `<nobr>` runs the adoption
    agency for the last on the list; a `<p>`-closing start tag, a `<li>`, `<dd>` or `<dt>`, a
    `<button>`, a table's rows, cells and sections close what they close (a glossary or a table that
    leaves them open nests no deeper), and a `<table>` in a table closes that table; a second `<form>`
    is ignored. In <svg>
    and <math> every element nests but a self-closing one and the zone's end or a tag that leaves it
    pops it all; in a <select>, in an island of HTML in an integration point and after a taint,
    nothing closes (after a taint void names count too: in foreign content they nest). No walk of the
    model looks further than `_MODEL_REACH` entries, nor further than a few once the page's budget of
    walk steps is spent: its work stays linear in the tags, and what it gives up on errs long.
    A page with fewer `<` than `limit` cannot exceed it, so ordinary pages cost one count.
    """
    data = document if isinstance(document, bytes) else document.encode("utf-8", "surrogatepass")
    tags = data.count(b"<")
    if tags <= limit:
        return 0
    stack = _OpenElements(_MODEL_STEPS_PER_TAG * tags)
    standards = _STANDARDS_DOCTYPE.match(data) is not None  # else a <table> may leave a <p> open
    form_open: bool | None = False  # the parser's form element pointer is set (None: unknown)
    zone = -1  # where the <svg> or <math> whose content the scan reads is (-1: none)
    # Where the integration point open in the zone is, while only its island's tags (TAINTED) followed it
    # (-1: none).
    point = point_at = -1
    most = 0
    for end_tag, name, start, end, where in _tag_tokens(data):
        island_end = False
        if point >= 0 and where != TAINTED:
            # The point's end tag after its island: every island end tag closed the element on top
            # (`_tag_tokens`), so the parser has closed all the island opened, and its formatting
            # elements left the list at their end tags. Held as popped by the point's end tag, a
            # diagram's 2,100 labels (a `<font>` each) were 2,107 levels, against 10.
            island_end = (
                where == FOREIGN
                and end_tag
                and point < len(stack.entries)
                and stack.is_sure(point)
                and stack.name_at(point) == name
                and stack.last(name) == point
            )
            point_at, point = point, -1
        if where == HTML and zone >= 0:
            # The zone's end tag, a tag that leaves foreign content, or an end tag of an element around
            # the zone: the parser pops every foreign element.
            if stack.entries[zone:] and stack.entries[zone] is not None:
                stack.close(zone)
            zone = -1
            if end_tag and name in _ZONES:
                continue
        if where == FOREIGN:
            if end_tag:
                found = stack.last(name)
                if island_end:
                    stack.pop_from(point_at, hold=False)
                elif found > zone >= 0:  # a foreign element of the zone: popped with what is above it
                    stack.close(found)
            elif not is_self_closing(data[start:end].rstrip(b">")):
                stack.push(name, True)
                if name in _ISLAND_POINTS:
                    point = point_at = len(stack.entries) - 1
        elif where != HTML:  # in a <select> (but its end tag) or after a taint: nothing closes
            if where == SELECT and name in _LEAVES_SELECT and not end_tag:
                found = stack.last(b"select")  # it closes the <select>, then opens in the body
                if found >= 0 and not stack.limit_after(found):
                    stack.close(found)
                elif found >= 0:
                    stack.unsure_from(found)
            elif where == SELECT and name in _PIVOTS:
                # In a <select> in a table, a table's tag closes the select and acts on the table:
                # what the estimate holds open there is no longer sure.
                stack.doubt()
                if not end_tag and name not in _VOID_B:
                    stack.push(name, name not in _NOT_NESTING, sure=False)
            elif not end_tag and (
                name not in _VOID_B
                or (
                    where == TAINTED
                    and name not in _BREAKOUT
                    and not is_self_closing(data[start:end].rstrip(b">"))
                )
            ):
                # Counted as the parser may nest it: after a taint anything, void names too (in <svg>
                # or <math> a `<col>`, `<source>` or `<image>` is a foreign element, which nests;
                # those that leave foreign content, an `<img>`, a `<br>`, ..., are void there too);
                # in a <select> what it does not close itself, and formatting elements (re-created
                # outside when it closes).
                counted = where == TAINTED or name not in _NOT_NESTING  # (no formatting name is in it)
                stack.push(name, counted, sure=False)
                if name in _MARKERS:
                    stack.marker(False)
            if where == TAINTED:
                form_open = None
        elif end_tag:
            if name in _FOREIGN_SPECIAL:
                name = name.upper()  # an HTML element's (see below): it closes no MathML or SVG one
            if name not in _CLOSES_WITH_MORE and stack.close_top(name):
                continue
            _end_tag(stack, name, form_open)
            if name == b"form" and form_open is not None and stack.last(b"template") < 0:
                form_open = False  # the parser clears its pointer, whether or not the form closes
        elif name not in _STARTS_WITH_MORE:
            # The common case: it only opens. An HTML <mi>, <desc>, ... is no special element, no
            # scope limit, as the MathML and SVG ones are: filed under its name in capitals (no
            # lowercased tag has one), end tags and item walks pass it.
            stack.push(name.upper() if name in _FOREIGN_SPECIAL else name, True)
        elif name in _TABLE_PARTS:
            _table_part(stack, name)
        elif name in _VOID_B:
            if name == b"hr":
                _close_p(stack, sure=True)
        elif name in (b"html", b"head", b"body"):
            continue  # merged into the element the parser has
        elif name == b"form":
            template = stack.last(b"template") >= 0
            if form_open and not template:
                continue  # the parser ignores it
            _close_p(stack, sure=form_open is False or template)
            stack.push(name, True)
            if not template and form_open is not None:
                form_open = True
        elif name in _ZONES:
            if is_self_closing(data[start:end].rstrip(b">")):
                continue  # `<svg/>` opens nothing
            _start_tag(stack, name, standards)
            zone = len(stack.entries) - 1
        else:
            _start_tag(stack, name, standards)
        if stack.depth > most:
            most = stack.depth
            if most > limit:
                break
    return most


def _close_p(stack: _OpenElements, *, sure: bool) -> None:
    """A start tag that closes a <p> in button scope (`sure`: surely does, in this mode)."""
    found = stack.last(b"p")
    if found >= 0 and not stack.limit_after(found, b"button"):
        if sure:
            stack.close(found)
        else:
            stack.unsure_from(found)


def _start_tag(stack: _OpenElements, name: bytes, standards: bool) -> None:
    if name in _CLOSES_P:
        if name in (b"li", b"dd", b"dt"):
            # The walk back to the last item open passes no special element but address, div, p.
            targets = (b"li",) if name == b"li" else (b"dd", b"dt")
            index = top = len(stack.entries) - 1
            reach = min(_ITEM_REACH, stack.reach)  # (removed entries count: a run of them is walked too)
            for index in range(top, -1, -1):
                entry = stack.entries[index]
                if entry is not None:
                    if entry[0] in targets:
                        stack.close(index)
                        break
                    if entry[0] in _SPECIAL_OPEN and entry[0] not in (b"address", b"div", b"p"):
                        break
                if top - index >= reach:
                    stack.doubt()  # too far to follow: it may close one further down
                    break
            stack.spend(top - index)
        _close_p(stack, sure=True)
        if name in _HEADINGS_B and stack.top() in _HEADINGS_B:
            # A heading closes one that is the current node: surely, unless the parser may have
            # re-created a formatting element above it.
            if stack.settled():
                stack.close(len(stack.entries) - 1)
            else:
                stack.unsure_from(len(stack.entries) - 1)
    elif name == b"table":
        family = stack.last_family()
        if family >= 0 and stack.name_at(family) not in (b"td", b"th", b"caption", b"template"):
            table = stack.last(b"table")
            if table >= 0 and stack.is_sure(family):
                stack.close(table)  # a table in a table's rows closes it first
            else:
                stack.doubt()
        _close_p(stack, sure=standards)
    elif name == b"button":
        found = stack.last(b"button")
        if found >= 0 and not stack.limit_after(found):
            stack.close(found)
    elif name in (b"a", b"nobr"):
        found = stack.last(name)
        if found >= 0 and (not stack.markers_known or stack.marker_of(found) != stack.markers[-1]):
            # The open one is before the last marker (one a table may have left, popping its
            # <applet>): the parser runs no adoption agency, and this one nests in it.
            stack.note_formatting(name)
            stack.push(name, True)
            return
        if stack.held(name):
            # Popped since it opened (re-created or not: see release): an <a> runs the adoption agency
            # for the last one on the list, a <nobr> re-creates the ones held, then adopts the last; one
            # leaves, but behind a limit it stays, and this one nests.
            if not stack.held_behind_limit(name):
                stack.release(name)
        elif name == b"a" and found >= 0:
            if stack.maybe_off_list(found):
                stack.unsure_from(found)  # on the list or not: its adoption agency runs or not
            else:
                # The adoption agency for the open one, as for its end tag; then it leaves the stack.
                _end_tag(stack, name, None)
                if stack.last(name) == found:
                    stack.remove(found, pops_above=False)
        elif name == b"nobr" and found >= 0 and not stack.limit_after(found):
            _end_tag(stack, name, None)  # a <nobr> in scope: the adoption agency, as for its end tag
    elif name in (b"option", b"optgroup") and stack.top() == b"option":
        stack.remove(len(stack.entries) - 1)  # it closes the current <option>
    elif name in (b"rb", b"rp", b"rt", b"rtc") and stack.top() in _IMPLIED:
        stack.unsure_from(len(stack.entries) - 1)  # its implied end tags may pop what is current
    if name in _FORMATTING:
        stack.note_formatting(name)
    stack.push(name, True)  # (a <p>, <li>, <button>, <option> too: popped where the parser pops them)
    if name in _MARKERS:
        stack.marker(True)


def _table_part(stack: _OpenElements, name: bytes) -> None:
    """A start tag of a table's structure: it closes the open cell, caption, row or section it does not
    belong in, and pops what is above the table's structure (elements foster-parented out of it)."""
    for _ in range(4):
        family = stack.last_family()
        if family < 0:
            return  # no table: the parser ignores it
        if not stack.is_sure(family) or stack.name_at(family) == b"template":
            stack.doubt()
            if name != b"col":
                stack.push(name, False, sure=False)
                if name in _MARKERS:
                    stack.marker(False)
            return
        kind = stack.name_at(family)
        if kind in (b"td", b"th", b"caption") or (kind == b"colgroup" and name != b"col"):
            stack.pop_from(family)  # closes it, then as in the table, row or section
            if kind != b"colgroup":
                stack.clear()
            continue
        if kind == b"colgroup":
            stack.pop_from(family + 1)
            return
        if kind == b"tr" and name not in (b"td", b"th"):
            stack.pop_from(family)  # closes the row
            continue
        if kind in _ROW_GROUPS and name not in (b"tr", b"td", b"th"):
            stack.pop_from(family)  # closes the section
            continue
        stack.pop_from(family + 1)
        # Each counts: the model pops them where the parser does (a cell, its row, its section), and
        # uncounted, what a cell holds nested nine deep a level (`<td><li><button><li><p><option>`).
        if kind == b"table":
            if name == b"col":
                stack.push(b"colgroup", True)
            elif name in (b"tr", b"td", b"th"):
                stack.push(b"tbody", True)
        if kind != b"tr" and name in (b"td", b"th"):
            stack.push(b"tr", True)
        if name != b"col":
            stack.push(name, True)
            if name in _MARKERS:
                stack.marker(True)
        return
    stack.doubt()


def _end_tag(stack: _OpenElements, name: bytes, form_open: bool | None) -> None:
    if name in _TABLE_FAMILY:
        _table_end(stack, name)
    elif name in _FORMATTING:
        if stack.held(name):
            stack.release(name)
            return
        found = stack.last(name)
        if found < 0 or stack.limit_after(found):
            return
        if stack.special_after(found):
            # The adoption agency (it moves elements, the depth stays); or, for one the parser may
            # have taken off its list, the rule of other end tags (a special element above: ignored).
            if stack.maybe_off_list(found) or not stack.adopt(found):
                stack.unsure_from(found)
            return
        stack.close(found)
    elif name == b"form":
        found = stack.last(name)
        if found < 0 or stack.limit_after(found):
            return
        if stack.last(b"template") >= 0:
            stack.close(found)
        elif form_open:
            if stack.top() in _IMPLIED:
                stack.unsure_from(len(stack.entries) - 1)  # the implied end tags may pop it
            stack.remove(found, pops_above=False)  # only the form leaves the stack
    elif name in _HEADINGS_B:
        found = max(stack.last(heading) for heading in _HEADINGS_B)
        if found >= 0 and not stack.limit_after(found):
            stack.close(found)
    elif (name in _SPECIAL_OPEN or name in _SCOPE_LIMITS) and name not in _FOREIGN_SPECIAL:
        if name in (b"body", b"html"):
            return
        found = stack.last(name)
        if found < 0:
            return
        more = (b"button",) if name == b"p" else (b"ol", b"ul") if name == b"li" else ()
        if not stack.limit_after(found, *more) and stack.close(found) and name in _MARKERS:
            stack.clear()  # an <applet>, <marquee> or <object>
    else:
        found = stack.last(name)
        if found >= 0 and not stack.special_after(found):
            stack.close(found)


def _table_end(stack: _OpenElements, name: bytes) -> None:
    """An end tag of a table's structure (or </template>): it pops to its element, passing only the
    structure inside it (the parser's table scope)."""
    if name == b"template":
        found = stack.last(name)
        if found >= 0 and stack.close(found):
            stack.clear()
        return
    inside = {
        b"table": (b"td", b"th", b"tr", b"tbody", b"thead", b"tfoot", b"caption", b"colgroup"),
        b"tbody": (b"td", b"th", b"tr"),
        b"thead": (b"td", b"th", b"tr"),
        b"tfoot": (b"td", b"th", b"tr"),
        b"tr": (b"td", b"th"),
    }.get(name, ())
    found = stack.last_family()
    cell = found >= 0 and stack.name_at(found) in (b"td", b"th", b"caption")
    # Down the table's structure by index (cells a template left unsure pile up there: each end tag
    # rescanning them was cubic, 37 KB for minutes), within the walk's reach; past it the parser may
    # have closed any of it, unseen.
    entries, family = stack.entries, stack.family
    index = top = len(family) - 1 if found >= 0 else -1  # (`last_family` dropped removed ones on top)
    while index >= 0:
        entry = entries[family[index]]
        if entry is not None:
            if entry[0] == name:
                stack.spend(top - index)
                if stack.close(family[index]) and cell:
                    stack.clear()  # the cell or caption it closes
                return
            if entry[0] not in inside:
                break
        if top - index >= stack.reach:
            stack.doubt()
            break
        index -= 1
    stack.spend(top - index)


def _comment_end(lowered: bytes, start: int) -> int:
    """Where the comment whose `<!--` ends at `start` ends (-1: at the end of the page)."""
    if lowered.startswith(b">", start):
        return start + 1
    if lowered.startswith(b"->", start):
        return start + 2
    # One search for the first of the two: looking for either one on its own up to the page's end at
    # every comment was quadratic (a megabyte of <!--x--> without "--!>", or of <!--x--!> without
    # "-->", took about a minute). The two cannot overlap, so the first to start is the first to end.
    end = _COMMENT_CLOSE.search(lowered, start)
    return -1 if end is None else end.end()


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
        _VOID,
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
