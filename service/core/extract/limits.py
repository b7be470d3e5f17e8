"""Structural limits checked before an extractor sees a page, so a pathological page costs no worker time.

Each extractor's time grows with a few structural counts of the page, measured on generated pages
(tables and method in docs/extraction.md, "Pathological pages"):

- **tags** (start tags): every extractor does a fixed amount of work per element. trafilatura takes
  20-50 µs per tag on real and generated pages alike (1 MB of `<br>` or `<p>x`, 200,000 tags, took
  4-10 s), jusText 15-25 µs, resiliparse 1.5-2.5 µs.
- **nesting work** (depth x tags): each element's work also grows with the elements open around it.
  resiliparse (main content) takes about 80 ns per unit: 16,700 nested `<div>x` (100 KB) took 12.7 s;
  trafilatura and jusText about 650 ns: 250 nested `<div>`s followed by 100 KB of `<p>x` took each of
  them 3-4 s. jusText's language detection runs resiliparse's plain-text mode on the whole page, which
  is quadratic in nested lists (111,000 nested `<ul><li>` ran past 30 s): the same count bounds it.
- **cells in one table row** (trafilatura only): its table code is quadratic in them (20,000 `<td>`
  in one row, 100 KB, took 1.3 s; 200,000 ran past 30 s).

The depth is the pruner's linear-time estimate (`service.core.precheck.nesting.estimate_depth`, the nesting an
HTML5 tree builder such as resiliparse's Lexbor builds). trafilatura and jusText parse with libxml2,
which also nests `<thead>`, `<tfoot>`, `<caption>`, `<nobr>`, `<button>`, `<embed>` and `<wbr>` (an
HTML5 parser closes or never opens them): their nesting is added for those two. Every count is
computed once per page, and only when the cheaper bound before it (`<` count, then tags squared)
does not already clear the limit, so an ordinary page costs one or two `str.count` calls.

The limits sit at about a second of work for each extractor at the slowest rate measured, and at 5x
(tags for trafilatura and jusText) to 200x the largest count of the 1,033 corpus pages. A page over
a limit gets `PageTooComplexError`, an `ExtractionError` like any other failure of that extractor: the
union skips it and tries the next one.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final

from service.core.extract.extractors import JUSTEXT, RESILIPARSE, TRAFILATURA
from service.core.extract.pool import ExtractionError
from service.core.precheck.nesting import estimate_depth


class PageTooComplexError(ExtractionError):
    """An extractor refused a page before running: its structure predicts seconds of work."""


@dataclass(frozen=True)
class ExtractorLimits:
    """What one extractor accepts: start tags, depth x tags, and (when set) table cells in one row."""

    max_tags: int
    max_nesting_work: int
    max_row_cells: int | None = None
    libxml2: bool = False  # nesting as libxml2's HTML parser builds it (see the module docstring)


# At the slowest rate measured: resiliparse 500,000 tags x 2.5 µs = 1.3 s, 10^7 x 80-90 ns = 0.9 s;
# trafilatura 50,000 tags x 20-50 µs = 1-2.5 s, jusText 50,000 x 15-25 µs = 1 s, and 2 x 10^6 x
# 650 ns = 1.3 s for both; 5,000 cells in a row take trafilatura 0.1 s. Corpus maxima: 10,138 tags,
# depth x tags 126,984, 24 cells in a row.
LIMITS: Final[dict[str, ExtractorLimits]] = {
    RESILIPARSE: ExtractorLimits(max_tags=500_000, max_nesting_work=10_000_000),
    TRAFILATURA: ExtractorLimits(
        max_tags=50_000, max_nesting_work=2_000_000, max_row_cells=5_000, libxml2=True
    ),
    JUSTEXT: ExtractorLimits(max_tags=50_000, max_nesting_work=2_000_000, libxml2=True),
}

# The elements libxml2 nests where an HTML5 parser does not. A name ends at HTML whitespace, "/" or
# ">", as in the pruner's scan.
_LIBXML2_NAMES = ("thead", "tfoot", "caption", "nobr", "button", "embed", "wbr")
_NAME_END = r"(?=[\t\n\f\r />])"
# Table structure, for the cells of one row: a `<tr>` starts a row, a nested table has rows of its own;
# `</table>` matters only inside a table, and `</tr>`, `</td>`, `</th>` never do.
_TABLE_START = re.compile(rf"<(table|tr|td|th){_NAME_END}", re.IGNORECASE)
_TABLE_START_OR_END = re.compile(rf"<(?:(table|tr|td|th)|/(table)){_NAME_END}", re.IGNORECASE)


@functools.cache
def _libxml2_tags(open_names: frozenset[str]) -> re.Pattern[str]:
    """Start tags of libxml2's extra nesting elements, and end tags of those in `open_names`.

    An end tag of an element none of which is open changes nothing, so it is not even matched: the
    scan then takes one step per start tag and one per end tag that closes one, not one per end tag
    (a 16 MiB page of `</wbr>` after a few thousand tags held 364 MB of matches and took 0.9 s of the
    server's thread). A name matched through Unicode case folding ("captıon") is not one of ours and
    has every end tag matched, as all were before.
    """
    ends = sorted(open_names) if open_names <= frozenset(_LIBXML2_NAMES) else _LIBXML2_NAMES
    end_tags = f"|/({'|'.join(ends)})" if ends else ""
    return re.compile(rf"<(?:({'|'.join(_LIBXML2_NAMES)}){end_tags}){_NAME_END}", re.IGNORECASE)


class PageShape:
    """The structural counts of one decoded page, each computed on first use and kept."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._lt: int | None = None
        self._tags: int | None = None
        self._depths: dict[int, int] = {}
        self._libxml2_depth: int | None = None
        self._row_cells: dict[int, int] = {}

    @property
    def lt(self) -> int:
        """The number of `<`: an upper bound of the tags, at the cost of one `str.count`."""
        if self._lt is None:
            self._lt = self._text.count("<")
        return self._lt

    @property
    def tags(self) -> int:
        """Start tags, counted as every `<` but those of end tags (comments and `<` in scripts count too)."""
        if self._tags is None:
            self._tags = self.lt - self._text.count("</")
        return self._tags

    def depth(self, limit: int) -> int:
        """The HTML5 nesting depth if it is at most `limit`, else a number above `limit`."""
        if limit not in self._depths:
            self._depths[limit] = estimate_depth(self._text, limit=limit)
        return self._depths[limit]

    @property
    def libxml2_extra_depth(self) -> int:
        """The deepest nesting of the elements only libxml2 nests (an end tag counts when one is open)."""
        if self._libxml2_depth is None:
            open_elements: dict[str, int] = {}
            depth = most = 0
            position = 0
            while match := _libxml2_tags(frozenset(open_elements)).search(self._text, position):
                position = match.end()
                start = match.group(1)
                if start is not None:
                    name = start.lower()
                    open_elements[name] = open_elements.get(name, 0) + 1
                    depth += 1
                    most = max(most, depth)
                elif open_elements.get(name := match.group(2).lower()):
                    open_elements[name] -= 1
                    if not open_elements[name]:
                        del open_elements[name]  # its end tags no longer matter
                    depth -= 1
            self._libxml2_depth = most
        return self._libxml2_depth

    def row_cells(self, limit: int) -> int:
        """The most `<td>`/`<th>` in one table row (cells before any `<tr>` join the table's first row)
        if at most `limit`, else a number above `limit`."""
        if limit not in self._row_cells:
            rows = [0]  # the current row's cells, per open table (the outermost entry: outside tables)
            most = 0
            position = 0
            while True:
                pattern = _TABLE_START_OR_END if len(rows) > 1 else _TABLE_START
                match = pattern.search(self._text, position)
                if match is None:
                    break
                position = match.end()
                name = match.group(1)
                if name is None:  # </table>
                    rows.pop()
                    continue
                name = name.lower()
                if name == "table":
                    rows.append(0)
                elif name == "tr":
                    rows[-1] = 0
                else:
                    rows[-1] += 1
                    if rows[-1] > most:
                        most = rows[-1]
                        if most > limit:
                            break
            self._row_cells[limit] = most
        return self._row_cells[limit]


def check_page(name: str, shape: PageShape) -> None:
    """Raise `PageTooComplexError` when the page is over one of `name`'s limits; cheapest checks first."""
    limits = LIMITS[name]
    if shape.lt > limits.max_tags and shape.tags > limits.max_tags:
        raise PageTooComplexError(
            f"{name} refused the page: it has {shape.tags:,} tags, over the {limits.max_tags:,} that "
            f"{name} handles in about a second"
        )
    # Nesting work: depth <= tags, so a page whose tags squared clear the limit needs no depth.
    work_limit = limits.max_nesting_work
    if shape.lt**2 > work_limit and shape.tags**2 > work_limit:
        tags = shape.tags
        depth_limit = work_limit // tags
        depth = shape.depth(depth_limit)
        if limits.libxml2 and depth <= depth_limit:
            depth += shape.libxml2_extra_depth
        if depth > depth_limit:
            raise PageTooComplexError(
                f"{name} refused the page: it nests over {depth_limit:,} elements deep with {tags:,} tags; "
                f"{name}'s work grows with depth x tags, and over {work_limit:,} take it more than a second"
            )
    cell_limit = limits.max_row_cells
    if (
        cell_limit is not None
        and shape.lt > cell_limit
        and shape.tags > cell_limit
        and shape.row_cells(cell_limit) > cell_limit
    ):
        raise PageTooComplexError(
            f"{name} refused the page: a table row has over {cell_limit:,} cells, and {name}'s table "
            f"handling is quadratic in them"
        )
