"""The memory of the elements the HTML parser re-creates from formatting elements left open
(`reconstruction_bytes`: its docstring gives the model), estimated before parsing.

A page that leaves so many formatting elements open that the parser would re-create them past the
memory budget is refused (`InputTooLargeError`); `tags_with_attributes` is the cheap bound tried first,
and `_reconstruction_bound` what the replay falls back on past its own budget of steps. One replay
function of about 550 lines is most of the module.
"""

from __future__ import annotations

import bisect
import re

from service.core.precheck.attributes import attribute_count, tags_with_attributes
from service.core.precheck.elements import (
    ADOPTION_ROUNDS,
    CLOSES_P,
    FORMATTING,
    MARKERS,
    NOAHS_ARK,
    PIVOTS,
    SCOPE_BOUNDARIES,
    TABLE_ENDS,
    TABLE_STARTS,
)
from service.core.precheck.memory import MEMORY_PER_ATTRIBUTE, MEMORY_PER_CLONE
from service.core.precheck.tags import (
    FOREIGN,
    HTML,
    ISLAND_POINTS,
    LEAVES_SELECT,
    RAW_TEXT_NAMES,
    SELECT,
    TAINTED,
    is_self_closing,
    tag_tokens,
)

# The special elements the parser's adoption agency stops at (void ones never stay open).
_SPECIAL = frozenset(
    b"""address article aside blockquote body button center dd details dir div dl dt fieldset
    figcaption figure footer form frameset h1 h2 h3 h4 h5 h6 head header hgroup html iframe li listing main
    menu nav noembed noframes noscript ol p plaintext pre search section summary tbody textarea tfoot
    thead tr ul xmp""".split()
)
_CLOSED_BY_BLOCKS = frozenset((b"p", b"li", b"dd", b"dt"))  # a block start closes one left open
_CELLS = frozenset((b"td", b"th", b"caption"))  # what the parser closes, clearing its marker, in a table
# End tags that may make the parser clear its list to the last marker (start tags: `TABLE_STARTS`, which
# close an open cell or caption): what closes a cell, a caption, an <object>, ... or a template.
_CLEARING_ENDS = TABLE_ENDS | {b"applet", b"marquee", b"object"}
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
    (*RAW_TEXT_NAMES.split(b"|"), b"select", b"svg", b"math", b"frameset", b"template")
)
_TEXT_CHARACTER = re.compile(rb"[^\t\n\f\r \x00]")
_CHARACTER = re.compile(rb"[^\x00]")
_SCAN_AFTER = 64  # live entries looked at for the adoption agency's inner clones (then: the heaviest)
# Start tags that close an element left open (and with it what it holds): a block start the open
# <p>, an <li> the open <li>, and so on. (Not a <button>, a <tbody> outside a table, ...: the parser
# leaves the <p> open, and its end pops what it holds then.)
_IMPLIED_ENDS: dict[bytes, tuple[bytes, ...]] = {
    **{name: (b"p",) for name in CLOSES_P},
    b"li": (b"p", b"li"),
    b"dd": (b"p", b"dd", b"dt"),
    b"dt": (b"p", b"dd", b"dt"),
    b"td": (b"td", b"th"),
    b"th": (b"td", b"th"),
    b"tr": (b"td", b"th", b"tr"),
    b"option": (b"option",),
    b"optgroup": (b"option", b"optgroup"),
}


# The replay's budget of steps (entries and boundaries its walks visit): per tag of the page (`<`), per
# clone it charged (`MEMORY_PER_CLONE` of its estimate), and for every page. Corpus pages take at most
# 0.63 a tag; see `reconstruction_bytes`.
_REPLAY_STEPS_PER_TAG = 16
_REPLAY_STEPS_PER_CLONE = 4
_REPLAY_STEPS_HEADROOM = 1 << 20


def reconstruction_bytes(document: str | bytes, *, limit: int | None = None) -> int:
    """An upper estimate of the memory the HTML parser takes for the elements it re-creates while
    "reconstructing the active formatting elements" (stopping once past `limit` bytes): each clone
    `MEMORY_PER_CLONE`, and `MEMORY_PER_ATTRIBUTE` for each attribute it copies (clones of 60-attribute
    tags took 3 GB where 400 bytes a clone said 140 MB).

    A formatting element (`<b>`, `<font>`, ...) left open stays on the parser's list of active
    formatting elements after its parent closes, and is cloned at the next text or tag; clones nest in
    each other, so a page that leaves N distinct ones open before M paragraphs makes about N x M
    elements: 60 KB of `<p><b id=N>x` took 16 s and 3.2 GB (the nesting estimate cannot see it: each
    clone chain is closed by the next paragraph). The list keeps at most three entries of one name and
    attributes (the "Noah's Ark" clause).

    The estimate replays the list over the page's tags as the tokenizer reads them (`tag_tokens`: a
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
    (`TABLE_STARTS`, `_CLEARING_ENDS`), which takes the last such fence. The list's markers are kept
    apart from the elements that inserted them (a table pops an `<object>` in it and leaves its marker):
    a surely closed cell, caption, `<object>`, ... or template clears the list to the last marker, a cell
    the parser may have ignored clears nothing, and a new `<a>` takes the open one off. Each run of the
    adoption agency (an end tag, a new `<a>` or `<nobr>`) is charged its clones: up to eight rounds, one
    per special element after the entry, each a clone of it and of three entries after it.
    It errs long: attributes are compared as written (`id=1 b=2` and `b=2 id=1` count as two; after a
    taint, where a tag's extent is unsure, no two are the same); and an end tag takes the last entry of
    its name off only where the parser surely does, which it does not when the element is out of scope
    (`<b id=1><svg><desc></b>` left every `<b>` open) or after eight rounds of its adoption agency: so
    not while a scope boundary (`SCOPE_BOUNDARIES`) opened since the entry's own tag is open, nor eight
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
    budget. Steps paid by clones end at `limit` (each clone charges `MEMORY_PER_CLONE` at least):
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
        return min(later, ADOPTION_ROUNDS) * (weight[newest] + 3 * between)

    # An integration point open in <svg> or <math> (its name, the last entry, its tag and the last serial
    # before it), and the names its island's start tags opened (`tag_tokens` yields those as TAINTED).
    point: tuple[bytes, int, int, int] | None = None
    island_names: set[bytes] = set()

    for tick, (end_tag, name, start, end, where) in enumerate(tag_tokens(data), 1):
        if steps > most_steps and steps > most_steps + _REPLAY_STEPS_PER_CLONE * (work // MEMORY_PER_CLONE):
            return max(work, _reconstruction_bound(data))  # (never on the corpus: see the docstring)
        if where == TAINTED:
            if point is not None and not end_tag:
                island_names.add(name)
        elif point is not None and where == FOREIGN and end_tag and name == point[0]:
            # The point's end tag after an island (only TAINTED tags since it opened, and the scan still
            # in the zone): every island end tag closed the element on top (`tag_tokens`), so each of
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
            and name in ISLAND_POINTS
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
        if not trusted and name in PIVOTS:
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
            if where >= SELECT and name in LEAVES_SELECT and starts.get(b"select"):
                # It closes the <select> and what it holds; after a taint too (`<select><svg><em>`
                # leaves the <svg>, the <select> stays open: 30 <b>s were re-created at each of 60
                # `<select>`s, none estimated).
                closed_after(starts[b"select"][-1])
        if where != FOREIGN and contexts and name in (TABLE_ENDS if end_tag else TABLE_STARTS):
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
        if where != FOREIGN and name in FORMATTING and (end_tag or name in (b"a", b"nobr")):
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
            if name in FORMATTING:
                newest = last_live(name)
                if newest is not None and _surely_in_scope(since[newest], boundaries, specials):
                    remove(newest)  # the last live entry of its name leaves
            elif where == HTML and name in TABLE_ENDS:
                if not unsure:
                    table_end(name)
            elif name in SCOPE_BOUNDARIES:
                if boundaries and boundaries[-1][0] == name:
                    pop_to(len(boundaries) - 1, clear=boundaries[-1][2])
            elif name in _SPECIAL and specials and specials[-1][0] == name:
                specials.pop()  # an end tag closes the special element only when it is the last open
        if fences and where != FOREIGN and name in (_CLEARING_ENDS if end_tag else TABLE_STARTS):
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
        if name in TABLE_STARTS and where != FOREIGN:
            last_part = 2 * tick
        if where == FOREIGN and is_self_closing(data[start:end].rstrip(b">")):
            continue
        if name in SCOPE_BOUNDARIES:
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
            if where != FOREIGN and name in MARKERS:
                marks.append(entry)  # a marker, or one the parser may insert (a cell outside a table)
                if html and name not in _CELLS and (name == b"template" or not (unsure or templates)):
                    fence()  # inserted after the reconstruction this tag makes
            if name in _CELLS and html and not contexts:
                continue  # outside a table (or template) the parser ignores a cell's tags
            serial += 1
            # Closing it surely clears the list: a cell or caption of a table, an <object>, ...
            clears = html and (inner is not None if name in _CELLS else name in MARKERS)
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
        elif name in TABLE_STARTS and where == HTML:
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
        elif name in FORMATTING:
            key = data[start:end]  # as written: attributes in their own case
            entry += 1
            if where == TAINTED:
                key += b"\x00%d" % entry  # its extent is unsure: a copy of nothing
            same = copies.get(key)
            if same is None:
                same = copies[key] = []
            elif len(same) >= NOAHS_ARK:
                # The newest three copies still on the list (those removed since go on the way).
                kept: list[int] = []
                while same and len(kept) < NOAHS_ARK:
                    copy = same.pop()
                    steps += 1
                    if copy in key_of:
                        kept.append(copy)
                same.extend(reversed(kept))
                # The parser keeps three copies after the last marker only: a copy from before a marker
                # the parser may have (a boundary's, left in place when a table popped it, ...) stays.
                if len(kept) == NOAHS_ARK and (not marks or kept[-1] > marks[-1]):
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
                cost = weight_of[key] = MEMORY_PER_CLONE + MEMORY_PER_ATTRIBUTE * attribute_count(key)
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
    list after its last marker (`tags_with_attributes`), and each tag runs the adoption agency at most
    once, `ADOPTION_ROUNDS` rounds of at most four clones, none heavier than the list."""
    list_bytes, _ = tags_with_attributes(data)
    return (2 + 4 * ADOPTION_ROUNDS) * (data.count(b"<") + 1) * list_bytes


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
    scope boundary opened since is open, nor `ADOPTION_ROUNDS` special elements."""
    if boundaries and boundaries[-1][1] > opened:
        return False
    later = len(specials) - bisect.bisect_right(specials, opened, key=lambda open_: open_[1])
    return later < ADOPTION_ROUNDS
