#!/usr/bin/env python3
"""Tessera's coordinator as a KServe v2 gRPC server, checked with Triton's
own gRPC client (tritonclient[grpc]==2.73.0) and its protobuf stubs.

Usage: grpc_test.py HOST:PORT MODELS_DIR --http HOST:PORT [--max-body N]
       [--model-control] [--ssl CA_PEM] [--token TOKEN]

The server serves `rec` (PP-OCRv4 rec, x 1x3x48x320) and `minilm`
(paraphrase-MiniLM-L3-v2, int64 inputs, dynamic dims), each split over two
workers. Checks: liveness, readiness, server and model metadata, inference
with raw tensors (the client's way) and with typed contents (the stubs)
against onnxruntime on the same inputs (tolerance 1e-4 x max(1, max
|onnxruntime|)), 64 concurrent requests, bad requests (each a clear status
code, the server still serving), a message over the size limit, the
repository extension (load and unload with --model-control, else
PERMISSION_DENIED), with --token: UNAUTHENTICATED without it (liveness
open), and the requests counted in /metrics (over --http, when plain).
"""
import argparse
import queue
import time

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from kserve_test import REC_SHAPE, Oracle, close, metrics, run, sample


class Server:
    def __init__(self, url, ca, token):
        self.url, self.ca = url, ca
        self.headers = {"authorization": f"Bearer {token}"} if token else None
        self.client = grpcclient.InferenceServerClient(
            url, ssl=ca is not None, root_certificates=ca)
        if ca:
            with open(ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            channel = grpc.secure_channel(url, creds)
        else:
            channel = grpc.insecure_channel(url)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        self.metadata = tuple(self.headers.items()) if token else None


def rec_infer(server, oracle, seed):
    x = oracle.rec_input(seed)
    inp = grpcclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    res = server.client.infer("rec", [inp], headers=server.headers, request_id=f"g-{seed}")
    assert res.get_response().id == f"g-{seed}"
    return close(res.as_numpy(oracle.rec_out), oracle.rec.run(None, {"x": x})[0], "gRPC rec")


def minilm_infer(server, oracle, seed):
    ids, mask = oracle.minilm_inputs(seed)
    inputs = []
    for name, a in (("input_ids", ids), ("attention_mask", mask)):
        i = grpcclient.InferInput(name, list(a.shape), "INT64")
        i.set_data_from_numpy(a)
        inputs.append(i)
    outs = [grpcclient.InferRequestedOutput(n) for n in oracle.minilm_outs]
    res = server.client.infer("minilm", inputs, outputs=outs, headers=server.headers)
    want = oracle.minilm.run(None, {"input_ids": ids, "attention_mask": mask})
    return max(close(res.as_numpy(n), w, f"gRPC minilm {n}") for n, w in zip(oracle.minilm_outs, want))


def typed_infer(server, oracle, seed):
    """A request with typed contents (fp32_contents / int64_contents), as
    the protocol's other clients send them."""
    x = oracle.rec_input(seed)
    req = service_pb2.ModelInferRequest(model_name="rec", model_version="1")
    t = req.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    t.contents.fp32_contents.extend(x.flatten().tolist())
    reply = server.stub.ModelInfer(req, metadata=server.metadata)
    out = reply.outputs[0]
    got = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32).reshape(out.shape)
    d = close(got, oracle.rec.run(None, {"x": x})[0], "gRPC typed rec")
    ids, mask = oracle.minilm_inputs(seed)
    req = service_pb2.ModelInferRequest(model_name="minilm")
    for name, a in (("input_ids", ids), ("attention_mask", mask)):
        req.inputs.add(name=name, datatype="INT64", shape=list(a.shape)).contents.int64_contents.extend(
            a.flatten().tolist())
    req.outputs.add(name=oracle.minilm_outs[0])
    reply = server.stub.ModelInfer(req, metadata=server.metadata)
    assert [o.name for o in reply.outputs] == [oracle.minilm_outs[0]], reply.outputs
    dtype = triton_to_np_dtype(reply.outputs[0].datatype)
    got = np.frombuffer(reply.raw_output_contents[0], dtype=dtype).reshape(reply.outputs[0].shape)
    want = oracle.minilm.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    return max(d, close(got, want, "gRPC typed minilm"))


def check_health_and_metadata(server):
    c, h = server.client, server.headers
    assert c.is_server_live(headers=h) and c.is_server_ready(headers=h)
    assert c.is_model_ready("rec", headers=h) and c.is_model_ready("minilm", "1", headers=h)
    meta = c.get_server_metadata(headers=h, as_json=True)
    assert meta["name"] == "tessera" and "model_repository" in meta["extensions"], meta
    rec = c.get_model_metadata("rec", headers=h, as_json=True)
    assert rec["platform"] == "onnx_onnxv1" and rec["versions"] == ["1"], rec
    assert rec["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [str(d) for d in REC_SHAPE]}], rec
    mini = c.get_model_metadata("minilm", headers=h, as_json=True)
    assert [(i["name"], i["datatype"], i["shape"]) for i in mini["inputs"]] == [
        ("input_ids", "INT64", ["-1", "-1"]), ("attention_mask", "INT64", ["-1", "-1"])], mini
    index = {m["name"]: m.get("state") for m in c.get_model_repository_index(headers=h, as_json=True)["models"]}
    assert index.get("rec") == "READY" and index.get("minilm") == "READY", index
    print("gRPC health, server and model metadata, repository index: ok")


def check_concurrency(server, oracle, n=64):
    done = queue.Queue()
    sent = {}
    for seed in range(300, 300 + n):
        x = oracle.rec_input(seed)
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        sent[str(seed)] = x
        server.client.async_infer("rec", [inp], lambda result, error: done.put((result, error)),
                                  request_id=str(seed), headers=server.headers)
    worst = 0.0
    for _ in range(n):
        result, error = done.get(timeout=300)
        assert error is None, error
        x = sent.pop(result.get_response().id)
        worst = max(worst, close(result.as_numpy(oracle.rec_out), oracle.rec.run(None, {"x": x})[0], "concurrent"))
    assert not sent
    print(f"gRPC: {n} concurrent rec requests all correct (max abs diff {worst:.2e})")


def expect_status(what, code, call):
    try:
        call()
    except grpc.RpcError as e:
        got, message = e.code(), e.details()
    except InferenceServerException as e:
        got, message = e.status(), e.message()
    else:
        raise AssertionError(f"{what}: answered, wanted {code}")
    name = got.name if hasattr(got, "name") else str(got).replace("StatusCode.", "")
    assert name == code.name, f"{what}: {name} (wanted {code.name}): {message}"
    assert message, what
    print(f"  {what}: {name} {message[:110]}")


def check_bad_requests(server, oracle, max_body):
    x = oracle.rec_input(7)
    S = grpc.StatusCode

    def infer(**changes):
        req = service_pb2.ModelInferRequest(model_name="rec")
        spec = {"name": "x", "datatype": "FP32", "shape": list(REC_SHAPE)}
        raw = changes.pop("raw", x.tobytes())
        req.model_version = changes.pop("version", "")
        req.model_name = changes.pop("model", "rec")
        spec.update(changes)
        req.inputs.add(**spec)
        if raw is not None:
            req.raw_input_contents.append(raw)
        return lambda: server.stub.ModelInfer(req, metadata=server.metadata)

    big = np.zeros((1, 3, 48, max_body // (3 * 48 * 4) + 8), dtype=np.float32)
    cases = [
        ("unknown model", S.NOT_FOUND, infer(model="nope")),
        ("unknown version", S.NOT_FOUND, infer(version="9")),
        ("wrong input name", S.INVALID_ARGUMENT, infer(name="y")),
        ("wrong shape", S.INVALID_ARGUMENT, infer(shape=[1, 3, 48, 160], raw=x.tobytes()[: x.nbytes // 2])),
        ("wrong datatype", S.INVALID_ARGUMENT, infer(datatype="INT32")),
        ("raw bytes not matching the shape", S.INVALID_ARGUMENT, infer(raw=x.tobytes()[:-4])),
        ("no contents at all", S.INVALID_ARGUMENT, infer(raw=None)),
        ("a shape whose element count overflows", S.INVALID_ARGUMENT, infer(shape=[2**62, 2**62, 1, 1])),
        ("a negative dimension", S.INVALID_ARGUMENT, infer(shape=[1, 3, -48, 320])),
        ("a message over the limit", S.OUT_OF_RANGE, infer(shape=list(big.shape), raw=big.tobytes())),
        ("unknown model's metadata", S.NOT_FOUND,
         lambda: server.stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="nope"), metadata=server.metadata)),
        ("unknown model's readiness", S.NOT_FOUND,
         lambda: server.stub.ModelReady(service_pb2.ModelReadyRequest(name="nope"), metadata=server.metadata)),
        ("a method Tessera does not serve", S.UNIMPLEMENTED,
         lambda: server.stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name="rec"), metadata=server.metadata)),
    ]
    for what, code, call in cases:
        expect_status(what, code, call)
        rec_infer(server, oracle, 8)  # still serving
    print("gRPC bad requests: each a clear status, the server kept serving")


def check_token_required(server, oracle):
    """With tokens: ServerLive and ServerReady open (probes send no
    token), everything else UNAUTHENTICATED without the token or with a
    wrong one."""
    c = server.client
    assert c.is_server_live(), "liveness needs no token"
    assert c.is_server_ready(), "readiness needs no token"
    for headers in (None, {"authorization": "Bearer wrong"}):
        expect_status(f"metadata with {headers}", grpc.StatusCode.UNAUTHENTICATED,
                      lambda: c.get_server_metadata(headers=headers))
        x = oracle.rec_input(31)
        inp = grpcclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        expect_status(f"infer with {headers}", grpc.StatusCode.UNAUTHENTICATED,
                      lambda: c.infer("rec", [inp], headers=headers))
    print("gRPC tokens: liveness and readiness open, the rest UNAUTHENTICATED without the token")


def check_repository(server, oracle, model_control):
    c, h = server.client, server.headers
    if not model_control:
        for what, call in (("load", lambda: c.load_model("rec", headers=h)),
                           ("unload", lambda: c.unload_model("rec", headers=h))):
            expect_status(f"{what} with model control off", grpc.StatusCode.PERMISSION_DENIED, call)
        assert c.is_model_ready("rec", headers=h), "a refused unload left the model alone"
        print("gRPC repository: load and unload refused (model control off)")
        return
    c.unload_model("minilm", headers=h)
    assert not c.is_model_ready("minilm", headers=h)
    expect_status("an unloaded model", grpc.StatusCode.UNAVAILABLE, lambda: minilm_infer(server, oracle, 9))
    c.load_model("minilm", headers=h)
    assert c.is_model_ready("minilm", headers=h)
    minilm_infer(server, oracle, 10)
    expect_status("an unknown model's load", grpc.StatusCode.NOT_FOUND, lambda: c.load_model("nope", headers=h))
    config = '{"path": "../x.onnx"}'
    expect_status("a load from outside the repository", grpc.StatusCode.INVALID_ARGUMENT,
                  lambda: c.load_model("x", config=config, headers=h))
    print("gRPC repository: unload, load again, unknown and outside models refused: ok")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("models")
    p.add_argument("--http", required=True, help="the HTTP listener, for /metrics")
    p.add_argument("--max-body", type=int, default=1 << 20)
    p.add_argument("--model-control", action="store_true")
    p.add_argument("--ssl", help="the CA certificate to verify the server with")
    p.add_argument("--token")
    args = p.parse_args()
    oracle = Oracle(args.models)
    server = Server(args.url, args.ssl, args.token)
    until = time.time() + 180
    while not server.client.is_server_ready(headers=server.headers):
        assert time.time() < until, "not ready within 180 s"
        time.sleep(0.5)
    before = None if args.ssl else metrics(args.http)
    check_health_and_metadata(server)
    diffs = [rec_infer(server, oracle, s) for s in (1, 2)] + [minilm_infer(server, oracle, s) for s in (3, 4)]
    diffs.append(typed_infer(server, oracle, 5))
    print(f"gRPC inference vs onnxruntime (raw and typed contents, rec and minilm): max abs diff {max(diffs):.2e}")
    check_concurrency(server, oracle)
    check_bad_requests(server, oracle, args.max_body)
    check_repository(server, oracle, args.model_control)
    if args.token:
        check_token_required(server, oracle)
    if before is not None:
        after = metrics(args.http)
        served = sample(after, "tessera_requests_total", model="rec") - sample(before, "tessera_requests_total", model="rec")
        assert served >= 64, f"gRPC requests counted in /metrics: {served}"
        failed = sample(after, "tessera_request_failures_total", model="rec", reason="bad_input") - \
            sample(before, "tessera_request_failures_total", model="rec", reason="bad_input")
        assert failed >= 1, "gRPC bad-input failures are counted"
        print(f"gRPC metrics: {served:.0f} rec requests and {failed:.0f} bad inputs counted")
    print("grpc: all checks passed")


if __name__ == "__main__":
    run(main)
