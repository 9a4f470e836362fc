"""A replica's runtime on a real MLflow model: the numpy fast path gives pyfunc's predictions, anything it
cannot take falls back to pyfunc (and its errors), batches split back per request, and the replica app
answers an envelope item by item and refuses callers without its token."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import orjson
import pandas as pd
import pytest
from fastapi.testclient import TestClient

from serving.features.reader import ServiceLayout, check_request_frame
from serving.protocol import wire
from serving.protocol.errors import ApiError
from serving.protocol.events import EVENT_CONTENT_TYPE, parse_event
from serving.protocol.scoring import parse_scoring_request
from serving.protocol.wire import BUSY_HEADER
from serving.replica_server.app import create_replica_app
from serving.replica_server.runtime import ModelRuntime
from serving.replica_server.scoring import score_envelope, score_one
from tests.models import RowCostModel

COLUMNS = [f"f{i}" for i in range(6)]
SLEEP_PER_ROW_S = 0.05


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    import mlflow
    from mlflow.models import infer_signature
    from sklearn.ensemble import GradientBoostingClassifier

    home = tmp_path_factory.mktemp("replica-runtime")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{home}/mlflow.db")
    rng = np.random.default_rng(7)
    X = pd.DataFrame(rng.normal(size=(500, 6)), columns=COLUMNS)
    y = (X.f0 + X.f1 > 0).astype(int)
    model = GradientBoostingClassifier(n_estimators=20, max_depth=2, random_state=0).fit(X, y)
    experiment = mlflow.create_experiment("runtime", artifact_location=str(home / "artifacts"))
    uris = {}
    with mlflow.start_run(experiment_id=experiment):
        info = mlflow.sklearn.log_model(
            model,
            name="numeric",
            signature=infer_signature(X, model.predict_proba(X)),
            input_example=X.iloc[:3],
            pyfunc_predict_fn="predict_proba",
            serialization_format="cloudpickle",
            pip_requirements=["scikit-learn"],  # given: MLflow would load the model in a process to infer them
        )
        uris["numeric"] = info.model_uri
        Xi = X.round().astype("int64")
        info = mlflow.sklearn.log_model(
            model,
            name="integers",
            signature=infer_signature(Xi, model.predict(Xi)),
            input_example=Xi.iloc[:3],
            serialization_format="cloudpickle",
            pip_requirements=["scikit-learn"],  # given: MLflow would load the model in a process to infer them
        )
        uris["integers"] = info.model_uri
        frame = pd.DataFrame({"x": [1.0]})
        info = mlflow.pyfunc.log_model(
            name="sleepy",
            python_model=RowCostModel(SLEEP_PER_ROW_S),
            pip_requirements=["mlflow"],
            signature=infer_signature(frame, [2.0]),
            input_example=frame,
        )
        uris["sleepy"] = info.model_uri
        uris["mixed"] = _log_mixed(X, y)
    uris["home"] = str(home)
    yield uris  # the runs' URIs are runs:/..., resolved against this tracking URI
    mlflow.set_tracking_uri(previous)


def _log_mixed(X: pd.DataFrame, y: pd.Series) -> str:
    """A pipeline with a scaler and a one-hot string column, logged with a signature and no input example."""
    import mlflow
    from mlflow.models import infer_signature
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import GradientBoostingClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    mixed = X.iloc[:, :5].assign(cat=np.where(X.f5 > 0, "a", "b"))
    prep = ColumnTransformer(
        [("num", StandardScaler(), COLUMNS[:5]), ("cat", OneHotEncoder(handle_unknown="ignore"), ["cat"])]
    )
    pipeline = Pipeline(
        [("prep", prep), ("gbdt", GradientBoostingClassifier(n_estimators=20, max_depth=2, random_state=0))]
    )
    pipeline.fit(mixed, y)
    info = mlflow.sklearn.log_model(
        pipeline,
        name="mixed",
        signature=infer_signature(mixed, pipeline.predict(mixed)),
        serialization_format="cloudpickle",
        pip_requirements=["scikit-learn"],  # given: MLflow would load the model in a process to infer them
    )
    return info.model_uri


MIXED = [*COLUMNS[:5], "cat"]


def load(models: dict[str, str], which: str) -> ModelRuntime:
    return ModelRuntime.load(models[which], Path(models["home"]))


def parse(doc: object):  # type: ignore[no-untyped-def]
    return parse_scoring_request(json.dumps(doc).encode(), "application/json")


def test_the_numpy_path_gives_pyfunc_predictions_for_every_json_shape(models):
    runtime = load(models, "numeric")
    assert runtime.numpy_path is not None and runtime.numpy_path.columns == COLUMNS
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(5, 6)).round(4).tolist()
    rows[0][2] = 3  # an int in a double column, as JSON clients send it
    frame = pd.DataFrame(rows, columns=COLUMNS)
    expected = runtime._model.predict(frame)
    shuffled = [*reversed(COLUMNS), "extra"]
    shapes = [
        {"dataframe_split": {"columns": COLUMNS, "data": rows}},
        {
            "dataframe_split": {
                "columns": shuffled,
                "data": [[r[COLUMNS.index(c)] if c in COLUMNS else "x" for c in shuffled] for r in rows],
            }
        },
        {"dataframe_records": frame.to_dict(orient="records")},
        {"inputs": {c: frame[c].tolist() for c in COLUMNS}},
    ]
    for doc in shapes[:1] + shapes[2:]:
        request = parse(doc)
        assert request.numeric_matrix(COLUMNS) is not None  # these take the fast path
        np.testing.assert_allclose(runtime.predict_request(request).predictions, expected, rtol=1e-12)
    # a string in an extra column means the array is not numeric: pyfunc answers, with the same predictions
    np.testing.assert_allclose(runtime.predict_request(parse(shapes[1])).predictions, expected, rtol=1e-12)


def test_what_the_numpy_path_cannot_take_gets_pyfunc_and_its_errors(models):
    runtime = load(models, "numeric")
    bad = parse({"dataframe_split": {"columns": COLUMNS, "data": [["a", 1, 2, 3, 4, 5]]}})
    assert bad.numeric_matrix(COLUMNS) is None
    with pytest.raises(ApiError) as err:
        runtime.predict_request(bad)
    assert err.value.status_code == 400
    missing = parse({"dataframe_split": {"columns": COLUMNS[:5], "data": [[1, 2, 3, 4, 5]]}})
    with pytest.raises(ApiError) as err:
        runtime.predict_request(missing)
    assert err.value.status_code == 400 and "f5" in err.value.message
    integers = load(models, "integers")
    assert integers.numpy_path is None  # integer columns: only MLflow's schema check says what is wrong
    request = parse({"dataframe_split": {"columns": COLUMNS, "data": [[1, 0, -1, 2, 0, 1]]}})
    assert integers.predict_request(request).predictions.tolist() == integers._model.predict(request.frame).tolist()


def test_a_batch_is_predicted_together_and_split_back_and_a_bad_request_fails_alone(models):
    runtime = load(models, "numeric")
    rng = np.random.default_rng(2)
    sizes = [1, 3, 2]
    requests = [
        parse({"dataframe_split": {"columns": COLUMNS, "data": rng.normal(size=(n, 6)).tolist()}}) for n in sizes
    ]
    alone = [runtime.predict_request(r).predictions for r in requests]
    together = runtime.predict_batch(requests)
    for single, joined in zip(alone, together):
        np.testing.assert_allclose(joined.predictions, single, rtol=1e-12)
    broken = parse({"dataframe_split": {"columns": COLUMNS[:2], "data": [[1, 2]]}})
    mixed = runtime.predict_batch([requests[0], broken, requests[2]])
    assert isinstance(mixed[1], ApiError) and mixed[1].status_code == 400
    np.testing.assert_allclose(mixed[0].predictions, alone[0], rtol=1e-12)
    np.testing.assert_allclose(mixed[2].predictions, alone[2], rtol=1e-12)
    plan = runtime.profile(sizes=(1, 2, 4), budget_s=1.0)
    assert plan is runtime.plan and plan.max_batch in (1, 2, 4) and plan.single_ms > 0


def test_the_replica_answers_an_envelope_item_by_item_and_wants_its_token(models):
    runtime = load(models, "numeric")
    runtime.profile(sizes=(1, 2), budget_s=1.0)
    app = create_replica_app(
        runtime, token="replica-secret-0123456789", model_uri="models:/numeric/1", load_seconds=1.5
    )
    good = json.dumps({"dataframe_split": {"columns": COLUMNS, "data": [[0.1] * 6]}}).encode()
    envelope = wire.encode_requests(
        [
            wire.WireRequest("a", "application/json", good),
            wire.WireRequest("b", "application/json", b"{not json"),
            wire.WireRequest("c", "text/plain", good),
            wire.WireRequest("d", "application/json", good),
        ]
    )
    auth = {"authorization": "Bearer replica-secret-0123456789", "content-type": wire.CONTENT_TYPE}
    with TestClient(app) as client:
        ready = client.get("/health/ready").json()
        assert ready["numpy_path"] is True and ready["batching"]["max_batch"] >= 1
        assert client.post(wire.PATH, content=envelope, headers={"content-type": wire.CONTENT_TYPE}).status_code == 401
        assert (
            client.post("/invocations", content=good, headers={"content-type": "application/json"}).status_code == 401
        )
        answer = client.post(wire.PATH, content=envelope, headers=auth)
        single = client.post("/invocations", content=good, headers={**auth, "content-type": "application/json"})
        garbage = client.post(wire.PATH, content=b"junk", headers=auth)
        assert client.get("/metrics").status_code == 401
        metrics = client.get("/metrics", headers=auth).text
    items = wire.decode_answers(answer.content, expected=4)
    assert [i.status for i in items] == [200, 400, 415, 200]
    assert orjson.loads(items[1].first)["error_code"] == "MALFORMED_REQUEST" and b"not json" not in items[1].first
    expected = runtime._model.predict(pd.DataFrame([[0.1] * 6], columns=COLUMNS)).tolist()
    assert orjson.loads(items[0].client_body()) == {"predictions": expected} == single.json()
    assert garbage.status_code == 400
    # the replica's own metrics count each answer by status and each predict call with its requests
    uri = 'model_uri="models:/numeric/1"'
    assert f'tollfree_replica_answers_total{{{uri},status="200"}} 3.0' in metrics
    assert f'tollfree_replica_answers_total{{{uri},status="400"}} 1.0' in metrics
    assert f'tollfree_replica_answers_total{{{uri},status="415"}} 1.0' in metrics
    assert f"tollfree_replica_predict_seconds_count{{{uri}}} 2.0" in metrics  # the envelope, then the single call
    assert f"tollfree_replica_batch_requests_sum{{{uri}}} 5.0" in metrics
    assert f"tollfree_replica_model_load_seconds{{{uri}}} 1.5" in metrics
    assert "process_resident_memory_bytes" in metrics and "process_cpu_seconds_total" in metrics


def test_each_envelope_answer_carries_the_replica_busy_clock_which_counts_a_model_that_waits(models):
    """A model that sleeps uses no CPU, yet its replica is busy while it runs: the clock on every answer
    (what the gateway's autoscaler reads as utilisation) rises by the predict time, idle time not included."""
    runtime = load(models, "sleepy")
    runtime.profile(sizes=(1,), budget_s=0.5)
    app = create_replica_app(runtime, token="replica-secret-0123456789", model_uri="models:/sleepy/1")
    one = json.dumps({"dataframe_split": {"columns": ["x"], "data": [[1.0]]}}).encode()
    auth = {"authorization": "Bearer replica-secret-0123456789", "content-type": wire.CONTENT_TYPE}
    readings = []
    with TestClient(app) as client:
        for n in (1, 2, 1):  # one request (answered on the event loop), two (the worker thread), one
            envelope = wire.encode_requests([wire.WireRequest(str(i), "application/json", one) for i in range(n)])
            answer = client.post(wire.PATH, content=envelope, headers=auth)
            assert answer.status_code == 200
            readings.append(float(answer.headers[BUSY_HEADER]))
            time.sleep(0.3)  # idle between calls: not busy time
        metrics = client.get("/metrics", headers=auth).text
    rises = [b - a for a, b in zip([0.0, *readings], readings)]
    for rise, rows in zip(rises, (1, 2, 1)):  # each call sleeps SLEEP_PER_ROW_S a row (one batch)
        assert rows * SLEEP_PER_ROW_S <= rise < rows * SLEEP_PER_ROW_S + 0.15, rises
    counter = float(
        re.search(r'tollfree_replica_busy_seconds_total\{model_uri="models:/sleepy/1"\} (\S+)', metrics).group(1)
    )
    assert counter == pytest.approx(readings[-1], abs=1e-3)


def test_a_model_without_an_example_is_timed_on_a_row_built_from_its_signature(models):
    """Logged with a signature and no input example: the replica still measures it, so a model whose rows
    cost little next to its fixed cost per call (a pipeline) is batched."""
    runtime = load(models, "mixed")
    row = runtime.sample_row()
    assert list(row.columns) == MIXED and row.iloc[0].tolist() == [0.0] * 5 + [""]
    assert [str(t) for t in row.dtypes] == ["float64"] * 5 + ["object"]
    plan = runtime.profile(sizes=(1, 2, 4, 8), budget_s=2.0)
    # a pipeline predicts 8 rows in about the time of 1: the per-row gain is far above batching's bar of 2
    assert plan.enabled and plan.max_batch > 1 and plan.gain > 2.0, plan
    sleepy = load(models, "sleepy")  # a custom pyfunc with its example: timed on the example, as before
    assert sleepy.sample_row().iloc[0].tolist() == [1.0]


def test_the_frame_path_gives_pyfunc_predictions_and_leaves_other_types_to_pyfunc(models):
    runtime = load(models, "mixed")
    assert runtime.frame_path is not None and runtime.numpy_path is None
    rows = [[0.5, -1, 2.25, 0.0, 1.5, "a"], [1.0, 2.0, -0.5, 3, 0.25, "b"]]  # an int among floats, as JSON sends it
    frame = pd.DataFrame(rows, columns=MIXED)
    expected = runtime._model.predict(frame).tolist()
    request = parse({"dataframe_split": {"columns": MIXED, "data": rows}})
    assert runtime.frame_path.ready(runtime.model_input(request.frame)) is not None
    assert runtime.predict_request(request).predictions.tolist() == expected
    shuffled = parse({"dataframe_records": [dict(zip(reversed(MIXED), reversed(r))) for r in rows]})
    assert runtime.predict_request(shuffled).predictions.tolist() == expected
    # a number in the string column, or a double column of ints only, is not the signature's type: pyfunc's
    # schema check answers, as it would without the frame path, naming no value
    for data in ([[0.5, 1.0, 2.0, 0.0, 1.5, 7]], [[0.5, 1.0, 2.0, 3, 1.5, "a"]]):
        bad = parse({"dataframe_split": {"columns": MIXED, "data": data}})
        assert runtime.frame_path.ready(runtime.model_input(bad.frame)) is None
        with pytest.raises(ApiError) as err:
            runtime.predict_request(bad)
        assert err.value.status_code == 400 and "7" not in err.value.message and "1.5" not in err.value.message


def test_requests_on_the_pandas_path_are_predicted_as_one_call_and_a_request_missing_a_column_fails_alone(models):
    runtime = load(models, "mixed")
    calls = []
    direct = runtime.frame_path

    def counting(frame: pd.DataFrame):  # type: ignore[no-untyped-def]
        calls.append(len(frame))
        return direct.predict(frame)

    runtime.frame_path = type(direct)(counting, direct.types)
    rng = np.random.default_rng(3)
    requests = [
        parse(
            {
                "dataframe_split": {
                    "columns": MIXED,
                    "data": [[*rng.normal(size=5).round(3).tolist(), c] for c in "ab"[:n]],
                }
            }
        )
        for n in (1, 2, 1)
    ]
    alone = [runtime.predict_request(r).predictions.tolist() for r in requests]
    calls.clear()
    together = runtime.predict_batch(requests)
    assert calls == [4] and [t.predictions.tolist() for t in together] == alone
    lacking = parse({"dataframe_split": {"columns": MIXED[:-1], "data": [[1.0] * 5]}})
    mixed = runtime.predict_batch([requests[0], lacking, requests[2]])
    assert isinstance(mixed[1], ApiError) and mixed[1].status_code == 400 and "cat" in mixed[1].message
    assert mixed[0].predictions.tolist() == alone[0] and mixed[2].predictions.tolist() == alone[2]


def test_a_stream_event_predicts_what_the_same_row_as_dataframe_split_does_and_a_bad_one_fails_alone(models):
    runtime = load(models, "numeric")
    assert runtime.event_fields == dict.fromkeys(COLUMNS, "double")
    rows = np.random.default_rng(4).normal(size=(3, 6)).round(5).tolist()
    # Redis fields in any order, as strings, with metadata the model does not take
    events = [
        orjson.dumps({"event_id": f"1700000000000-{i}", **{c: repr(v) for c, v in reversed(list(zip(COLUMNS, row)))}})
        for i, row in enumerate(rows)
    ]
    assert parse_event(events[0], runtime.event_fields).numeric_matrix(COLUMNS) is not None  # the numpy path
    split = json.dumps({"dataframe_split": {"columns": COLUMNS, "data": rows}}).encode()
    bad = orjson.dumps({**orjson.loads(events[1]), "f3": "12,5"})
    envelope = wire.encode_requests(
        [
            wire.WireRequest("e0", EVENT_CONTENT_TYPE, events[0]),
            wire.WireRequest("bad", f"{EVENT_CONTENT_TYPE}; charset=utf-8", bad),
            wire.WireRequest("e2", EVENT_CONTENT_TYPE.upper(), events[2]),
            wire.WireRequest("split", "application/json", split),
            wire.WireRequest("missing", EVENT_CONTENT_TYPE, orjson.dumps({c: "1.0" for c in COLUMNS if c != "f1"})),
        ]
    )
    items = wire.decode_answers(score_envelope(runtime, envelope, 100), expected=5)
    assert [i.status for i in items] == [200, 400, 200, 200, 400]
    expected = orjson.loads(items[3].client_body())["predictions"]
    assert [orjson.loads(items[i].client_body())["predictions"] for i in (0, 2)] == [expected[0:1], expected[2:3]]
    assert orjson.loads(items[1].first) == {
        "error_code": "INVALID_PARAMETER_VALUE",
        "message": 'event field "f3" must be a double (a finite number)',
    }
    assert orjson.loads(items[4].first)["message"] == 'event is missing field "f1"'
    status, body = score_one(runtime, events[1], EVENT_CONTENT_TYPE, "one", False, 100)
    assert status == 200 and orjson.loads(body)["predictions"] == expected[1:2]
    # integer columns (long) are parsed as int64, which MLflow's schema check takes as they are
    integers = load(models, "integers")
    ints = [[1, 0, -1, 2, 0, 1], [0, 2, 1, -1, 1, 0]]
    both = integers.predict_batch(
        [parse_event(orjson.dumps(dict(zip(COLUMNS, map(str, r)))), integers.event_fields) for r in ints]
    )
    assert [p.predictions.tolist() for p in both] == [
        integers._model.predict(pd.DataFrame([r], columns=COLUMNS)).tolist() for r in ints
    ]


def test_a_feature_service_models_event_carries_its_entity_keys_and_request_fields(models):
    """A FeatureService's layout (the fraud service's shape: no Feast store needed to read it): the event
    fields are the entity keys as longs and the request fields by their Feast type, and an event parsed
    by them passes the reader's own check of the request frame."""
    layout = ServiceLayout(
        "fraud_v1", ("customer_id", "merchant_id"), {"amount": "Float64", "items": "Int32"}, ("cust_spend_24h",), {}, {}
    )
    runtime = ModelRuntime(load(models, "numeric")._model, SimpleNamespace(layout=layout), None)  # type: ignore[arg-type]
    assert runtime.event_fields == {"customer_id": "long", "merchant_id": "long", "amount": "double", "items": "long"}
    event = orjson.dumps({"merchant_id": "17", "amount": "25.5", "customer_id": "3", "items": "2", "source": "pos"})
    request = parse_event(event, runtime.event_fields)
    assert check_request_frame(request.frame, layout) == {
        "customer_id": [3],
        "merchant_id": [17],
        "amount": [25.5],
        "items": [2],
    }
    assert str(request.frame["customer_id"].dtype) == "int64"
