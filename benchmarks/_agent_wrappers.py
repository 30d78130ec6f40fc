"""The hand-written wrappers users put around a model, for benchmarks/bench_agent.py to
compare the agent with: a minimal FastAPI+uvicorn app and a minimal Flask app, both serving
the same ONNX model from the same kind of onnxruntime session, JSON in and out.

Run as ``python _agent_wrappers.py fastapi|flask MODEL.onnx PORT``.
"""

from __future__ import annotations

import sys

import numpy as np


def fastapi_app(model_path: str):  # type: ignore[no-untyped-def]
    import onnxruntime as ort
    from fastapi import FastAPI

    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    app = FastAPI()

    @app.post("/infer")
    def infer(payload: dict) -> dict:  # the usual: a sync endpoint, JSON body, run, JSON back
        image = np.asarray(payload["inputs"]["image"], dtype=np.float32)
        (logits,) = session.run(["logits"], {"image": image})
        return {"outputs": {"logits": logits.tolist()}}

    return app


def flask_app(model_path: str):  # type: ignore[no-untyped-def]
    import onnxruntime as ort
    from flask import Flask, jsonify, request

    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    app = Flask(__name__)

    @app.post("/infer")
    def infer():  # type: ignore[no-untyped-def]
        image = np.asarray(request.get_json()["inputs"]["image"], dtype=np.float32)
        (logits,) = session.run(["logits"], {"image": image})
        return jsonify({"outputs": {"logits": logits.tolist()}})

    return app


def main() -> None:
    kind, model_path, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if kind == "fastapi":
        import uvicorn

        uvicorn.run(fastapi_app(model_path), host="127.0.0.1", port=port, log_level="warning")
    elif kind == "flask":
        from werkzeug.serving import WSGIRequestHandler

        WSGIRequestHandler.protocol_version = "HTTP/1.1"  # keep-alive, as the comparison asks
        flask_app(model_path).run(host="127.0.0.1", port=port, threaded=True)
    else:
        raise SystemExit(f"unknown wrapper {kind!r}; known: fastapi, flask")


if __name__ == "__main__":
    main()
