"""The HTML Standard's element categories that more than one pre-check uses (name sets, as lowercase bytes
where the tag scan compares them), and the limits of the parser's list of active formatting elements."""

from __future__ import annotations

# Elements the serialiser writes without an end tag (HTML void elements).
VOID = frozenset(
    {
        "area", "base", "basefont", "bgsound", "br", "col", "embed", "frame", "hr", "img", "input",
        "keygen", "link", "meta", "param", "source", "track", "wbr",
    }
)  # fmt: skip

# The HTML Standard's formatting elements but <a>, which the list holds once after its last marker (see
# `FORMATTING`): three copies of each, and every one with attributes, bound the list
# (`tags_with_attributes`, on lowercased bytes).
FORMATTING_NAMES = b"b big code em font i nobr s small strike strong tt u".split()
NOAHS_ARK = 3  # entries of one name and attributes the list keeps
ADOPTION_ROUNDS = 8  # the adoption agency's outer loop gives up after this many
# Elements that bound the parser's "in scope" (an end tag of a formatting element outside it is
# ignored).
SCOPE_BOUNDARIES = frozenset(
    b"""applet caption marquee object table td template th svg math desc foreignobject title
    mi mo mn ms mtext annotation-xml select""".split()
)  # a <select> ignores end tags but its own
# <a> is a formatting element too, of which the parser keeps one after the last marker: a new <a>
# takes the open one off the list (`reconstruction_bytes`). One <a> of 1,000 attributes left open was
# re-created in each of 60,000 paragraphs: 9.7 GB.
FORMATTING = frozenset((*FORMATTING_NAMES, b"a"))
# Start tags that, in a table, close its open cell or caption and then pop every element above the
# table (or its row group or row): those it holds, and those foster-parented out of it (`<table><b>`
# leaves the <b> on the list, and text in the table re-creates it), without clearing their markers.
TABLE_STARTS = frozenset(b"caption col colgroup tbody thead tfoot tr td th".split())
# End tags whose work in a table the estimate follows (`reconstruction_bytes`).
TABLE_ENDS = frozenset(b"table tbody thead tfoot tr td th caption template".split())
# Tags whose reading by the parser, where the scan cannot follow it (a <select>, a taint), may pop or
# insert a table, a cell or a marker the estimate then does not know of.
PIVOTS = TABLE_STARTS | TABLE_ENDS | {b"applet", b"marquee", b"object"}
# Start tags that close a <p> in button scope (<table> only in no-quirks mode, <form> only when no form
# is open: both handled apart).
CLOSES_P = frozenset(
    b"""address article aside blockquote center details dialog dir div dl fieldset figcaption figure footer
    header hgroup main menu nav ol p search section summary ul h1 h2 h3 h4 h5 h6 pre listing plaintext xmp
    li dd dt hr""".split()
)
# Boundaries that insert a marker in the list of active formatting elements: closing one clears the
# list up to it (each table cell of an old layout leaves its <font> open, and the next cell clears it).
MARKERS = frozenset(b"td th caption applet marquee object template".split())
HEADINGS_B = frozenset(b"h1 h2 h3 h4 h5 h6".split())
VOID_B = frozenset(name.encode() for name in VOID) | {b"image"}
