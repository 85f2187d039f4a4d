#!/usr/bin/env python3
"""Tessera's coordinator as a KServe v2 server, checked with real clients:
Triton's Python client (tritonclient[http]==2.73.0), curl, and
prometheus_client's text-format parser for /metrics.

Usage: kserve_test.py HOST:PORT MODELS_DIR [--phase full|serving]

The coordinator serves two named models: `rec` (PP-OCRv4 rec, x fixed to
1x3x48x320) and `minilm` (paraphrase-MiniLM-L3-v2, int64 inputs with
dynamic dims), each split over two worker processes. `full` checks health,
metadata, inference with binary and JSON tensors against onnxruntime on
the same inputs (tolerance 1e-4 x max(1, max |onnxruntime|)), 64
concurrent requests, every endpoint with curl, bad requests (a clear 4xx,
and the server keeps serving), limits (a 2 GB Content-Length, a slow-loris
connection), the repository extension (loads confined to the model
repository folder), and /metrics counters moving. `serving` waits until the server is ready and checks one
request of each model (after a worker loss or a coordinator restart).
`loop` sends rec and minilm requests one after another for `--seconds` (or `--requests` of them),
each checked, and fails on the first that fails (a front door that must
keep answering while the coordinator is stopped).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

REC_SHAPE = (1, 3, 48, 320)
MINILM_SEQ = 12


def close(got, want, what):
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, onnxruntime {want.shape}"
    tol = 1e-4 * max(1.0, float(np.max(np.abs(want)))) if want.size else 0.0
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if want.size else 0.0
    assert diff <= tol, f"{what}: max abs diff {diff} > {tol}"
    return diff


class Oracle:
    def __init__(self, models):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self.rec = ort.InferenceSession(os.path.join(models, "ch_PP-OCRv4_rec_infer.onnx"), opts,
                                        providers=["CPUExecutionProvider"])
        self.minilm = ort.InferenceSession(os.path.join(models, "paraphrase-MiniLM-L3-v2.onnx"), opts,
                                           providers=["CPUExecutionProvider"])
        self.rec_out = self.rec.get_outputs()[0].name
        self.minilm_outs = [o.name for o in self.minilm.get_outputs()]

    def rec_input(self, seed):
        return np.random.default_rng(seed).uniform(-1, 1, REC_SHAPE).astype(np.float32)

    def minilm_inputs(self, seed):
        rng = np.random.default_rng(seed)
        ids = rng.integers(100, 30000, (1, MINILM_SEQ), dtype=np.int64)
        ids[0, 0], ids[0, -1] = 101, 102
        mask = np.ones((1, MINILM_SEQ), dtype=np.int64)
        return ids, mask


def rec_infer(client, oracle, seed, binary):
    x = oracle.rec_input(seed)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput(oracle.rec_out, binary_data=binary)
    res = client.infer("rec", [inp], outputs=[out])
    want = oracle.rec.run(None, {"x": x})[0]
    return close(res.as_numpy(oracle.rec_out), want, f"rec (binary={binary}, seed {seed})")


def minilm_infer(client, oracle, seed, binary):
    ids, mask = oracle.minilm_inputs(seed)
    inputs = []
    for name, value in (("input_ids", ids), ("attention_mask", mask)):
        i = httpclient.InferInput(name, list(value.shape), "INT64")
        i.set_data_from_numpy(value, binary_data=binary)
        inputs.append(i)
    outs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in oracle.minilm_outs]
    res = client.infer("minilm", inputs, outputs=outs)
    want = oracle.minilm.run(None, {"input_ids": ids, "attention_mask": mask})
    return max(close(res.as_numpy(n), w, f"minilm {n} (binary={binary})")
               for n, w in zip(oracle.minilm_outs, want))


def wait_ready(client, timeout_s=180):
    until = time.time() + timeout_s
    while time.time() < until:
        try:
            if client.is_server_ready():
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the server was not ready within {timeout_s} s")


def curl(url, path, method="GET", data=None, headers=()):
    """(status, body) of one request made by the curl binary."""
    cmd = ["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", "-X", method, f"http://{url}{path}"]
    for h in headers:
        cmd += ["-H", h]
    if data is not None:
        cmd += ["--data-binary", "@-"]
    out = subprocess.run(cmd, input=data, capture_output=True, check=True).stdout
    body, _, code = out.rpartition(b"\n")
    return int(code), body


def metrics(url):
    code, body = curl(url, "/metrics")
    assert code == 200, code
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def sample(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def check_health_and_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "tessera", meta
    assert "binary_tensor_data" in meta["extensions"] and "model_repository" in meta["extensions"], meta
    rec = client.get_model_metadata("rec")
    assert rec["platform"] == "onnx_onnxv1" and rec["versions"] == ["1"], rec
    assert rec["inputs"] == [{"name": "x", "datatype": "FP32", "shape": list(REC_SHAPE)}], rec["inputs"]
    assert rec["outputs"][0]["datatype"] == "FP32" and rec["outputs"][0]["shape"][-1] == 6625, rec["outputs"]
    mini = client.get_model_metadata("minilm", model_version="1")
    assert [(i["name"], i["datatype"], i["shape"]) for i in mini["inputs"]] == [
        ("input_ids", "INT64", [-1, -1]), ("attention_mask", "INT64", [-1, -1])], mini["inputs"]
    assert client.is_model_ready("rec") and client.is_model_ready("minilm", "1")
    index = {m["name"]: m["state"] for m in client.get_model_repository_index()}
    assert index == {"minilm": "READY", "rec": "READY"}, index
    print("health, server and model metadata, repository index: ok")


def check_inference(client, oracle):
    diffs = [rec_infer(client, oracle, s, b) for s, b in ((1, True), (2, False))]
    diffs += [minilm_infer(client, oracle, s, b) for s, b in ((3, True), (4, False))]
    # No outputs named: the client asks binary_data_output for all.
    x = oracle.rec_input(5)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    res = client.infer("rec", [inp], request_id="r-5")
    assert res.get_response()["id"] == "r-5"
    diffs.append(close(res.as_numpy(oracle.rec_out), oracle.rec.run(None, {"x": x})[0], "rec, default outputs"))
    print(f"inference vs onnxruntime (binary and JSON tensors, rec and minilm): max abs diff {max(diffs):.2e}")


def check_concurrency(url, oracle, n=64):
    client = httpclient.InferenceServerClient(url=url, concurrency=n, network_timeout=300)
    pending = []
    for seed in range(100, 100 + n):
        x = oracle.rec_input(seed)
        inp = httpclient.InferInput("x", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        pending.append((x, client.async_infer("rec", [inp])))
    started = time.time()
    worst = 0.0
    for x, req in pending:
        got = req.get_result().as_numpy(oracle.rec_out)
        worst = max(worst, close(got, oracle.rec.run(None, {"x": x})[0], "concurrent rec"))
    client.close()
    print(f"{n} concurrent rec requests: all correct (max abs diff {worst:.2e}), "
          f"{time.time() - started:.2f} s after the last was sent")


def check_curl_endpoints(url, oracle, models):
    expect = [
        ("GET", "/v2/health/live", 200), ("GET", "/v2/health/ready", 200), ("GET", "/v2", 200),
        ("GET", "/v2/models/rec", 200), ("GET", "/v2/models/rec/versions/1", 200),
        ("GET", "/v2/models/rec/versions/2", 404), ("GET", "/v2/models/rec/ready", 200),
        ("GET", "/v2/models/rec/versions/1/ready", 200), ("GET", "/v2/models/nope", 404),
        ("GET", "/v2/models/nope/ready", 404), ("POST", "/v2/repository/index", 200),
        ("GET", "/metrics", 200), ("GET", "/v3/what", 404),
    ]
    for method, path, status in expect:
        code, body = curl(url, path, method)
        assert code == status, f"{method} {path}: {code} {body[:200]!r}"
        if status >= 400:
            assert "error" in json.loads(body), body
    ids, mask = oracle.minilm_inputs(6)
    request = {"id": "curl-1", "inputs": [
        {"name": "input_ids", "shape": list(ids.shape), "datatype": "INT64", "data": ids.tolist()},
        {"name": "attention_mask", "shape": list(mask.shape), "datatype": "INT64", "data": mask.flatten().tolist()},
    ], "outputs": [{"name": oracle.minilm_outs[0]}]}
    for path in ("/v2/models/minilm/infer", "/v2/models/minilm/versions/1/infer"):
        code, body = curl(url, path, "POST", json.dumps(request).encode(), ["Content-Type: application/json"])
        assert code == 200, (code, body[:300])
        reply = json.loads(body)
        assert reply["model_name"] == "minilm" and reply["id"] == "curl-1", reply.keys()
        out = reply["outputs"][0]
        want = oracle.minilm.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        close(np.array(out["data"], dtype=np.float32).reshape(out["shape"]), want, "curl JSON minilm")
    # The repository extension, model control on: models load by name
    # from the model repository folder (which holds cls.onnx, and
    # escape.onnx: a link to a file outside it), placed by a config
    # parameter; paths outside the folder are refused without a trace of
    # what is there.
    config = json.dumps({"devices": "HETERO:node-a/CPU", "shapes": {"x": [1, 3, 48, 192]}})
    with_path = lambda p: json.dumps({"parameters": {"config": json.dumps({"path": p})}}).encode()
    loads = [
        ("/v2/repository/models/cls/load", json.dumps({"parameters": {"config": config}}).encode(), 200),
        ("/v2/repository/models/cls/unload", b"", 200),
        ("/v2/repository/models/cls/load", b"", 200),
        ("/v2/repository/models/cls/unload", b"", 200),
        ("/v2/repository/models/nope/load", b"", 404),
        ("/v2/repository/models/nope/unload", b"", 404),
        ("/v2/repository/models/cls/load", b'{"parameters": {"config": "{\\"path\\": 3}"}}', 400),
        ("/v2/repository/models/cls/load", b'{"parameters": {"file:1/model.onnx": "AAAA"}}', 400),
        ("/v2/repository/models/cls/load", b"{not json", 400),
        ("/v2/repository/models/x/load", with_path("../cls.onnx"), 400),
        ("/v2/repository/models/x/load", with_path("/etc/shadow"), 400),
        ("/v2/repository/models/x/load", with_path("/etc/no-such-file"), 400),
        ("/v2/repository/models/x/load", with_path("escape.onnx"), 404),
        ("/v2/repository/models/x/load", with_path("missing.onnx"), 404),
    ]
    replies = {}
    for path, body, status in loads:
        code, reply = curl(url, path, "POST", body, ["Content-Type: application/json"])
        assert code == status, f"POST {path} {body[:60]!r}: {code} {reply[:300]!r}"
        replies[body] = reply
        if path.endswith("cls/load") and status == 200:
            code, _ = curl(url, "/v2/models/cls/ready")
            assert code == 200, code
            code, meta = curl(url, "/v2/models/cls")
            assert json.loads(meta)["inputs"][0]["shape"] == [1, 3, 48, 192], meta
    # Nothing about files outside: /etc/shadow (exists) and a missing file
    # answer alike, and a link out answers as a missing file does.
    shadow, absent = replies[with_path("/etc/shadow")], replies[with_path("/etc/no-such-file")]
    assert shadow.replace(b"/etc/shadow", b"P") == absent.replace(b"/etc/no-such-file", b"P"), (shadow, absent)
    escape, missing = replies[with_path("escape.onnx")], replies[with_path("missing.onnx")]
    assert escape.replace(b"escape", b"P") == missing.replace(b"missing", b"P"), (escape, missing)
    for reply in (shadow, escape):
        assert b"bytes" not in reply and b"No such file" not in reply and b"ONNX" not in reply, reply
    print(f"curl: {len(expect) + 2 + len(loads)} endpoint checks ok")


def bad_requests(url, oracle, max_body):
    """(what, status, request) for requests that must be refused."""
    x = oracle.rec_input(7)
    def js(inputs, **extra):
        return json.dumps({"inputs": inputs, **extra}).encode()
    flat = x.flatten().tolist()
    good = {"name": "x", "shape": list(REC_SHAPE), "datatype": "FP32", "data": flat}
    head = json.dumps({"inputs": [{"name": "x", "shape": list(REC_SHAPE), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    return [
        ("unknown model", 404, "/v2/models/nope/infer", js([good]), []),
        ("unknown version", 404, "/v2/models/rec/versions/9/infer", js([good]), []),
        ("wrong input name", 400, None, js([{**good, "name": "y"}]), []),
        ("wrong shape", 400, None, js([{**good, "shape": [1, 3, 48, 160], "data": flat[: len(flat) // 2]}]), []),
        ("wrong datatype", 400, None, js([{**good, "datatype": "INT64", "data": [0] * len(flat)}]), []),
        ("data length not matching the shape", 400, None, js([{**good, "data": flat[:-1]}]), []),
        ("a shape whose element count overflows", 400, None,
         js([{**good, "shape": [2**62, 2**62, 1, 1], "data": [0.0]}]), []),
        ("binary size past the body", 400, None, head + x.tobytes()[:-4],
         [f"Inference-Header-Content-Length: {len(head)}"]),
        ("header length past the body", 400, None, head, [f"Inference-Header-Content-Length: {len(head) + 9}"]),
        ("malformed JSON", 400, None, b'{"inputs": [', []),
        ("missing input", 400, None, js([]), []),
        ("body over the limit", 413, None, b"0" * (max_body + 1), []),
        ("BYTES for an FP32 input", 400, None, js([{**good, "datatype": "BYTES", "data": ["a"]}]), []),
        ("unknown output", 400, None, js([good], outputs=[{"name": "zz"}]), []),
    ]


def check_bad_requests(url, client, oracle, max_body):
    for what, status, path, body, headers in bad_requests(url, oracle, max_body):
        code, reply = curl(url, path or "/v2/models/rec/infer", "POST", body,
                           ["Content-Type: application/json", *headers])
        assert code == status, f"{what}: {code} (wanted {status}) {reply[:300]!r}"
        error = json.loads(reply)["error"]
        assert error, what
        print(f"  {what}: {code} {error[:110]}")
        rec_infer(client, oracle, 8, True)  # still serving
    print("bad requests: each a clear 4xx, the server kept serving")


def raw_http(url, data, wait_s=None):
    """Sends `data` on a fresh TCP connection; returns (what came back,
    whether the server closed the connection) after `wait_s` seconds or
    once the server closes it."""
    host, port = url.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(data)
        if wait_s is not None:
            s.settimeout(wait_s)
        got = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return got, True
                got += chunk
                if wait_s is None and b"\r\n\r\n" in got:
                    return got, False
        except socket.timeout:
            return got, False


def check_limits(url, client, oracle, header_timeout_ms):
    # A 2 GB body announced: refused at once (413) without reading it.
    head = (f"POST /v2/models/rec/infer HTTP/1.1\r\nHost: {url}\r\n"
            "Content-Type: application/json\r\nContent-Length: 2000000000\r\n\r\n").encode()
    got, _ = raw_http(url, head)
    assert got.startswith(b"HTTP/1.1 413"), got[:200]
    # Slow loris: half a request head, then nothing. The server closes the
    # connection after header_timeout_ms, and serves others meanwhile.
    host, port = url.rsplit(":", 1)
    idle = socket.create_connection((host, int(port)))
    loris = socket.create_connection((host, int(port)))
    loris.sendall(f"GET /v2/health/live HTTP/1.1\r\nHost: {url}\r\nX-Slow: ".encode())
    started = time.time()
    rec_infer(client, oracle, 13, True)
    for s in (idle, loris):
        s.settimeout(header_timeout_ms / 1000 * 3 + 5)
        try:
            rest = s.recv(65536)
        except ConnectionResetError:
            rest = b""
        assert b"200 OK" not in rest, rest
        s.close()
    took = time.time() - started
    assert took < header_timeout_ms / 1000 * 3 + 5, took
    rec_infer(client, oracle, 14, True)
    print(f"limits: a 2 GB Content-Length refused (413); a silent and a slow-loris connection "
          f"closed after {took:.1f} s (header_timeout_ms {header_timeout_ms}), others served")


def check_repository(client, oracle):
    client.unload_model("minilm")
    assert not client.is_model_ready("minilm")
    try:
        minilm_infer(client, oracle, 9, True)
        raise AssertionError("an unloaded model answered")
    except InferenceServerException as e:
        assert e.status() == "503" or "not loaded" in str(e), e
    index = {m["name"]: m["state"] for m in client.get_model_repository_index()}
    assert index["minilm"] == "UNLOADED", index
    assert client.is_server_ready(), "an unloaded model does not make the server unready"
    client.load_model("minilm")
    assert client.is_model_ready("minilm")
    minilm_infer(client, oracle, 10, True)
    # Placed anew by a config without a path: read from its configured file.
    client.load_model("minilm", config=json.dumps({"devices": "HETERO:node-a/CPU"}))
    assert client.is_model_ready("minilm")
    minilm_infer(client, oracle, 15, True)
    try:
        client.load_model("nope")
        raise AssertionError("loaded an unknown model")
    except InferenceServerException as e:
        assert "nope" in str(e), e
    print("repository: unload, load again, placed anew by a config, unknown model refused: ok")


def check_metrics(url, client, oracle, before):
    after = metrics(url)
    served = sample(after, "tessera_requests_total", model="rec") - sample(before, "tessera_requests_total", model="rec")
    assert served >= 64, f"rec requests counted: {served}"
    failed = sample(after, "tessera_request_failures_total", model="rec", reason="bad_input")
    assert failed >= 1, "bad-input failures are counted"
    # Every request run either succeeded (its latency recorded) or failed.
    count = sample(after, "tessera_request_duration_seconds_count", model="rec") - \
        sample(before, "tessera_request_duration_seconds_count", model="rec")
    failures = sum(v - before.get(k, 0.0) for k, v in after.items()
                   if k[0] == "tessera_request_failures_total" and ("model", "rec") in k[1])
    assert count >= 64 and count + failures >= served, (count, failures, served)
    assert sample(after, "tessera_requests_in_flight", model="rec") == 0
    for w in ("node-a", "node-b"):
        assert sample(after, "tessera_worker_up", worker=w) == 1, w
    links = [k for k in after if k[0] == "tessera_transfer_bytes_total"]
    assert links and sum(after[k] for k in links) > 0, "bytes moved per link"
    compute = [k for k in after if k[0] == "tessera_compute_duration_seconds_count" and ("model", "rec") in k[1]]
    assert len(compute) >= 2, f"compute per subgraph of rec: {compute}"
    assert any(k[0] == "tessera_mailbox_depth" for k in after), "mailbox depth gauges"
    assert any(k[0] == "tessera_queue_duration_seconds_count" for k in after)
    print(f"metrics: {served:.0f} rec requests counted, {len(compute)} subgraph compute histograms, "
          f"{len(links)} links, failures by reason counted")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("models")
    p.add_argument("--phase", default="full", choices=["full", "serving", "loop"])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--requests", type=int, default=0,
                   help="loop: this many requests instead of --seconds")
    p.add_argument("--max-body", type=int, default=1 << 20)
    p.add_argument("--header-timeout-ms", type=int, default=10000)
    args = p.parse_args()
    oracle = Oracle(args.models)
    client = httpclient.InferenceServerClient(url=args.url, network_timeout=300)
    wait_ready(client)
    if args.phase == "serving":
        rec_infer(client, oracle, 11, True)
        minilm_infer(client, oracle, 12, True)
        print("serving: rec and minilm answer correctly")
        return
    if args.phase == "loop":
        print("loop: started", flush=True)
        until, n, slowest = time.time() + args.seconds, 0, 0.0
        while (n < args.requests) if args.requests else (time.time() < until):
            started = time.time()
            rec_infer(client, oracle, n, True)
            minilm_infer(client, oracle, n + 1, n % 2 == 0)
            slowest = max(slowest, time.time() - started)
            n += 2
        took = time.time() - (until - args.seconds)
        print(f"loop: {n} requests in {took:.1f} s answered correctly "
              f"(the slowest pair took {slowest * 1e3:.0f} ms)")
        return
    before = metrics(args.url)
    check_health_and_metadata(client)
    check_inference(client, oracle)
    check_concurrency(args.url, oracle)
    check_curl_endpoints(args.url, oracle, args.models)
    check_bad_requests(args.url, client, oracle, args.max_body)
    check_limits(args.url, client, oracle, args.header_timeout_ms)
    check_metrics(args.url, client, oracle, before)
    check_repository(client, oracle)
    print("kserve: all checks passed")


def run(main):
    """Runs a test script's `main`: a failed check prints FAILED and its
    message and exits 1."""
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    run(main)
