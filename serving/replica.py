"""One model replica: an OS process that loads one MLflow model and answers the scoring protocol.

``python -m serving.replica --model-uri models:/NAME/VERSION --host 127.0.0.1 --port PORT``.
It is ready (``/health/ready`` 200) only after the model is loaded and warmed. The gateway is its only
client; it asks for the served features back (header ``x-tollfree-return-features``) to log them.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from serving.errors import REQUEST_ID_HEADER, install_error_handlers, internal, resolve_request_id
from serving.runtime import ModelError, ModelRuntime
from serving.scoring_protocol import parse_scoring_request, to_jsonable

log = logging.getLogger(__name__)

RETURN_FEATURES_HEADER = "x-tollfree-return-features"


def create_replica_app(runtime: ModelRuntime, *, max_rows: int = 10_000) -> FastAPI:
    app = FastAPI(title="tollfree replica", docs_url=None, redoc_url=None, openapi_url=None)
    install_error_handlers(app)
    app.state.ready = True

    @app.get("/health/ready")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    @app.get("/health/live")
    async def live() -> dict[str, str]:
        return {"status": "live"}

    @app.post("/invocations")
    async def invocations(request: Request) -> JSONResponse:
        request_id = resolve_request_id(request.headers.get(REQUEST_ID_HEADER))
        parsed = parse_scoring_request(await request.body(), request.headers.get("content-type"), max_rows=max_rows)
        started = time.perf_counter()
        try:
            result = await run_in_threadpool(runtime.predict, parsed.frame, parsed.params)
        except ModelError as exc:
            log.error("model failed on request %s: %s", request_id, exc)
            raise internal(f"the model failed on this input; request id {request_id}") from exc
        body: dict = {"predictions": to_jsonable(result.predictions)}
        if request.headers.get(RETURN_FEATURES_HEADER) == "1" and result.features is not None:
            body["served_features"] = to_jsonable(result.features)
        headers = {REQUEST_ID_HEADER: request_id, "x-tollfree-predict-ms": f"{(time.perf_counter() - started) * 1000:.3f}"}
        return JSONResponse(body, headers=headers)

    return app


def main(argv: list[str] | None = None) -> int:
    from serving.settings import export_defaults

    parser = argparse.ArgumentParser(description="Serve one MLflow model as a tollfree replica.")
    parser.add_argument("--model-uri", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s replica[%(process)d] %(name)s: %(message)s")
    settings = export_defaults(os.environ)
    import mlflow
    import uvicorn

    mlflow.set_tracking_uri(settings.tracking_uri)
    runtime = ModelRuntime.load(args.model_uri, Path(settings.home))
    runtime.warm()
    app = create_replica_app(runtime)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
