"""How often `decode_html` recovers a page's text when nothing declares its encoding, against
charset-normalizer's own guess, in one run.

    .venv/bin/python benchmarks/decoding.py --corpus ../shared/corpus

A crawler does not always pass the HTTP charset, and many legacy pages carry no `<meta charset>`: then the
bytes are all there is. Every corpus page is decoded as the service decodes it, its `<meta charset>` and
XML declarations are cut out, and the text is re-encoded in each legacy web encoding of its script's
family (windows-1252 and iso-8859-15 for a German page, windows-1250 and iso-8859-2 for a Czech one,
windows-1251 and KOI8-R for a Russian one, Shift_JIS and EUC-JP for a Japanese one, ...; the few
characters the encoding lacks become "?", as on a real legacy page). Each case is the whole page and its
first `--prefix` bytes (a short page). A case counts as recovered when the decoded text equals the text
read with the true encoding, character for character. The baseline decodes with charset-normalizer's
best guess alone (what a service that hands the bytes to the detector gets). Pages whose text is pure
ASCII are skipped: any reading recovers them.

A second table takes the case the corpus has too few of: an English page with a few words of another
script in it (`FEW_WORDS`: a Russian place name, a Chinese shop's "contact us", a Japanese product),
each word in the legacy encodings of its language, counted the same way.
"""

from __future__ import annotations

import argparse
import codecs
import json
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.options import run
from service.core.charset_detection import DETECT_SAMPLE_BYTES
from service.core.decoding import decode_html
from service.core.pages import iter_pages

# Legacy encodings of the web, by the script (and languages) they were made for, in the order a page's
# family is looked for: a page belongs to the first family that holds the most of its non-ASCII text.
FAMILIES: tuple[tuple[str, ...], ...] = (
    ("windows-1252", "iso-8859-15"),  # Western European
    ("windows-1250", "iso-8859-2"),  # Central European
    ("windows-1251", "koi8-r"),  # Cyrillic
    ("windows-1253",),  # Greek
    ("windows-1254",),  # Turkish
    ("windows-1257",),  # Baltic
    ("windows-1255",),  # Hebrew
    ("windows-1256",),  # Arabic
    ("cp874",),  # Thai
    ("shift_jis", "euc-jp"),  # Japanese
    ("gbk",),  # Chinese, simplified
    ("big5",),  # Chinese, traditional
    ("euc-kr",),  # Korean
)
ENCODINGS = tuple(e for family in FAMILIES for e in family)
MIN_COVERAGE = 0.95  # of the page's non-ASCII characters its family must hold (the rest become "?")
# Words an English page may carry in another script, by the legacy encoding they are written in.
FEW_WORDS: dict[str, tuple[str, ...]] = {
    "windows-1251": (
        "Москва", "Москву", "Россия", "привет", "Иван Петров", "ООО Ромашка", "Санкт-Петербург", "мир",
        "Киев", "книга", "Привет мир", "на русском языке", "Контакты", "Главная страница", "нет",
        "Добро пожаловать",
    ),
    "gbk": (
        "中国", "北京", "你好", "上海市", "中文", "欢迎", "网站首页", "联系我们", "关于我们", "产品中心",
        "新闻", "公司简介", "下载", "登录", "注册", "帮助", "价格", "地址", "电话", "深圳",
    ),
    "big5": (
        "台灣", "台北", "你好", "繁體中文", "首頁", "聯絡我們", "關於我們", "新聞", "公司", "香港", "登入",
        "價格",
    ),
    "shift_jis": (
        "日本", "東京", "こんにちは", "ありがとう", "日本語", "お問い合わせ", "カタカナ", "大阪", "会社概要",
        "ニュース",
    ),
    "euc-jp": (
        "日本", "東京", "こんにちは", "日本語", "お問い合わせ", "大阪", "会社概要", "ニュース", "ありがとう",
    ),
    "euc-kr": ("한국", "서울", "안녕하세요", "한국어", "문의하기", "회사소개", "뉴스", "부산", "로그인"),
}  # fmt: skip
_ENGLISH = "<html><body>" + (
    "<p>We spent the week walking around the old town and the river banks, looking at markets.</p>" * 8
)
_DECLARATION = re.compile(r"<meta\b[^>]*charset[^>]*>|<\?xml[^>]*>", re.IGNORECASE)


def native_family(text: str) -> tuple[str, ...] | None:
    """The legacy encodings a page like this was written in: the family holding most of its non-ASCII
    characters (the first such in `FAMILIES`), None when none holds `MIN_COVERAGE` of them."""
    chars = Counter(ch for ch in text if not ch.isascii())
    total = sum(chars.values())
    best, best_held = None, 0
    for family in FAMILIES:
        held = sum(n for ch, n in chars.items() if _encodable(ch, family[0]))
        if held > best_held:
            best, best_held = family, held
    return best if total and best_held / total >= MIN_COVERAGE else None


def _encodable(ch: str, encoding: str) -> bool:
    try:
        ch.encode(encoding)
    except UnicodeEncodeError:
        return False
    return True


def detector_only(data: bytes) -> str:
    """The baseline: charset-normalizer's best guess over the same sample, UTF-8 when it has none."""
    from charset_normalizer import from_bytes

    best = from_bytes(data[:DETECT_SAMPLE_BYTES]).best()
    return data.decode(best.encoding if best else "utf-8", errors="replace")


def ours(data: bytes) -> str:
    return decode_html(data).text


def few_words(decoders: dict[str, Callable[[bytes], str]]) -> None:
    """Print the second table: per encoding, how many `FEW_WORDS` pages each decoder recovers."""
    names = list(decoders)
    print("\n| encoding | words | " + " | ".join(names) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in names) + " |")
    totals = dict.fromkeys(names, 0)
    for encoding, words in FEW_WORDS.items():
        pages = [f"{_ENGLISH}<p>See {word} here.</p></body></html>" for word in words]
        counts = {
            name: sum(decode(page.encode(encoding)) == page for page in pages)
            for name, decode in decoders.items()
        }
        for name in names:
            totals[name] += counts[name]
        print(f"| {encoding} | {len(words)} | " + " | ".join(str(counts[n]) for n in names) + " |")
    total = sum(map(len, FEW_WORDS.values()))
    print(f"| all | {total} | " + " | ".join(f"**{totals[n]}**" for n in names) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", default="../shared/corpus", help="page collection (see iter_pages)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N pages")
    parser.add_argument("--prefix", type=int, default=2048, help="bytes of the short-page case")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()

    decoders: dict[str, Callable[[bytes], str]] = {
        "charset-normalizer alone": detector_only,
        "decode_html": ours,
    }
    # (encoding, size) -> decoder -> [recovered, cases]; wrong readings per decoder for the report.
    tally: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(lambda: {d: [0, 0] for d in decoders})
    wrong: dict[str, Counter[str]] = {d: Counter() for d in decoders}
    seconds = dict.fromkeys(decoders, 0.0)
    pages = 0
    for page in iter_pages(args.corpus, limit=args.limit):
        text = _DECLARATION.sub("", decode_html(page.html).text)
        if text.isascii():
            continue
        pages += 1
        family = native_family(text)
        if family is None:
            continue
        for encoding in family:
            codec = codecs.lookup(encoding).name
            data = text.encode(codec, errors="replace")  # what a legacy page could hold of it
            for size, chunk in (("page", data), ("prefix", data[: args.prefix])):
                truth = chunk.decode(codec, errors="replace")
                if truth.isascii():
                    continue
                for name, decode in decoders.items():
                    start = time.perf_counter()
                    result = decode(chunk)
                    seconds[name] += time.perf_counter() - start
                    ok = result == truth
                    tally[(encoding, size)][name][0] += ok
                    tally[(encoding, size)][name][1] += 1
                    if not ok:
                        wrong[name][encoding] += 1

    names = list(decoders)
    print(f"{pages} pages with non-ASCII text; a case is recovered when the text matches exactly\n")
    print("| encoding | case | cases | " + " | ".join(names) + " |")
    print("| --- | --- | ---: | " + " | ".join("---:" for _ in names) + " |")
    totals = {name: [0, 0] for name in names}
    for (encoding, size), row in sorted(tally.items(), key=lambda kv: (ENCODINGS.index(kv[0][0]), kv[0][1])):
        cases = row[names[0]][1]
        cells = []
        for name in names:
            ok, n = row[name]
            totals[name][0] += ok
            totals[name][1] += n
            cells.append(f"{100 * ok / n:.1f}%")
        print(f"| {encoding} | {size} | {cases} | " + " | ".join(cells) + " |")
    cells = [f"**{100 * ok / max(n, 1):.1f}%**" for ok, n in totals.values()]
    print(f"| all | | {totals[names[0]][1]} | " + " | ".join(cells) + " |")
    base, new = (totals[n][0] / max(totals[n][1], 1) for n in names)
    failed_base, failed_new = (1 - base), (1 - new)
    print(
        f"\nrecovered: {100 * new:.1f}% vs {100 * base:.1f}% (detector alone); cases lost: "
        f"{failed_new / failed_base if failed_base else 0:.2f}x the detector's"
    )
    print("seconds: " + ", ".join(f"{n} {seconds[n]:.1f}" for n in names))
    few_words(decoders)
    if args.json:
        figures = {
            "pages": pages,
            "cases": {f"{e}/{s}": row for (e, s), row in tally.items()},
            "totals": totals,
            "seconds": seconds,
            "wrong_by_encoding": {n: dict(c) for n, c in wrong.items()},
        }
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
