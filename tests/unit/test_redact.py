"""Payload redaction: Luhn-valid card numbers and e-mail addresses go, everything else stays."""

from __future__ import annotations

import pytest

from serving.generative.redact import PATTERNS, find, redact

VISA = "4111111111111111"
MASTERCARD = "5555555555554444"
AMEX = "378282246310005"  # 15 digits, 4-6-5 groups


@pytest.mark.parametrize(
    "number",
    [
        "4111 1111 1111 1111",
        "4111-1111-1111-1111",
        "5555 5555 5555 4444",
        "5555-5555-5555-4444",
        VISA,
        MASTERCARD,
        "3782 822463 10005",
    ],
)
def test_card_numbers_grouped_by_spaces_or_dashes_are_redacted(number):
    text = f"my card is {number}, thanks"
    assert redact(text) == "my card is [REDACTED:card_number], thanks"
    assert find(text) == ["card_number"]


def test_a_sixteen_digit_number_failing_luhn_is_kept():
    for text in ("order 4111111111111112 shipped", "ts 1700000000000002", "id 1234-5678-9012-3456"):
        assert redact(text) == text
        assert find(text) == []


def test_numbers_too_short_or_too_long_for_a_card_are_kept():
    assert redact("pin 411111111111") == "pin 411111111111"  # 12 digits
    twenty = "4111111111111111" + "0000"  # 20 digits in one group
    assert redact(f"n {twenty}") == f"n {twenty}"


def test_a_card_next_to_other_digit_groups_is_still_found():
    text = f"2024-01-15 {VISA[:4]} {VISA[4:8]} {VISA[8:12]} {VISA[12:]} ok"
    out = redact(text)
    assert VISA[12:] not in out and "[REDACTED:card_number]" in out


def test_double_spaces_do_not_join_groups():
    assert redact("1234  5678  9012  3456") == "1234  5678  9012  3456"


@pytest.mark.parametrize(
    "address", ["jane.doe@example.com", "first+tag@mail.example.co.uk", "o'brien_x-y@sub-domain.example.org"]
)
def test_email_addresses_are_redacted(address):
    text = f"write to <{address}> today."
    assert redact(text) == "write to <[REDACTED:email]> today."
    assert find(text) == ["email"]


def test_text_without_matches_is_unchanged():
    text = "Hello @team, version 1.2.3 ships at 10:30; see a@b (no domain) and 2024-05-01."
    assert redact(text) == text
    assert find(text) == []


def test_both_patterns_in_one_text_are_found_in_patterns_order():
    text = f"mail bob@example.com card {MASTERCARD}"
    assert find(text) == ["card_number", "email"]
    assert redact(text) == "mail [REDACTED:email] card [REDACTED:card_number]"


def test_only_the_selected_patterns_apply():
    text = f"bob@example.com {VISA}"
    assert redact(text, ["email"]) == f"[REDACTED:email] {VISA}"
    assert redact(text, ("card_number",)) == "bob@example.com [REDACTED:card_number]"
    assert redact(text, ()) == text
    assert find(text, ["email"]) == ["email"]


def test_an_unknown_pattern_name_is_refused_without_echoing_it():
    with pytest.raises(ValueError) as caught:
        redact("x", ["ssn-secret"])
    assert "ssn-secret" not in str(caught.value)
    with pytest.raises(TypeError):
        redact("x", "email")


@pytest.mark.parametrize(
    "adversarial",
    [
        "a" * 100_000,
        "a@" * 50_000,
        "x@" + "a." * 50_000 + "1",
        "a." * 50_000,
        "-" * 100_000 + "@",
        "1 " * 50_000,
        "1-" * 50_000,
        "4" * 100_000,
        "4111 " * 20_000,
    ],
)
def test_adversarial_100kb_inputs_complete(adversarial):
    assert len(adversarial) >= 100_000
    out = redact(adversarial)
    assert isinstance(out, str)
    assert isinstance(find(adversarial), list)


def test_patterns_are_the_documented_names():
    assert PATTERNS == ("card_number", "email")
