"""The page's nesting depth, estimated before parsing (`estimate_depth`), following the parser's stack of
open elements (`_OpenElements`).

A page nesting deeper than `max_depth` raises `NestingTooDeepError` (Lexbor's tree builder is
quadratic in nesting depth: 100,000 nested `<div>`s take half a minute), and so does one whose depth
times its tags passes `prune._NESTING_WORK_PER_BYTE` per byte (each tag walks the open elements: 7,000 nested
`<div>`s and a megabyte of `<p>x</p>` took 1.3 s); `service.core.prune` decides both.

Over 700 lines, one model: the stack (`_OpenElements`), the scan over the tags (`estimate_depth`) and the
tree builder's rules for start and end tags (`_start_tag`, `_table_part`, `_end_tag`, `_table_end`, and
`_table_run`, which applies a run of rows and cells at once)
share the stack's invariants (what is sure, what is held, what the walks may spend); split apart, each
part would only be read with the others.
"""

from __future__ import annotations

import bisect
import functools
import re

from service.core.precheck.elements import (
    ADOPTION_ROUNDS,
    CLOSES_P,
    FORMATTING,
    HEADINGS_B,
    MARKERS,
    NOAHS_ARK,
    PIVOTS,
    SCOPE_BOUNDARIES,
    VOID_B,
)
from service.core.precheck.tags import (
    BREAKOUT,
    FOREIGN,
    HTML,
    ISLAND_POINTS,
    LEAVES_SELECT,
    SELECT,
    TABLE_RUN,
    TABLE_RUN_TAG,
    TAINTED,
    ZONES,
    is_self_closing,
    tag_tokens,
)

DEFAULT_MAX_DEPTH = 8192  # deeper nesting is refused before parsing (see the module docstring)
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
# (`SCOPE_BOUNDARIES` as the parser's default scope has them: no <svg>, <math> or <select>, and <html>.)
_SCOPE_LIMITS = (SCOPE_BOUNDARIES - {b"svg", b"math", b"select"}) | {b"html"}
# Names special only as MathML or SVG elements: an HTML element of the name ends as any other.
_FOREIGN_SPECIAL = frozenset(b"mi mo mn ms mtext annotation-xml foreignobject desc".split())
_TABLE_FAMILY = frozenset(b"table tbody thead tfoot tr td th caption colgroup template".split())
_TABLE_PARTS = frozenset(b"caption colgroup col tbody thead tfoot tr td th".split())  # start tags
_ROW_GROUPS = frozenset((b"tbody", b"thead", b"tfoot"))
# The innermost of a table's structure while the parser reads in the table's rows (not in a cell or a
# caption): text and phrasing tags there are foster-parented, above the table on the stack.
_IN_TABLE_ROWS = _ROW_GROUPS | {b"table", b"tr", b"colgroup"}
# Start tags that re-create nothing (the formatting elements on the parser's list) "in body": all others
# do (`settle_fostered`), and so does the end tag `</br>`.
_NO_RECONSTRUCTION = (
    _TABLE_PARTS
    | (CLOSES_P - {b"xmp"})
    | frozenset(
        b"""table html head body frameset frame base basefont bgsound link meta noframes script style template
        title form textarea iframe noembed noscript rb rp rt rtc param source track""".split()
    )
)
# What "generate implied end tags" pops while it is the current node.
_IMPLIED = frozenset(b"dd dt li optgroup option p rb rp rt rtc".split())
# No-quirks mode: the page as the parser gets it starts with the doctype. (No byte-order mark: Lexbor
# reads one as text, which ends the doctype's place; `utf8_payload` strips the first, but a second one,
# or a str starting with U+FEFF, left the page in quirks mode while the estimate assumed no-quirks.)
_STANDARDS_DOCTYPE = re.compile(rb"\A[\t\n\f\r ]*<!doctype[\t\n\f\r ]+html[\t\n\f\r ]*>", re.I)
# Start tags that do more than open their element (or open none).
_STARTS_WITH_MORE = (
    CLOSES_P
    | _TABLE_PARTS
    | VOID_B
    | MARKERS
    | frozenset(ZONES)
    | FORMATTING
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
# What an end tag of a table's structure passes on its way down to its element (the parser's table scope).
_INSIDE = {
    b"table": (b"td", b"th", b"tr", b"tbody", b"thead", b"tfoot", b"caption", b"colgroup"),
    b"tbody": (b"td", b"th", b"tr"),
    b"thead": (b"td", b"th", b"tr"),
    b"tfoot": (b"td", b"th", b"tr"),
    b"tr": (b"td", b"th"),
}
_CELLS = (b"td", b"th")
# A table run (`_table_run`) is read in chunks of this many tags, each chunk's effect computed once per
# page for each structure it starts from (a table's rows repeat: a few distinct chunks).
_RUN_CHUNK = 64


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
        # (name, serial, counted, sure, marker, key); None: removed. Not sure: pushed where the scan
        # cannot follow. Marker: which of `markers` was the last when it opened. Key: a formatting
        # element's attributes as the page writes them (`note_formatting`; None: not known).
        self.entries: list[tuple[bytes, int, bool, bool, int, bytes | None] | None] = []
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
        # How many of those (by name, then key) a table's start tag popped from above the table, and
        # nothing has re-created outside a table since (`settle_fostered`): the parser re-creates these
        # only above a table (foster-parented), which the next table tag pops again, so no more of one
        # name and attributes than its list keeps (Noah's Ark) count (`note_formatting`). One dict per
        # marker, as `dangling`; they count among its entries.
        self.fostered: list[dict[bytes, dict[bytes, int]]] = [{}]
        # How many of those (by name, then key) a sure pop left there, at least (one per marker, as
        # `dangling`; an end tag that releases one of unknown key forgets the name's): at a start tag of
        # their name and attributes the parser's list keeps two of them besides it (Noah's Ark), the
        # others are `dropped` (`note_formatting`).
        self.keyed: list[dict[bytes, dict[bytes, int]]] = [{}]
        # None: no element the parser re-creates from its list is on its stack (a sure pop took them all
        # off, and nothing may have re-created one since). Else the serial before the first re-creation
        # since: each one re-created is above every entry up to it still open, so popping one of those
        # pops them all (`popped`).
        self.rebuilt: int | None = None
        # Formatting elements the parser re-created and then dropped from its list (Noah's Ark), open
        # until it pops what is below them: (the serial they are above every open entry up to, how many),
        # serials increasing. No end tag of theirs pops them surely, and none is re-created again.
        self.dropped: list[tuple[int, int]] = []
        self.held_total = 0  # how many are held in all of them (a heading asks at each tag: no rescan)
        self.markers: list[int] = [0]  # increasing: found by bisection
        self.marker_serials: list[int] = [0]  # the serial of the element that put each there
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

    def push(self, name: bytes, counted: bool, *, sure: bool = True, key: bytes | None = None) -> None:
        self.serial += 1
        position = len(self.entries)
        self.entries.append((name, self.serial, counted, sure, self.markers[-1], key))
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
        and is not special is not surely open any more. One re-created before a scope limit (a table)
        opened is out of the parser's scope behind it: its tags leave nothing (`held_behind_limit`;
        `</table><a><table></em><em>` x N nests a level a unit)."""
        if self.held_behind_limit(name):
            return
        held = self.dangling[-1][name]
        since = held[0]
        held.pop()
        self.held_total -= 1
        self.keyed[-1].pop(name, None)  # (which one left is not known)
        self.depth -= 1
        fostered = self.fostered[-1].get(name)
        if fostered:  # (which one left is not known: one fostered fewer keeps them among those held)
            key, count = fostered.popitem()
            if count > 1:
                fostered[key] = count - 1
            elif not fostered:
                del self.fostered[-1][name]
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
                entries[index] = (entry[0], entry[1], entry[2], False, entry[4], entry[5])
            index -= 1
        self.spend(size - index)

    def marker(self, surely: bool) -> None:
        """A cell, caption, <object>, ... opened: the parser put a marker on its list."""
        if surely:
            self.dangling.append({})
            self.fostered.append({})
            self.keyed.append({})
            self.markers.append(self.next_marker)
            self.marker_serials.append(self.serial)
            self.next_marker += 1
        else:
            self.markers_known = False

    def clear(self) -> None:
        """A cell, caption, <object>, ... surely closed: the parser cleared its list to the last marker."""
        if self.markers_known and len(self.dangling) > 1:
            cleared = sum(len(held) for held in self.dangling.pop().values())
            self.fostered.pop()
            self.keyed.pop()
            self.depth -= cleared
            self.held_total -= cleared
            self.markers.pop()
            self.marker_serials.pop()

    def rebuilding(self, serial: int) -> None:
        """The parser may re-create the formatting elements on its list above every entry up to
        `serial` that is open (`rebuilt`)."""
        if self.rebuilt is None or serial < self.rebuilt:
            self.rebuilt = serial

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
            and not self.dropped
            and all(entry is None or entry[3] for entry in self.entries[-1:])
        )

    def pop_from(
        self, position: int, *, hold_first: bool = False, hold: bool = True, fostered: bool = False
    ) -> None:
        """The parser pops the element at `position` and everything above it (a formatting element
        among those stays counted: the parser may re-create it, `dangling`; not with `hold`: each of
        those surely left the parser's list too; with `fostered`, a table's start tag pops them, above
        its structure: counted in `fostered` too)."""
        for index in range(len(self.entries) - 1, position - 1, -1):
            entry = self.entries[index]
            if entry is None:
                continue
            name, _, counted, _, marker, key = entry
            self.positions[name].pop()
            popped_by_another = (index > position or hold_first) and hold
            found = self._marker_index(marker) if name in FORMATTING and popped_by_another else None
            if found is not None:
                self.dangling[found].setdefault(name, []).append(self.serial)
                self.held_total += 1
                if fostered and key is not None:
                    keys = self.fostered[found].setdefault(name, {})
                    keys[key] = keys.get(key, 0) + 1
                if key is not None:
                    keys = self.keyed[found].setdefault(name, {})
                    keys[key] = keys.get(key, 0) + 1
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
                if above is not None and above[0] in FORMATTING:
                    held = self._held_after(above[4])
                    if held is not None:
                        # (The element may still be open, above those opened before the one removed.)
                        self.rebuilding(entry[1] - 1)
                        self.remove(index, pops_above=False)
                        held.setdefault(above[0], []).append(self.serial)
                        self.held_total += 1
                        self.depth += 1
            self.spend(top - lowest)
            self.unsure_above(entry[1], keep_special=False)
        name, _, counted, _, _, _ = entry
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
        if name in FORMATTING and self.dangling[-1].get(name):
            return False
        self.entries.pop()
        self.positions[name].pop()
        if entry[2]:
            self.depth -= 1
        if name not in FORMATTING:
            self.popped(entry)
        self._forget_from(len(self.entries))
        return True

    def _forget_from(self, size: int) -> None:
        """Drop the special, scope-limit and table positions at `size` and above (gone from the stack)."""
        for positions in (self.special, self.limits, self.family):
            while positions and positions[-1] >= size:
                positions.pop()

    def _held_after(self, marker: int) -> dict[bytes, list[int]] | None:
        """The dangling elements filed after `marker` (None: it was cleared, and with it the parser's
        entries for the elements opened after it): a cell's that an <object> in it follows stays."""
        index = self._marker_index(marker)
        return None if index is None else self.dangling[index]

    def _marker_index(self, marker: int) -> int | None:
        """Where `marker` is in `markers` (None: cleared). (Markers a table left, popping their
        <object>s, pile up: found by bisection, not a walk.)"""
        index = bisect.bisect_left(self.markers, marker)
        if index < len(self.markers) and self.markers[index] == marker:
            return index
        return None

    def settle_fostered(self) -> None:
        """Text or a start tag that re-creates the formatting elements on the parser's list, read where
        the parser is not in a table's rows (a table closed, a cell): what it re-creates there stays
        on the stack, so each of those held since a table's tag popped it counts again, whatever the
        list keeps (`fostered`)."""
        family = self.last_family()
        if family >= 0 and self.is_sure(family) and self.name_at(family) in _IN_TABLE_ROWS:
            return  # (re-created above the table: foster-parented, popped by its next tag)
        self.fostered[-1].clear()

    def note_formatting(self, name: bytes, key: bytes | None = None) -> None:
        """A formatting element of `name` is about to open: with three of the name after the last marker
        (open, or popped and held), the parser may drop the earliest from its list (Noah's Ark compares
        attributes too; by name is the safe side). Of those of its attributes (`key`) a table's tag
        popped (`fostered`), three count at most: the parser's list keeps three of a name and
        attributes, re-created above the table before this one joins them. Of those of its attributes a
        sure pop left held (`keyed`), two stay held: the list drops the others (`dropped`)."""
        marker = self.markers[-1]
        positions = self.positions.get(name, ())[-64:]
        self.spend(len(positions))
        listed = [  # open after the marker, and not already taken off the list
            e[1] for p in positions if (e := self.entries[p]) and e[4] == marker and e[1] not in self.off_list
        ]
        if listed and len(listed) + self.held(name) >= NOAHS_ARK:
            self.off_list.add(listed[0])
        fostered = self.fostered[-1].get(name)
        if key is not None and fostered and fostered.get(key, 0) > NOAHS_ARK and self.markers_known:
            extra = fostered[key] - NOAHS_ARK
            fostered[key] = NOAHS_ARK
            held = self.dangling[-1][name]
            del held[len(held) - extra :]  # (the first stays: it says since when they are held)
            self.held_total -= extra
            self.depth -= extra
            self.keyed[-1].pop(name, None)  # (which of them left is not known)
        keys = self.keyed[-1].get(name)
        if (
            keys
            and key is not None
            and keys.get(key, 0) >= NOAHS_ARK
            and self.markers_known
            and not self.fostered[-1].get(name)
        ):
            # Of the held ones of its name and attributes (each left the stack at a sure pop), the list
            # keeps two besides this one; the others leave it, gone or re-created (at this tag, or since
            # the first re-creation after all of them left: `rebuilt`; after the marker, so above the
            # cell or object that put it) above every open entry up to then: `dropped`, they count
            # until one of those is popped. Held, each of `<div><b>x</div>` x N counted again in every
            # `<div>` (Lexbor nests 7 deep).
            extra = keys[key] - (NOAHS_ARK - 1)
            keys[key] = NOAHS_ARK - 1
            held = self.dangling[-1][name]
            assert len(held) > extra, "more held by key than by name"
            del held[len(held) - extra :]  # (the first stays: it says since when they are held)
            self.held_total -= extra
            since = self.serial if self.rebuilt is None else max(self.rebuilt, self.marker_serials[-1])
            self.drop(since, extra)

    def drop(self, serial: int, count: int) -> None:
        """`count` formatting elements left the parser's list, open (if at all) above every open entry up
        to `serial` (`dropped`; with later ones above a lower serial, they are all taken as above it)."""
        while self.dropped and self.dropped[-1][0] >= serial:
            count += self.dropped.pop()[1]
        self.dropped.append((serial, count))

    def popped(self, entry: tuple[bytes, int, bool, bool, int, bytes | None]) -> None:
        """The parser pops `entry`, surely open, and all above it: the formatting elements it re-created
        (`rebuilt`) or dropped (`dropped`) since it opened with them. Not for an element the end tag of
        which may adopt another one below (the adoption agency leaves what is above the furthest block),
        nor for a zone (leaving foreign content stops at an HTML element)."""
        if entry[1] in self.off_list or entry[0] in ZONES:
            return
        if self.rebuilt is not None and entry[1] <= self.rebuilt:
            self.rebuilt = None
        while self.dropped and self.dropped[-1][0] >= entry[1]:
            self.depth -= self.dropped.pop()[1]

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
        if not specials or len(specials) >= ADOPTION_ROUNDS:
            return False
        if not all(
            self.is_sure(index) for index in range(position, len(self.entries)) if self.entries[index]
        ):
            return False
        last = specials[0]
        # (The elements it moves and holds stay above those opened before it; the scan does not follow
        # where.)
        adopted = self.entries[position]
        assert adopted is not None
        self.rebuilding(adopted[1] - 1)
        self.pop_from(last + 1, hold_first=True)  # the last round pops the clone's contents
        for index in range(last - 1, position, -1):
            entry = self.entries[index]
            if entry is not None and entry[0] not in _SPECIAL_OPEN and entry[0] not in FORMATTING:
                self.remove(index, pops_above=False)
        self.remove(position, pops_above=False)
        return True

    def close(self, position: int) -> bool:
        """The parser pops the element at `position` and what is above it: surely (True), if it is surely
        open."""
        if self.is_sure(position):
            entry = self.entries[position]
            assert entry is not None
            self.popped(entry)
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
    as the tokenizer reads them (`tag_tokens`): an end tag in an attribute value (`<div a="</div>">`,
    60,000 of which hid their nesting) or in raw text closes nothing. The parser's rules followed, each
    only where the scan can tell the parser surely applies it (elsewhere the entries stay, counted):
    an end tag pops its element and what is above it, but not past a special element (the generic rule:
    `<span><div></span>` leaves both open) nor, for a special one, past a scope limit (`<div><table>
    </div>`); a formatting element's end tag with special elements above it runs the adoption agency
    (`adopt`: the element leaves, the special ones stay), and one popped by another's end tag stays
    counted while the parser may re-create it (`dangling`: those a table's tag popped from above the
    table, as many as the parser's list keeps, until text or a tag outside the table's rows re-creates
    them, `fostered`; of those a sure pop left, as many as the list keeps at a start tag of their name and
    attributes, `keyed`, the others until the parser surely pops what is below them, `dropped`); a new
    `<a>` or `<nobr>` runs the adoption
    agency for the last on the list; a `<p>`-closing start tag, a `<li>`, `<dd>` or `<dt>`, a
    `<button>`, a table's rows, cells and sections close what they close (a glossary or a table that
    leaves them open nests no deeper), and a `<table>` in a table closes that table; a second `<form>`
    is ignored. In <svg>
    and <math> every element nests but a self-closing one and the zone's end or a tag that leaves it
    pops it all; in a <select>, in an island of HTML in an integration point and after a taint,
    nothing closes (after a taint void names count too: in foreign content they nest). No walk of the
    model looks further than `_MODEL_REACH` entries, nor further than a few once the page's budget of
    walk steps is spent: its work stays linear in the tags, and what it gives up on errs long.
    A page with fewer `<` than `limit` cannot exceed it, so ordinary pages cost one count; a run of plain
    table markup (rows and cells, `_table_run`) costs a few regex passes and a lookup per 64 tags.
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
    last_end = 0  # where the tag before ended (text between re-creates formatting elements)
    most = 0
    skips: list[tuple[int, frozenset[bytes]]] = []  # table runs read here (`_table_run`), for the scan
    effects: dict[tuple[_Chain, tuple[bytes, ...]], _ChunkEffect] = {}  # `_table_run`'s, for the page
    rebuilds = -1  # the serial before the tag before, if that tag may re-create formatting elements
    for end_tag, name, start, end, where in tag_tokens(data, skips=skips):
        # What may re-create the formatting elements on the parser's list (`rebuilt`): the tag before,
        # text (or whatever the scan skipped) before this tag, this one if not read as HTML.
        if rebuilds >= 0 or start > last_end or where != HTML:
            stack.rebuilding(rebuilds if rebuilds >= 0 else stack.serial)
        rebuilds = stack.serial if (name == b"br" if end_tag else name not in _NO_RECONSTRUCTION) else -1
        if stack.fostered[-1] and (
            start > last_end  # (a comment there too, or a table run: the safe side)
            or where != HTML
            or (name not in _NO_RECONSTRUCTION if not end_tag else name == b"br")
        ):
            stack.settle_fostered()
        last_end = end
        island_end = False
        if point >= 0 and where != TAINTED:
            # The point's end tag after its island: every island end tag closed the element on top
            # (`tag_tokens`), so the parser has closed all the island opened, and its formatting
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
            if end_tag and name in ZONES:
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
                if name in ISLAND_POINTS:
                    point = point_at = len(stack.entries) - 1
        elif where != HTML:  # in a <select> (but its end tag) or after a taint: nothing closes
            if where == SELECT and name in LEAVES_SELECT and not end_tag:
                found = stack.last(b"select")  # it closes the <select>, then opens in the body
                if found >= 0 and not stack.limit_after(found):
                    stack.close(found)
                elif found >= 0:
                    stack.unsure_from(found)
            elif where == SELECT and name in PIVOTS:
                # In a <select> in a table, a table's tag closes the select and acts on the table:
                # what the estimate holds open there is no longer sure.
                stack.doubt()
                if not end_tag:
                    implied = _implied_structure(stack, name)
                    if name not in VOID_B:
                        stack.push(name, implied or name not in _NOT_NESTING, sure=False)
            elif not end_tag and (
                name not in VOID_B
                or (
                    where == TAINTED
                    and name not in BREAKOUT
                    and not is_self_closing(data[start:end].rstrip(b">"))
                )
            ):
                # Counted as the parser may nest it: after a taint anything, void names too (in <svg>
                # or <math> a `<col>`, `<source>` or `<image>` is a foreign element, which nests;
                # those that leave foreign content, an `<img>`, a `<br>`, ..., are void there too);
                # in a <select> what it does not close itself, and formatting elements (re-created
                # outside when it closes).
                counted = where == TAINTED or name not in _NOT_NESTING  # (no formatting name is in it)
                if name == b"a" and where == TAINTED and point >= 0:
                    _island_a(stack, point)
                if name in FORMATTING:
                    # It joins the parser's list, which may drop an earlier one of the name from it
                    # (Noah's Ark): three island `<b>`s there drop the `<b>` open around the zone,
                    # and its end tag is ignored.
                    stack.note_formatting(name)
                if where == TAINTED:
                    _implied_structure(stack, name)  # (the row or cell counts there anyway)
                stack.push(name, counted, sure=False)
                if name in MARKERS:
                    stack.marker(False)
            if where == TAINTED or name == b"form":
                # (In a <select> this Lexbor builds a <form> and clears its pointer at a `</form>`.)
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
            most = max(most, stack.depth)
            if most > limit:
                break
            most = _table_run(stack, data, end, most, limit, skips, effects)
            continue
        elif name in VOID_B:
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
        elif name in ZONES:
            if is_self_closing(data[start:end].rstrip(b">")):
                continue  # `<svg/>` opens nothing
            _start_tag(stack, name, standards)
            zone = len(stack.entries) - 1
        elif name in FORMATTING:
            _start_tag(stack, name, standards, data[start + 1 + len(name) : end])
        else:
            _start_tag(stack, name, standards)
        if stack.depth > most:
            most = stack.depth
            if most > limit:
                break
    return most


def _island_a(stack: _OpenElements, point: int) -> None:
    """An `<a>` in an island of HTML (the integration point at `point`): with an `<a>` of the parser's
    list open around the zone, it runs the adoption agency for that one, which stops there (out of
    scope behind the point), then takes it off the stack, leaving what is above it open (`<a><svg>
    <desc><a></a></desc></svg><q>` x N nests a `<q>` a unit, which the next `<a>` does not pop)."""
    found = stack.last(b"a")
    if found < 0 or found >= point or stack.held(b"a"):
        return  # (a held one: it stays counted, and its end tag pops nothing sure)
    if not stack.markers_known or stack.marker_of(found) != stack.markers[-1]:
        return  # behind a marker: not on the list the parser looks at, and it stays
    if stack.maybe_off_list(found) or not stack.is_sure(found):
        stack.unsure_from(found)  # taken off the stack or not: nothing above it closes surely
    else:
        stack.remove(found, pops_above=False)


def _implied_structure(stack: _OpenElements, name: bytes) -> bool:
    """A row, cell or column read where the scan cannot follow the table (an unsure one, in a `<select>`,
    after a taint): the parser may open the section and row (or column group) it belongs in first, each
    a level (`<td><select><em><table>` x N nests six a unit, the estimate counted four). Pushed unsure
    and counted, by the table's structure last open as the model has it (which it does not pop there).
    True: it opens the table's or section's first row or cell (a level itself, then)."""
    family = stack.last_family()
    if family < 0 or name not in (b"td", b"th", b"tr", b"col"):
        return False
    kind = stack.name_at(family)
    if kind in (b"table", b"caption") or (kind == b"colgroup" and name != b"col"):
        if name == b"col":
            stack.push(b"colgroup", True, sure=False)
            return True
        stack.push(b"tbody", True, sure=False)
    elif kind not in _ROW_GROUPS:
        return False
    if name in _CELLS:
        stack.push(b"tr", True, sure=False)
    return True


def _close_p(stack: _OpenElements, *, sure: bool) -> None:
    """A start tag that closes a <p> in button scope (`sure`: surely does, in this mode)."""
    found = stack.last(b"p")
    if found >= 0 and not stack.limit_after(found, b"button"):
        if sure:
            stack.close(found)
        else:
            stack.unsure_from(found)


def _start_tag(stack: _OpenElements, name: bytes, standards: bool, key: bytes | None = None) -> None:
    """An HTML start tag (`key`: a formatting element's attributes, `note_formatting`)."""
    if name in CLOSES_P:
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
        if name in HEADINGS_B and stack.top() in HEADINGS_B:
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
            stack.note_formatting(name, key)
            stack.push(name, True, key=key)
            return
        if stack.held(name):
            # Popped since it opened (re-created or not: see release): an <a> runs the adoption agency
            # for the last one on the list, a <nobr> re-creates the ones held, then adopts the last; one
            # leaves, but behind a limit it stays, and this one nests.
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
    if name in FORMATTING:
        stack.note_formatting(name, key)
    # (A <p>, <li>, <button>, <option> too: popped where the parser pops them.)
    stack.push(name, True, key=key)
    if name in MARKERS:
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
            implied = _implied_structure(stack, name)
            if name != b"col":
                # (Counted where it opens a table's first row or cell: a cell after a cell may close
                # it, and unsure, the model pops none, so each counted, a data table's cells nested.)
                stack.push(name, implied, sure=False)
                if name in MARKERS:
                    stack.marker(False)
            return
        kind = stack.name_at(family)
        entry = stack.entries[family]
        assert entry is not None
        if kind in (b"td", b"th", b"caption") or (kind == b"colgroup" and name != b"col"):
            stack.popped(entry)
            stack.pop_from(family, fostered=True)  # closes it, then as in the table, row or section
            if kind != b"colgroup":
                stack.clear()
            continue
        if kind == b"colgroup":
            stack.pop_from(family + 1, hold_first=True, fostered=True)
            return
        if kind == b"tr" and name not in (b"td", b"th"):
            stack.popped(entry)
            stack.pop_from(family, fostered=True)  # closes the row
            continue
        if kind in _ROW_GROUPS and name not in (b"tr", b"td", b"th"):
            stack.popped(entry)
            stack.pop_from(family, fostered=True)  # closes the section
            continue
        # What is above the structure (a formatting element foster-parented right above the table too)
        # the parser pops and keeps on its list: text after the table re-creates it, and the next
        # table opens in it (`<b><td></table>x<table>` x N nests a level a unit).
        stack.popped(entry)  # (what is above it goes: all the parser re-created or dropped since it opened)
        stack.pop_from(family + 1, hold_first=True, fostered=True)
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
            if name in MARKERS:
                stack.marker(True)
        return
    stack.doubt()


# A table run: after a start tag of a table's structure, the rows, cells and sections that follow as
# plain markup (`TABLE_RUN`: text and their tags, nothing else) only pop and push the structure above the
# same <table>. Read tag by tag, a data table cost the model 2 s for 2 MB (Lexbor parses it in 30 ms);
# as the structure above the table (a "chain": `(b"tbody", b"tr", b"td")`), each chunk of tags is one
# lookup, and the stack changes once, at the run's end, exactly as tag by tag.
_Chain = tuple[bytes, ...]
# A chunk's effect from a chain: (the chain after it, the lowest it went, the longest it was after a tag,
# entries pushed, cells among them, walk steps spent, for each level of the chain after it from the lowest
# up: the count of pushes in the chunk up to the one that pushed it).
_ChunkEffect = tuple[_Chain, int, int, int, int, int, tuple[int, ...]]
_RUN_CHAINS = frozenset(
    {(), (b"colgroup",)}
    | {(group, *rest) for group in _ROW_GROUPS for rest in ((), (b"tr",), (b"tr", b"td"), (b"tr", b"th"))}
)


@functools.cache
def _run_step(chain: _Chain, tag: bytes) -> tuple[_Chain, int, int]:
    """What one tag of a run (a name, "/" first for an end tag) does to the chain above the table, as
    `_table_part` and `_table_end` do it there: (the chain after it, the lowest it went, walk steps)."""
    if tag[:1] == b"/":
        name = tag[1:]
        inside = _INSIDE.get(name, ())  # (`</col>` closes nothing: no col is open above the table)
        for steps, entry in enumerate(reversed((b"table", *chain))):
            if entry == name and name != b"table":
                low = len(chain) - 1 - steps
                return chain[:low], low, steps
            if entry not in inside:
                return chain, len(chain), steps
        raise AssertionError("a table run's end tag passed its table")
    opened = list(chain)
    low = len(opened)
    while True:  # (at most four rounds, as `_table_part`'s: a chain is three deep at most)
        kind = opened[-1] if opened else b"table"
        if (
            kind in _CELLS
            or (kind == b"colgroup" and tag != b"col")
            or (kind == b"tr" and tag not in _CELLS)
            or (kind in _ROW_GROUPS and tag not in (b"tr", *_CELLS))
        ):
            opened.pop()
            low = min(low, len(opened))
            continue
        if kind == b"colgroup":
            return chain, low, 0
        if kind == b"table":
            if tag == b"col":
                opened.append(b"colgroup")
            elif tag in (b"tr", *_CELLS):
                opened.append(b"tbody")
        if kind != b"tr" and tag in _CELLS:
            opened.append(b"tr")
        if tag != b"col":
            opened.append(tag)
        return tuple(opened), low, 0


def _chunk_effect(chain: _Chain, tags: tuple[bytes, ...]) -> _ChunkEffect:
    """What a chunk of a run's tags does to the chain (`_ChunkEffect`)."""
    low = longest = len(chain)
    pushes = cells = spent = 0
    pushed_at: dict[int, int] = {}
    for tag in tags:
        after, lowest, steps = _run_step(chain, tag)
        low = min(low, lowest)
        for level in range(lowest, len(after)):
            pushes += 1
            pushed_at[level] = pushes
            cells += after[level] in _CELLS
        spent += steps
        longest = max(longest, len(after))
        chain = after
    levels = tuple(pushed_at[level] for level in range(low, len(chain)))
    return chain, low, longest, pushes, cells, spent, levels


def _table_run(
    stack: _OpenElements,
    data: bytes,
    position: int,
    most: int,
    limit: int,
    skips: list[tuple[int, frozenset[bytes]]],
    effects: dict[tuple[_Chain, tuple[bytes, ...]], _ChunkEffect],
) -> int:
    """After a start tag of a table's structure (HTML content) that ends at `position`: the run of the
    table's plain structure markup that follows, applied to the stack at once (the estimate as tag by
    tag), and noted in `skips` for the tag scan. Returns the running maximum (`most`).

    Only where the tag-by-tag rules act on the structure alone: every entry above the table is part of
    it, surely open and counted, the parser's markers are known (a closed cell clears to its own), and
    no tag of the run can take the count past `limit`."""
    # The stack's conditions first, the run's scan last: a run scanned and then refused was scanned again
    # from each of its cells (a stray `<td>` x 20,000, 80 KB, took 17 s; a row `<template>` before a data
    # table, which leaves the markers unknown, made every later run quadratic). Scanned, a run is taken.
    if not stack.markers_known:
        return most
    entries = stack.entries
    top = len(entries) - 1
    table = top
    above: list[bytes] = []  # the names above the table, from the top
    while table >= 0 and top - table <= 3:
        entry = entries[table]
        if entry is None or not entry[3] or entry[1] <= stack.unsure:
            return most
        if entry[0] == b"table":
            break
        if not entry[2]:
            return most
        above.append(entry[0])
        table -= 1
    else:
        return most
    chain: _Chain = tuple(reversed(above))
    base = stack.depth - len(chain)
    if (
        chain not in _RUN_CHAINS
        or base + 3 > limit
        or (chain and chain[-1] in _CELLS and (stack.dangling[-1] or len(stack.dangling) < 2))
    ):
        return most
    # Each entry from the table up is live and of the table's structure, so `push` filed each on `family`,
    # which keeps no position past the top nor a removed one among live ones.
    assert stack.family[-len(chain) - 1 :] == list(range(table, top + 1)), "the structure is on `family`"
    run = TABLE_RUN.match(data, position)
    if run is None or run.end() == position:
        return most
    tags = TABLE_RUN_TAG.findall(data[position : run.end()].lower())
    stack.rebuilding(stack.serial)  # (its text may re-create formatting elements)
    start_chain = chain
    keep = longest = len(chain)
    serial = stack.serial
    cells = spent = 0
    pushed_at = [0, 0, 0]  # the serial each level of the chain was pushed at (from `keep` up)
    for index in range(0, len(tags), _RUN_CHUNK):
        chunk = tuple(tags[index : index + _RUN_CHUNK])
        effect = effects.get((chain, chunk))
        if effect is None:
            effect = effects[chain, chunk] = _chunk_effect(chain, chunk)
        after, low, chunk_longest, chunk_pushes, chunk_cells, chunk_spent, offsets = effect
        keep = min(keep, low)
        for level, offset in enumerate(offsets, low):
            pushed_at[level] = serial + offset
        serial += chunk_pushes
        cells += chunk_cells
        spent += chunk_spent
        longest = max(longest, chunk_longest)
        chain = after
    # The stack as tag by tag: the structure popped to the lowest level the run reached (the first cell
    # cleared its marker), then what is open at the end pushed with the serials and markers it had then.
    if keep < len(start_chain):
        stack.pop_from(table + 1 + keep)
        if start_chain[-1] in _CELLS:
            stack.clear()
    next_marker = stack.next_marker + cells
    for level in range(keep, len(chain)):
        stack.serial = pushed_at[level] - 1
        stack.push(chain[level], True)
        if chain[level] in _CELLS:
            stack.next_marker = next_marker - 1
            stack.marker(True)
    stack.serial = serial
    stack.next_marker = next_marker
    stack.spend(spent)
    skips.append((run.end(), frozenset(tag for tag in set(tags) if tag[:1] != b"/")))
    return max(most, base + longest)


def _end_tag(stack: _OpenElements, name: bytes, form_open: bool | None) -> None:
    if name in _TABLE_FAMILY:
        _table_end(stack, name)
    elif name in FORMATTING:
        if stack.held(name):
            stack.release(name)  # (nothing behind a scope limit: see there)
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
    elif name in HEADINGS_B:
        found = max(stack.last(heading) for heading in HEADINGS_B)
        if found >= 0 and not stack.limit_after(found):
            stack.close(found)
    elif (name in _SPECIAL_OPEN or name in _SCOPE_LIMITS) and name not in _FOREIGN_SPECIAL:
        if name in (b"body", b"html"):
            return
        found = stack.last(name)
        if found < 0:
            return
        more = (b"button",) if name == b"p" else (b"ol", b"ul") if name == b"li" else ()
        if not stack.limit_after(found, *more) and stack.close(found) and name in MARKERS:
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
    inside = _INSIDE.get(name, ())
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
