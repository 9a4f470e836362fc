"""Payload redaction: card numbers and e-mail addresses, found and replaced before a payload is logged.

The AI gateway's ``inference_table_config.redact`` names the patterns to apply to request and
response payloads before the inference-log record is written, so that the log holds no card numbers
or addresses. Both finders run in linear time on any input (payloads are caller-controlled):

* ``card_number``: 13 to 19 digits, optionally grouped by single spaces or dashes, that pass the
  Luhn check. A regex finds each run of digit groups; the groups are then tried left to right, longest
  first, so a card number next to other digits (a date, an order number) is still found, while order
  numbers and timestamps that fail Luhn are kept.
* ``email``: a pragmatic ``local@domain.tld``: RFC 5322's dot-atom characters in the local part (at
  most 64), dot-separated labels, and a letters-only top-level domain.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

PATTERNS = ("card_number", "email")

_CARD_MIN_DIGITS, _CARD_MAX_DIGITS = 13, 19
# A maximal run of digit groups joined by single spaces or dashes; each repetition consumes a digit,
# so the match is linear and unambiguous.
_DIGIT_RUN = re.compile(r"\d+(?:[ -]\d+)*")
_DIGITS = re.compile(r"\d+")
# The lookbehind lets a local part start only where one can begin, so a long run of local-part
# characters without "@" is scanned once rather than once per position.
_EMAIL = re.compile(
    r"(?<![A-Za-z0-9.!#$%&'*+/=?^_`{|}~-])"
    r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}"
    r"@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,63}"
    r"(?![A-Za-z0-9-])"
)


_DOUBLED = (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)  # a digit doubled, its digits summed (Luhn)


def _luhn_sums(digits: str) -> tuple[list[int], list[int]]:
    """Prefix sums for the Luhn check of any slice in O(1): ``even[k]`` sums digits[:k] with the digits
    at odd positions doubled, ``odd[k]`` with those at even positions doubled. A slice ending at
    position b-1 doubles every second digit counting left from b-1, so it uses ``even`` when b-1 is even."""
    even, odd = [0], [0]
    for k, char in enumerate(digits):
        value = ord(char) - 48
        plain_if_even, plain_if_odd = (value, _DOUBLED[value]) if k % 2 == 0 else (_DOUBLED[value], value)
        even.append(even[-1] + plain_if_even)
        odd.append(odd[-1] + plain_if_odd)
    return even, odd


def _card_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each card number: within each run of digit groups, the longest Luhn-valid
    sequence of whole groups with 13 to 19 digits, left to right."""
    spans: list[tuple[int, int]] = []
    for run in _DIGIT_RUN.finditer(text):
        if run.end() - run.start() < _CARD_MIN_DIGITS:
            continue
        groups = [m.span() for m in _DIGITS.finditer(text, run.start(), run.end())]
        digits = "".join(text[start:end] for start, end in groups)
        if len(digits) < _CARD_MIN_DIGITS:
            continue
        even, odd = _luhn_sums(digits)
        bounds = [0]  # bounds[i]: index in ``digits`` where group i starts; bounds[i + 1], where it ends
        for start, end in groups:
            bounds.append(bounds[-1] + end - start)
        i = 0
        while i < len(groups):
            last = None
            for j in range(i, len(groups)):
                a, b = bounds[i], bounds[j + 1]
                if b - a > _CARD_MAX_DIGITS:
                    break
                sums = even if (b - 1) % 2 == 0 else odd
                if b - a >= _CARD_MIN_DIGITS and (sums[b] - sums[a]) % 10 == 0:
                    last = j
            if last is None:
                i += 1
                continue
            spans.append((groups[i][0], groups[last][1]))
            i = last + 1
    return spans


def _email_spans(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in _EMAIL.finditer(text)]


_FINDERS: dict[str, Callable[[str], list[tuple[int, int]]]] = {"card_number": _card_spans, "email": _email_spans}


def _selected(patterns: Iterable[str]) -> list[str]:
    """The requested pattern names in PATTERNS order; TypeError/ValueError on a bad request."""
    if isinstance(patterns, str):
        raise TypeError("patterns must be an iterable of pattern names, not one string")
    wanted = set(patterns)
    unknown = wanted - set(PATTERNS)
    if unknown:
        raise ValueError(f"{len(unknown)} unknown redaction pattern name(s); known: {', '.join(PATTERNS)}")
    return [name for name in PATTERNS if name in wanted]


def find(text: str, patterns: Iterable[str] = PATTERNS) -> list[str]:
    """Names of the patterns found in ``text``, in PATTERNS order."""
    return [name for name in _selected(patterns) if _FINDERS[name](text)]


def redact(text: str, patterns: Iterable[str] = PATTERNS) -> str:
    """``text`` with each match replaced by ``[REDACTED:<name>]``.

    Matches are found on the original text; where two overlap, the one starting first (then the
    longer) wins, so the result does not depend on the order the patterns are given in.
    """
    matches = sorted(
        ((start, -(end - start), name) for name in _selected(patterns) for start, end in _FINDERS[name](text))
    )
    out: list[str] = []
    position = 0
    for start, negative_length, name in matches:
        if start < position:
            continue
        out.append(text[position:start])
        out.append(f"[REDACTED:{name}]")
        position = start - negative_length
    out.append(text[position:])
    return "".join(out)
