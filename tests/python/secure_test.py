#!/usr/bin/env python3
"""A locked-down Tessera coordinator: HTTPS with the cluster certificate,
bearer tokens from a file, model control off (the defaults).

Usage: secure_test.py HOST:PORT MODELS_DIR --ca CA_PEM --tokens FILE

Checks with curl and Triton's HTTP client (tritonclient[http]==2.73.0,
ssl=True, verified against the cluster CA): liveness needs no token;
everything else answers 401 without a token or with a wrong one, and
serves with a right one (inference compared with onnxruntime); plain HTTP
on the TLS port gets no answer; load and unload are refused with 403 (and
the `/etc/shadow` probe learns nothing); a token written to the tokens
file works a second later and a removed one stops working.
"""
import argparse
import json
import subprocess
import time

import tritonclient.http as httpclient

from kserve_test import Oracle, run


def curl(url, path, ca, token=None, method="GET", data=None, scheme="https"):
    cmd = ["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", "-X", method,
           "--cacert", ca, f"{scheme}://{url}{path}"]
    if token:
        cmd += ["-H", f"Authorization: Bearer {token}"]
    if data is not None:
        cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
    out = subprocess.run(cmd, input=data, capture_output=True)
    body, _, code = out.stdout.rpartition(b"\n")
    return int(code or 0), body, out.returncode


def check_tokens(url, ca, token):
    # The health probes are open (Kubernetes' kubelet sends no token).
    for path in ("/v2/health/live", "/v2/health/ready"):
        assert curl(url, path, ca)[0] == 200, f"{path} is open"
    for path in ("/v2", "/v2/models/rec", "/metrics", "/v1/models"):
        for who in (None, "not-a-token", token + "x"):
            code, body, _ = curl(url, path, ca, who)
            assert code == 401, f"{path} with {who!r}: {code} {body[:200]!r}"
            assert json.loads(body)["error"], body
        code, body, _ = curl(url, path, ca, token)
        assert code == 200, f"{path} with the token: {code} {body[:200]!r}"
    # The token never shows in an answer.
    code, body, _ = curl(url, "/v2/models/nope", ca, token)
    assert code == 404 and token.encode() not in body, body
    print("tokens: liveness and readiness open; 5 endpoints 401 without, with a wrong and with a near token; 200 with it")


def check_plain_http_refused(url, ca, token):
    code, body, rc = curl(url, "/v2/health/live", ca, token, scheme="http")
    assert rc != 0 and code == 0, f"plain HTTP on the TLS port answered: {code} {body[:200]!r}"
    print(f"plain HTTP to the TLS port: no answer (curl exit {rc})")


def check_model_control_off(url, ca, token):
    probe = json.dumps({"parameters": {"config": json.dumps({"path": "/etc/shadow"})}}).encode()
    replies = []
    for path, body in (("/v2/repository/models/rec/unload", b""), ("/v2/repository/models/rec/load", b""),
                       ("/v2/repository/models/x/load", probe)):
        code, reply, _ = curl(url, path, ca, token, "POST", body)
        assert code == 403, f"POST {path}: {code} {reply[:200]!r}"
        assert b"model_control" in reply, reply
        replies.append(reply)
    assert replies[1] == replies[2], "the /etc/shadow probe is answered as any load is"
    assert curl(url, "/v2/models/rec/ready", ca, token)[0] == 200, "a refused unload left rec alone"
    print(f"model control off: load and unload 403 ({json.loads(replies[0])['error'][:90]}...)")


def triton_client(url, ca, token):
    import gevent.ssl
    client = httpclient.InferenceServerClient(
        url, ssl=True, network_timeout=300,
        ssl_context_factory=lambda: gevent.ssl.create_default_context(cafile=ca))
    return client, {"Authorization": f"Bearer {token}"}


def check_triton_client(url, ca, token, oracle):
    client, headers = triton_client(url, ca, token)
    assert client.is_server_ready(headers=headers)
    x = oracle.rec_input(21)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    res = client.infer("rec", [inp], headers=headers)
    got = res.as_numpy(oracle.rec_out)
    want = oracle.rec.run(None, {"x": x})[0]
    diff = float(abs(got - want).max())
    assert diff <= 1e-4 * max(1.0, float(abs(want).max())), diff
    try:
        client.get_server_metadata()
        raise AssertionError("metadata answered without a token")
    except Exception as e:
        assert "401" in str(e) or "nauthor" in str(e) or "token" in str(e), e
    print(f"tritonclient over HTTPS with a token: rec matches onnxruntime (max abs diff {diff:.2e}); "
          "no token refused")


def write_tokens_and_wait(url, ca, tokens_file, token, text):
    """Rewrites the tokens file; waits until `token` is accepted."""
    with open(tokens_file, "w") as f:
        f.write(text)
    deadline = time.time() + 10
    while curl(url, "/v2", ca, token)[0] != 200:
        assert time.time() < deadline, f"{text!r}: the token was not accepted within 10 s"
        time.sleep(0.3)


def check_rotation(url, ca, tokens_file, token):
    new = "rotated-" + token[::-1]
    write_tokens_and_wait(url, ca, tokens_file, new, f"# rotated\n{new}\n")
    assert curl(url, "/v2", ca, token)[0] == 401, "the removed token still works"
    write_tokens_and_wait(url, ca, tokens_file, token, f"{token}\n")
    print("tokens file rewritten: the new token works and the removed one is refused, without a restart")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("models")
    p.add_argument("--ca", required=True)
    p.add_argument("--tokens", required=True)
    args = p.parse_args()
    with open(args.tokens) as f:
        token = next(l.strip() for l in f if l.strip() and not l.startswith("#"))
    oracle = Oracle(args.models)
    until = time.time() + 180
    while curl(args.url, "/v2/health/ready", args.ca, token)[0] != 200:
        assert time.time() < until, "not ready within 180 s"
        time.sleep(0.5)
    check_tokens(args.url, args.ca, token)
    check_plain_http_refused(args.url, args.ca, token)
    check_model_control_off(args.url, args.ca, token)
    check_triton_client(args.url, args.ca, token, oracle)
    check_rotation(args.url, args.ca, args.tokens, token)
    print("secure: all checks passed")


if __name__ == "__main__":
    run(main)
