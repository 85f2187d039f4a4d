"""JSON over HTTP for the front-door tests: a POST's status and answer,
errors included (urllib raises on 4xx/5xx)."""

import json
import urllib.error
import urllib.request


def post(url, body, timeout=60):
    """POSTs `body` as JSON; the status and the JSON answer."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
