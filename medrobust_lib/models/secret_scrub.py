"""Remove a secret (an API key) from text a library or a server may print, in every form it may take.

A key reaches an error message not only verbatim: h11 prints a refused header as a bytes repr
(``Illegal header value b'Bearer sk-...\\r'``), exceptions are repr'd (``\\r`` becomes ``\\\\r``,
non-ASCII becomes ``\\xe9``), JSON escapes it, a URL percent-encodes it, a server may echo only its
first characters or wrap it across lines. :class:`SecretScrubber` replaces, with ``***``:

* every printed form of the key (:func:`key_forms`: raw, JSON-escaped, ``repr`` of the string and
  of its UTF-8 bytes, twice-escaped, ``unicode_escape``, URL-encoded with ``%XX`` in either case
  and ``+`` for a space);
* every run of at least ``min_piece`` (12) consecutive characters of any of those forms, so a
  prefix, a suffix or an inner piece of the key, and each line of a key split across lines, go too.

The search is linear in the text: each form is cut into aligned ``n``-grams (``n = (min_piece +
1) // 2``); any run of ``min_piece`` characters of a form contains one of them, so only their
occurrences are extended (left and right, along the form) to the whole run.

Not covered: a key transformed otherwise (base64, hashed, reversed) or cut into pieces shorter
than ``min_piece``.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from typing import TypeVar

MIN_PIECE = 12
"""Shortest run of a key's characters that is removed on its own (shorter keys: the whole key)."""

MASK = "***"

_T = TypeVar("_T", str, bytes)


def key_forms(key: str) -> set[str]:
    """The ways ``key`` may be printed: raw, JSON-escaped, ``repr`` of the str and of its UTF-8
    bytes, those escaped once more (a repr of a message holding a repr), ``unicode_escape``, and
    URL-encoded (``quote``, ``quote_plus``, lower-case ``%xx``)."""
    if not key:
        return set()
    utf8 = key.encode("utf-8", "surrogatepass")
    once = {key, json.dumps(key)[1:-1], json.dumps(key, ensure_ascii=False)[1:-1], repr(key)[1:-1],
            repr(utf8)[2:-1], key.encode("unicode_escape").decode("ascii")}
    forms = set(once)
    for f in once:
        forms.add(repr(f)[1:-1])
        forms.add(json.dumps(f)[1:-1])
    for quoted in (urllib.parse.quote(utf8, safe=""), urllib.parse.quote_plus(utf8, safe=""),
                   urllib.parse.quote(utf8)):
        forms.add(quoted)
        forms.add(re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quoted))
    return {f for f in forms if f}


class SecretScrubber:
    """Replaces every form of one secret, and every ``min_piece``+ run of one, with ``***``."""

    def __init__(self, secret: str, min_piece: int = MIN_PIECE) -> None:
        self._str_forms = sorted(key_forms(secret), key=len, reverse=True)
        self._bytes_forms = [f.encode("utf-8", "surrogatepass") for f in self._str_forms]
        self._min_piece = max(1, min_piece)

    def text(self, text: str) -> str:
        """``text`` with the secret's forms and pieces replaced."""
        return _scrub(text, self._str_forms, self._min_piece, MASK) if self._str_forms else text

    def bytes_(self, raw: bytes) -> bytes:
        """The same for raw bytes (a response body, before it is decoded or parsed)."""
        return _scrub(raw, self._bytes_forms, self._min_piece, MASK.encode()) if self._bytes_forms else raw


def _scrub(text: _T, forms: list[_T], min_piece: int, mask: _T) -> _T:
    spans: list[tuple[int, int]] = []
    for form in forms:
        spans.extend(_runs(text, form, min(min_piece, len(form))))
    if not spans:
        return text
    spans.sort()
    merged: list[list[int]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    parts: list[_T] = []
    pos = 0
    for a, b in merged:
        parts.append(text[pos:a])
        parts.append(mask)
        pos = b
    parts.append(text[pos:])
    return text[:0].join(parts)


def _runs(text: _T, form: _T, need: int) -> list[tuple[int, int]]:
    """Spans of ``text`` that equal a run of at least ``need`` consecutive items of ``form``."""
    n = max(1, (need + 1) // 2)  # any run of `need` items holds an n-gram aligned at a multiple of n
    spans: list[tuple[int, int]] = []
    for start in range(0, max(1, len(form) - n + 1), n):
        gram = form[start:start + n]
        if len(gram) < n:
            break
        at = text.find(gram)
        while at != -1:
            lo_t, lo_f = at, start
            while lo_t > 0 and lo_f > 0 and text[lo_t - 1:lo_t] == form[lo_f - 1:lo_f]:
                lo_t, lo_f = lo_t - 1, lo_f - 1
            hi_t, hi_f = at + n, start + n
            while hi_t < len(text) and hi_f < len(form) and text[hi_t:hi_t + 1] == form[hi_f:hi_f + 1]:
                hi_t, hi_f = hi_t + 1, hi_f + 1
            if hi_t - lo_t >= need:
                spans.append((lo_t, hi_t))
            at = text.find(gram, at + 1)
    return spans
