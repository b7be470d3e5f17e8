"""The executable reference for `service.core.prune`: the same rules on BeautifulSoup4 + lxml.

This is how the paper's own tooling would write the algorithm: a DOM in BeautifulSoup, `decompose()`
for removals, `attrs = {}` for rule 4, `unwrap()` for rule 5, one `re.sub` for rule 6. It is slow and
obviously correct, which is its job: the tests and `benchmarks/prune.py` compare the fast
implementation with it token for token.

The tree: lxml's parser (libxml2) is not an HTML5 tree builder. On real, broken markup it builds a
different tree than a browser (no implied `<tbody>`, different repair of misnested tags, no foster
parenting), and then the two implementations would be comparing parsers, not rules. So the reference
gets the tree the way the fast path does — the page is decoded by `decode_html` and parsed by Lexbor —
and then *Lexbor's serialisation of that tree, untouched* (scripts, comments and attributes included)
is what BeautifulSoup parses with lxml. That serialisation is well-formed, so libxml2 rebuilds the same
tree from it in all but a few cases (see docs/preprocessing.md, "Where the reference differs").
Everything after that — every rule and every decision — is implemented here independently.
"""

from __future__ import annotations

import re
import warnings
from html import escape

from bs4 import BeautifulSoup, NavigableString, Tag, XMLParsedAsHTMLWarning
from bs4.dammit import EntitySubstitution
from bs4.element import CData, Comment, Declaration, Doctype, ProcessingInstruction
from bs4.formatter import HTMLFormatter
from selectolax.lexbor import LexborDocumentOptions, LexborHTMLParser

from service.core.decoding import decode_html


def _names(words: str) -> frozenset[str]:
    return frozenset(words.split())


KEEP_TAGS = _names(
    "a address audio br button col embed figure footer form frame header hr iframe img input label "
    "menu meter nav option output picture progress search select td th tr textarea video i svg"
)
REMOVED_TAGS = ["script", "style", "noscript", "template", "noembed", "noframes"]
NEVER_REPLACED = _names(
    "table caption colgroup thead tbody tfoot tr td th button object applet marquee select h1 h2 h3 h4 h5 h6"
)
NEVER_MOVED_UP = _names(
    "caption col colgroup thead tbody tfoot tr td th li dt dd option optgroup rb rt rp rtc frame frameset"
)
HEADINGS = _names("h1 h2 h3 h4 h5 h6")
BLOCK_TAGS = _names(
    "address article aside blockquote body br caption center dd details dialog dir div dl dt fieldset "
    "figcaption figure footer form frameset h1 h2 h3 h4 h5 h6 head header hgroup hr html legend li "
    "listing main menu nav ol optgroup option p pre search section select summary table tbody td tfoot "
    "th thead title tr ul"
)
HIDDEN_STYLES = ("display:none", "display: none", "visibility:hidden", "visibility: hidden")
_NOT_TEXT = (Comment, Doctype, ProcessingInstruction, Declaration, CData)
_WHITESPACE_RUN = re.compile(r"\s+")
_SPACE_BY_BLOCK = re.compile(r" ?(</?(?:" + "|".join(sorted(BLOCK_TAGS)) + r")>) ?")
VOID_TAGS = _names(
    "area base basefont bgsound br col embed frame hr img input keygen link meta param source track wbr"
)
# A comment; a raw-text element (groups 1-4); or a start/end tag (groups 5-6).
_RAW_OR_TAG = re.compile(
    r"<!--.*?-->"
    r"|(<(script|style|noscript|iframe|noembed|noframes|xmp)\b([^>]*)>)(.*?)</\2>"
    r"|<(/?)([a-zA-Z][^\s/>]*)[^>]*>",
    re.DOTALL,
)
_PLAINTEXT = re.compile(r"(<plaintext\b[^>]*>)(.*)</plaintext>", re.DOTALL)
# Void elements as <br>, text escaping exactly &, < and > (no named entities).
_FORMATTER = HTMLFormatter(
    entity_substitution=EntitySubstitution.substitute_xml, void_element_close_prefix=""
)


def html5_serialization(html: str | bytes, *, encoding: str | None = None) -> str:
    """The page decoded and parsed as the pruner parses it (Lexbor, scripting on), serialised back."""
    text = decode_html(html, encoding=encoding).text
    root = LexborHTMLParser(text, scripting=True, options=LexborDocumentOptions.WO_EVENTS).root
    return (root.html or "") if root is not None else ""


def soup_of_tree(serialized: str) -> BeautifulSoup:
    """BeautifulSoup (lxml) holding exactly the tree an HTML5 serialisation describes.

    libxml2 reads HTML by HTML 4 rules: it closes a `<h2>` when a `<p>` starts, a `<b>` when a `<div>`
    does, knows nothing of raw-text `<noscript>`, and so on, which would rebuild a different tree
    from a perfectly well-formed serialisation. So before lxml reads it, the text of raw-text elements
    is escaped (the HTML5 serialiser writes it literally) and every tag is renamed `x-NAME`, void
    elements given an end tag: libxml2 has no rules for unknown tags and reproduces the nesting as
    written. The names are restored afterwards, and the `<html>`/`<body>` libxml2 wraps around an
    unknown root are unwrapped.
    """
    if "<plaintext" in serialized:
        serialized = _PLAINTEXT.sub(_escape_plaintext, serialized)
    marked = _RAW_OR_TAG.sub(_mark, serialized)
    soup = BeautifulSoup(marked, "lxml")
    for tag in soup.find_all(True):
        if tag.name.startswith("x-"):
            tag.name = tag.name[2:]
            tag.can_be_empty_element = tag.name in VOID_TAGS
        else:
            tag.unwrap()
    return soup


def _mark(match: re.Match[str]) -> str:
    raw_tag, tag = match.group(2), match.group(6)
    if raw_tag is not None:
        content = escape(match.group(4), quote=False)
        return _rename(match.group(1), raw_tag) + content + "</x-" + raw_tag + ">"
    if tag is None:  # a comment, which may hold what looks like markup
        return match.group(0)
    if match.group(5):
        return "</x-" + tag + ">"
    return _rename(match.group(0), tag) + ("</x-" + tag + ">" if tag in VOID_TAGS else "")


def _rename(start_tag: str, name: str) -> str:
    return "<x-" + name + start_tag[1 + len(name) :]


def _escape_plaintext(match: re.Match[str]) -> str:
    return match.group(1) + escape(match.group(2), quote=False) + "</plaintext>"


def reference_prune(html: str | bytes, *, encoding: str | None = None) -> str:
    """The pruned HTML of a page, computed with BeautifulSoup + lxml (slow, straightforward)."""
    return prune_soup(soup_of_tree(html5_serialization(html, encoding=encoding)))


def reference_prune_raw(html: str | bytes, *, encoding: str | None = None) -> str:
    """The same rules on lxml's own tree of the decoded page (the paper's literal set-up).

    Not expected to match the fast implementation: libxml2 repairs broken markup differently from a
    browser. `benchmarks/prune.py --raw-lxml` reports how often it still does.
    """
    with warnings.catch_warnings():
        # Some pages start with an XML declaration; lxml's HTML parser is still what the paper used.
        warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)
        return prune_soup(BeautifulSoup(decode_html(html, encoding=encoding).text, "lxml"))


def prune_soup(soup: BeautifulSoup) -> str:
    """Rules 2-6 (and the documented decisions) on a parsed soup."""
    # Rule 2, the named part: scripts, styles, comments, and our decisions' removals.
    for tag in soup.find_all(REMOVED_TAGS):
        tag.decompose()
    for string in soup.find_all(string=lambda s: isinstance(s, _NOT_TEXT)):
        string.extract()
    for tag in soup.find_all("input"):
        if str(tag.get("type", "")).strip().lower() == "hidden":
            tag.decompose()
    for tag in soup.find_all(True):
        if tag.decomposed:  # inside an element removed just before
            continue
        style = str(tag.get("style", "")).lower()
        if tag.has_attr("hidden") or any(hidden in style for hidden in HIDDEN_STYLES):
            tag.decompose()
    for tag in soup.find_all(["svg", "iframe"]):
        tag.clear()
    for tag in soup.find_all(["xmp", "plaintext"]):
        tag.name = "pre"
    # Rule 4.
    for tag in soup.find_all(True):
        tag.attrs = {}
    # Rules 2 and 5, depth first: in reversed document order every element comes after its
    # descendants, so each is judged with its subtree already pruned.
    for tag in reversed(soup.find_all(True)):
        has_text = any(isinstance(c, NavigableString) and c.strip() for c in tag.contents)
        if has_text:
            continue
        children = [c for c in tag.contents if isinstance(c, Tag)]
        if not children:
            if tag.name not in KEEP_TAGS:
                tag.decompose()
            continue
        if len(children) == 1 and _may_replace(tag, children[0]):
            tag.unwrap()
    # Rule 6 (and entities: the formatter escapes exactly &, < and >), then the spaces next to
    # block-level tags, which are not rendered.
    collapsed = _WHITESPACE_RUN.sub(" ", soup.decode(formatter=_FORMATTER)).strip()
    return _SPACE_BY_BLOCK.sub(r"\1", collapsed)


def _may_replace(tag: Tag, child: Tag) -> bool:
    """Rule 5's exceptions: replacements that would re-parse into a different tree."""
    if tag.name in NEVER_REPLACED or child.name in NEVER_MOVED_UP:
        return False
    parent = tag.parent
    parent_name = parent.name if isinstance(parent, Tag) and not isinstance(parent, BeautifulSoup) else ""
    return not (child.name in HEADINGS and parent_name in HEADINGS)
