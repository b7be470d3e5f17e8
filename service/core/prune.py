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
(peak RSS under 10x the input plus 200 MB: about `_MEMORY_PER_TAG` bytes per `<`); a page nesting
deeper than `max_depth` raises `NestingTooDeepError` (Lexbor's tree builder is quadratic in nesting
depth: 100,000 nested `<div>`s take half a minute) and an element with more than `MAX_ATTRIBUTES`
attributes `TooManyAttributesError` (its tokenizer is quadratic in them too: a million would take an
hour). Everything else returns a result. There is no Python recursion anywhere: the pruning runs as
one loop over the tokens of Lexbor's serialisation of the cleaned tree, with an explicit stack.

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

import html as _html
import re
from itertools import accumulate
from typing import AnyStr

from selectolax.lexbor import LexborDocumentOptions, LexborHTMLParser, SelectolaxError

from service.core.decoding import decode_html, utf8_payload
from service.core.errors import ErrorCode, HtmllmError

PRUNE_VERSION = "5"  # recorded in checkpoints; bump whenever the output for some input changes

DEFAULT_MAX_BYTES = 16 * 1024 * 1024  # larger pages are refused before parsing
DEFAULT_MAX_DEPTH = 8192  # deeper nesting is refused before parsing (see the module docstring)
# Peak memory is bounded by 10x the input plus 200 MiB: Lexbor's tree and the pruning lists take at
# most about _MEMORY_PER_TAG bytes per "<" (measured on pages made of nothing but "<p>x"), so a page
# with more tags than its budget allows is refused before parsing (the interpreter keeps the rest).
_MEMORY_PER_TAG = 400
_MEMORY_HEADROOM = 150 * 1024 * 1024
MAX_ATTRIBUTES = 4096  # an element with more is refused before parsing (see max_attributes)
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
_PLAINTEXT = re.compile(r"<plaintext\b[^>]*>(.*)</plaintext>", re.DOTALL)
# For the nesting pre-check: start and end tags of elements that can nest without bound (void
# elements, and elements the parser closes when another one opens, such as <p>, <li> or <a>, cannot).
_NESTING_TAG_PATTERN = (
    r"<(/?)(?!(?:area|base|basefont|bgsound|br|col|embed|frame|hr|img|input|keygen|link|meta|param"
    r"|source|track|wbr|p|li|dt|dd|td|th|tr|option|optgroup|tbody|thead|tfoot|colgroup|caption"
    r"|rb|rt|rp|rtc|html|head|body|a|nobr|button|form|select)[\s/>])[a-zA-Z]"
)
_NESTING_TAG = re.compile(_NESTING_TAG_PATTERN, re.IGNORECASE)
# Text in which the tokenizer sees no tags: raw-text and RCDATA elements and comments. Inline scripts
# such as `if(i<n.length)` would otherwise count as start tags.
_RAW_TEXT_OPEN = re.compile(r"<(?:(script|style|textarea|title|xmp|noembed|noframes)[\s/>]|!--)")
_RAW_TEXT_OPEN_BYTES = re.compile(_RAW_TEXT_OPEN.pattern.encode("ascii"))
_LONG_TAG = re.compile(rf"<[a-zA-Z][^>]{{{_LONG_TAG_CHARS}}}")
_LONG_TAG_BYTES = re.compile(_LONG_TAG.pattern.encode("ascii"))
_ATTRIBUTE = re.compile(r"""\s[^\s"'>/=]+(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s>]*))?""")
_ATTRIBUTE_BYTES = re.compile(_ATTRIBUTE.pattern.encode("ascii"))
_NESTING_TAG_BYTES = re.compile(_NESTING_TAG_PATTERN.encode("ascii"), re.IGNORECASE)


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
        raise NestingTooDeepError(f"page nests about {depth} elements deep; the cap is {max_depth}")
    attributes = max_attributes(document)
    if attributes > MAX_ATTRIBUTES:
        raise TooManyAttributesError(f"an element has {attributes} attributes; the cap is {MAX_ATTRIBUTES}")
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
        return (root.html or "") if root is not None else ""
    except (SelectolaxError, MemoryError) as exc:
        raise ParseFailedError(f"the HTML parser failed: {exc}") from exc


def max_attributes(document: str | bytes) -> int:
    """The most attributes any one element of the page has, counted only for very long tags.

    Lexbor's tokenizer is quadratic in the distinct attributes of one element (10,000 take half a
    second, a million would take an hour). An element with more than `MAX_ATTRIBUTES` needs a tag of
    at least `_LONG_TAG_CHARS` characters without a `>`. Any such run of characters covers a multiple
    of half that length, so only the runs around those points are measured (a few `find` calls per
    page), and only tags in a long run are counted.
    """
    is_bytes = isinstance(document, bytes)
    gt: str | bytes = b">" if is_bytes else ">"
    long_tag = _LONG_TAG_BYTES if is_bytes else _LONG_TAG
    attribute = _ATTRIBUTE_BYTES if is_bytes else _ATTRIBUTE
    step = _LONG_TAG_CHARS // 2
    size = len(document)
    most = 0
    point = step
    while point < size:
        run_start = document.rfind(gt, 0, point) + 1  # type: ignore[arg-type]
        run_end = document.find(gt, point)  # type: ignore[arg-type]
        if run_end < 0:
            run_end = size
        if run_end - run_start >= _LONG_TAG_CHARS:
            for match in long_tag.finditer(document, run_start, run_end):  # type: ignore[arg-type]
                tag = document[match.start() : run_end]
                most = max(most, len(attribute.findall(tag)))  # type: ignore[arg-type]
        point = (run_end // step + 1) * step
    return most


def estimate_depth(document: str | bytes, *, limit: int = DEFAULT_MAX_DEPTH) -> int:
    """An upper estimate of the page's nesting depth (exact enough to refuse pathological pages).

    Counts start tags minus end tags of elements that can nest without bound, in document order, and
    returns the running maximum. A page with fewer `<` than `limit` cannot exceed it, so ordinary pages
    cost one `str.count`.
    """
    if isinstance(document, bytes):
        if document.count(b"<") <= limit:
            return 0
        markup_bytes = _without_raw_text(document, _RAW_TEXT_OPEN_BYTES, b"</", b"-->")
        steps = (-1 if slash else 1 for slash in _NESTING_TAG_BYTES.findall(markup_bytes))
    else:
        if document.count("<") <= limit:
            return 0
        markup = _without_raw_text(document, _RAW_TEXT_OPEN, "</", "-->")
        steps = (-1 if slash else 1 for slash in _NESTING_TAG.findall(markup))
    return max(accumulate(steps, initial=0))


def _without_raw_text(
    document: AnyStr, opener: re.Pattern[AnyStr], end_tag: AnyStr, comment_end: AnyStr
) -> AnyStr:
    """The page without the contents of raw-text elements and comments, in linear time.

    Each raw-text element is skipped with one `find` of its closing tag (an unclosed one runs to the
    end, as the parser reads it), so the loop runs once per such element, not once per `<`. The
    arguments after `document` give the patterns in its type (str or bytes).
    """
    lowered = document.lower()
    pieces: list[AnyStr] = []
    position = 0
    while (found := opener.search(lowered, position)) is not None:
        pieces.append(document[position : found.start()])
        name = found.group(1)
        closer = comment_end if name is None else end_tag + name
        end = lowered.find(closer, found.end())
        if end < 0:
            return document[:0].join(pieces)
        position = end + len(closer)
    pieces.append(document[position:])
    return document[:0].join(pieces)


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


def _rewrite_plaintext(match: re.Match[str]) -> str:
    return "<pre>" + _html.escape(match.group(1), quote=False) + "</pre>"


def _prune_serialization(serialized: str) -> str:
    """Rules 2-6 over Lexbor's serialisation of the tree (`REMOVED_TAGS` already removed)."""
    return _finish(_apply_rules(_tokenize(serialized)))


def _tokenize(serialized: str) -> list[str]:
    """[text, slash, name, text, ...] of the serialisation, comments and raw text dealt with."""
    if "<plaintext" in serialized:  # first: its literal content may hold anything
        serialized = _PLAINTEXT.sub(_rewrite_plaintext, serialized)
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
