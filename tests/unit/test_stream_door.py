"""The gateway's side of a stream event, pure parts: how it is logged, what its result and dead letter hold."""

from __future__ import annotations

import orjson

from serving.gateway.streaming import _dead, _one_prediction, _reason, logged_inputs
from serving.streams.broker import Entry


def test_an_event_is_logged_as_one_dataframe_records_row_numbers_as_numbers():
    logged = orjson.loads(
        logged_inputs({"customer_id": "17", "amount": "250.5", "note": "card present", "flag": "true", "zip": "NaN"})
    )
    assert logged == {
        "dataframe_records": [
            {"customer_id": 17, "amount": 250.5, "note": "card present", "flag": "true", "zip": "NaN"}
        ]
    }


def test_the_prediction_of_a_one_row_answer_is_its_one_element():
    assert _one_prediction(b"[0.25]") == b"0.25"
    assert _one_prediction(b"[[0.9,0.1]]") == b"[0.9,0.1]"
    assert _one_prediction(b'[{"label":1}]') == b'{"label":1}'


def test_a_dead_letter_keeps_the_fields_and_its_own_event_id_and_reason_win():
    entry = Entry("5-0", {b"amount": b"x", b"reason": b"from the producer"})
    letter = _dead(
        entry,
        _reason(b'{"error_code": "INVALID_PARAMETER_VALUE", "message": "event field \\"amount\\" must be a double"}'),
    )
    assert letter.dead and letter.event_id == "5-0"
    assert letter.fields == {
        b"amount": b"x",
        b"event_id": b"5-0",
        b"reason": b'INVALID_PARAMETER_VALUE: event field "amount" must be a double',
    }
    assert _reason(b"not json") == "INTERNAL_ERROR: the model failed on this event"
