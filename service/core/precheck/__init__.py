"""Pre-parse checks: cheap estimates that let `service.core.prune` refuse a hostile page before Lexbor
parses it (a page the parser would take minutes or gigabytes for).

The estimators are pure (each returns a number, in linear time); `service.core.prune` compares the
numbers with its caps and memory budget and raises its errors. The modules, lowest first:

- `elements`: the HTML Standard's element categories the checks share (void and formatting elements,
  scope boundaries, markers, a table's tags, ...).
- `tags`: reading a page's tags as the HTML tokenizer does (`tag_tokens`), and the regexes for a tag's
  attributes.
- `memory`: what Lexbor's tree takes per tag, per attribute and per re-created element.
- `attributes`: the most attributes one element has (`max_attributes`), all the page's
  (`count_attributes`), those the parser merges into `<html>` and `<body>`, and the cheap bound of the
  list of active formatting elements (`tags_with_attributes`).
- `reconstruction`: the memory of the elements the parser re-creates from formatting elements left
  open (`reconstruction_bytes`).
- `nesting`: the nesting depth (`estimate_depth`), following the parser's stack of open elements.
- `names`: the steps Lexbor's lookups of tag and attribute names take in its fixed-size hash tables
  (`estimate_name_lookups`: names sharing a bucket).
- `text_growth`: the copies Lexbor makes of text nodes it grows in many pieces (text foster-parented
  out of a table, text split by tags that make no node but carry attributes: `text_growth_memory`).
"""
