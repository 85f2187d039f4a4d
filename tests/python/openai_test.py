"""Tessera's OpenAI-compatible endpoints through the real `openai` client.

    openai_test.py BASE_URL MODEL EXPECTED_JSON

MODEL is a named model of the coordinator's cluster.toml (a generative
model folder) served as two copies, each keeping 2 sequences and queueing
2 more. EXPECTED_JSON holds onnxruntime-genai's greedy texts: {"plain":
{prompt, text}, "chat": {prompt, text}}. Besides the texts it checks
sampling (unseeded completions differ, seeded ones are equal), unique
completion ids, log-probabilities, usage (whole, and a stream's last
chunk with include_usage) against /tokenize's counts, stop strings,
/health, /v1/models' context, /tokenize and /detokenize, 8 generations at
once (all queued and answered with the text each gets alone) and a full
queue (429 with Retry-After, never a 500). Exits non-zero on the first
failure.
"""

import concurrent.futures
import json
import sys
import time

import urllib.error
import urllib.request

import openai

from http_json import post


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok' if ok else 'FAIL'}: {name} {detail}")
    if not ok:
        sys.exit(1)


def main() -> None:
    base, model, expected_json = sys.argv[1], sys.argv[2], sys.argv[3]
    expected = json.loads(expected_json)
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=60)
    # The named model loads by itself when the coordinator starts.
    deadline = time.monotonic() + 120
    models: list[str] = []
    while model not in models and time.monotonic() < deadline:
        try:
            models = [m.id for m in client.models.list().data]
        except openai.APIConnectionError:
            pass
        if model not in models:
            time.sleep(0.5)
    check("/v1/models lists the generative model", model in models, repr(models))

    plain, chat = expected["plain"], expected["chat"]
    done = client.completions.create(
        model=model, prompt=plain["prompt"], max_tokens=plain["max_tokens"], temperature=0
    )
    check("completion equals onnxruntime-genai", done.choices[0].text == plain["text"],
          repr(done.choices[0].text))
    check("usage counts the tokens", done.usage.completion_tokens == plain["max_tokens"], repr(done.usage))

    parts = client.completions.create(
        model=model, prompt=plain["prompt"], max_tokens=plain["max_tokens"], temperature=0, stream=True
    )
    streamed = "".join(c.choices[0].text for c in parts)
    check("streamed completion equals the whole", streamed == plain["text"], repr(streamed))

    messages = [{"role": "user", "content": chat["prompt"]}]
    answer = client.chat.completions.create(
        model=model, messages=messages, max_tokens=chat["max_tokens"], temperature=0
    )
    text = answer.choices[0].message.content
    check("chat equals onnxruntime-genai", text == chat["text"], repr(text))
    check("chat has the assistant's role", answer.choices[0].message.role == "assistant")

    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=chat["max_tokens"], temperature=0, stream=True
    )
    chunks = list(stream)
    deltas = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check("streamed chat equals the whole", deltas == text, repr(deltas))
    check("the stream ends with a finish reason", finish in (["stop"], ["length"]), repr(finish))

    for name, call, error in [
        ("an unknown model is 404", lambda: client.completions.create(model="nope", prompt="x"),
         openai.NotFoundError),
        ("a negative temperature is 400", lambda: client.completions.create(
            model=model, prompt="x", temperature=-1), openai.BadRequestError),
        ("n=2 is 400", lambda: client.completions.create(model=model, prompt="x", n=2),
         openai.BadRequestError),
        ("an empty prompt is 400", lambda: client.completions.create(model=model, prompt=""),
         openai.BadRequestError),
    ]:
        try:
            call()
            check(name, False, "no error")
        except error as e:
            check(name, True, str(e)[:120])
    again = client.completions.create(model=model, prompt=plain["prompt"], max_tokens=2, temperature=0)
    check("still serving after the bad requests", len(again.choices[0].text) > 0)

    check_sampling(client, model)
    check_logprobs(client, model)
    check_conventions(client, base, model, plain, chat)
    check_queue(client, base, model)


def check_conventions(client, base, model, plain, chat):
    root = base.removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/health", timeout=30) as r:
        check("/health is 200 while a model serves", r.status == 200)
    with urllib.request.urlopen(f"{base}/models", timeout=30) as r:
        listed = {m["id"]: m for m in json.loads(r.read())["data"]}
    check("/v1/models gives the context and the task",
          listed[model].get("max_model_len") == 256 and listed[model].get("task") == "generate",
          repr(listed[model]))

    # /tokenize counts what a completion's usage counts, a prompt and a chat.
    status, t = post(f"{root}/tokenize", {"model": model, "prompt": plain["prompt"]})
    check("/tokenize answers", status == 200 and t["count"] == len(t["tokens"])
          and t["max_model_len"] == 256, repr(t))
    done = client.completions.create(model=model, prompt=plain["prompt"], max_tokens=2, temperature=0)
    check("/tokenize's count is the completion's prompt tokens",
          t["count"] == done.usage.prompt_tokens, f"{t['count']} vs {done.usage!r}")
    status, bare = post(f"{root}/tokenize", {"prompt": plain["prompt"], "add_special_tokens": False})
    status, back = post(f"{root}/detokenize", {"model": model, "tokens": bare["tokens"]})
    check("/detokenize gives the prompt back", status == 200 and back["prompt"] == plain["prompt"],
          repr(back))
    status, err = post(f"{root}/detokenize", {"model": model, "tokens": [10**9]})
    check("/detokenize refuses an id beyond the vocabulary", status == 400, repr(err))
    status, err = post(f"{root}/tokenize", {"model": "nope", "prompt": "x"})
    check("/tokenize of an unknown model is 404", status == 404, repr(err))

    messages = [{"role": "user", "content": chat["prompt"]}]
    status, tm = post(f"{root}/tokenize", {"model": model, "messages": messages})
    stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=chat["max_tokens"], temperature=0, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    last = chunks[-1]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    check("include_usage ends the stream with the usage alone",
          last.choices == [] and last.usage is not None
          and all(c.usage is None for c in chunks[:-1]), repr(last))
    whole = client.chat.completions.create(model=model, messages=messages,
                                           max_tokens=chat["max_tokens"], temperature=0)
    check("the stream's usage is the true counts",
          last.usage.prompt_tokens == tm["count"]
          and last.usage.completion_tokens == whole.usage.completion_tokens
          and last.usage.total_tokens == tm["count"] + whole.usage.completion_tokens
          and text == whole.choices[0].message.content, f"{last.usage!r} {tm['count']} {whole.usage!r}")
    plain_stream = list(client.completions.create(
        model=model, prompt=plain["prompt"], max_tokens=3, temperature=0, stream=True))
    check("no usage in a stream unless asked", all(getattr(c, "usage", None) is None for c in plain_stream))

    # stop: the text ends before the first stop string, finish "stop".
    words = plain["text"].split()
    stop = next((w for w in words[1:] if plain["text"].index(w) > 0), None)
    if stop is not None:
        cut = client.completions.create(model=model, prompt=plain["prompt"],
                                        max_tokens=plain["max_tokens"], temperature=0, stop=[stop])
        check("stop ends the text before it",
              cut.choices[0].text == plain["text"][:plain["text"].index(stop)]
              and cut.choices[0].finish_reason == "stop", repr(cut.choices[0]))
    for name, extra in [("echo", {"echo": True}), ("best_of=2", {"best_of": 2})]:
        try:
            client.completions.create(model=model, prompt="x", max_tokens=2, **extra)
            check(f"{name} is refused", False, "no error")
        except openai.BadRequestError as e:
            check(f"{name} is refused, not ignored", True, str(e)[:80])


def check_sampling(client, model):
    hot = dict(model=model, prompt="Once upon a time", max_tokens=12, temperature=1.0)
    unseeded = [client.completions.create(**hot) for _ in range(3)]
    texts = [c.choices[0].text for c in unseeded]
    check("unseeded completions at temperature 1 differ", len(set(texts)) > 1, repr(texts))
    seeded = [client.completions.create(seed=7, **hot).choices[0].text for _ in range(2)]
    check("seeded completions are equal", seeded[0] == seeded[1], repr(seeded))
    ids = [c.id for c in unseeded]
    check("completion ids are unique", len(set(ids)) == len(ids), repr(ids))


def check_logprobs(client, model):
    done = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4,
                                     temperature=0, logprobs=2)
    lp = done.choices[0].logprobs
    check("completion logprobs: one per token", len(lp.token_logprobs) == 4 and len(lp.tokens) == 4,
          repr(lp))
    check("completion logprobs: the two most likely each", all(len(t) <= 2 for t in lp.top_logprobs)
          and all(v <= 0 for v in lp.token_logprobs), repr(lp.top_logprobs))
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=3, temperature=0, logprobs=True, top_logprobs=1)
    content = chat.choices[0].logprobs.content
    check("chat logprobs: one per token", len(content) == 3 and all(len(c.top_logprobs) == 1 for c in content),
          repr(content))


def check_queue(client, base, model):
    prompts = [f"Story number {i}:" for i in range(12)]
    alone = {p: client.completions.create(model=model, prompt=p, max_tokens=16, temperature=0)
             .choices[0].text for p in prompts[:8]}
    # 8 at once on two copies of 2 sequences and 2 queued each: all run.
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda p: client.completions.create(
            model=model, prompt=p, max_tokens=16, temperature=0).choices[0].text, prompts[:8]))
    check("8 generations at once each equal their text alone",
          got == [alone[p] for p in prompts[:8]], repr(got))
    # 12 at once: beyond the places and the queues, refused as busy.
    def raw(p):
        body = json.dumps({"model": model, "prompt": p, "max_tokens": 48, "temperature": 0}).encode()
        req = urllib.request.Request(f"{base}/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, r.headers.get("retry-after")
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("retry-after")
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(raw, prompts))
    statuses = sorted(c for c, _ in codes)
    check("a full queue answers 429 with Retry-After, never 500",
          429 in statuses and all(c in (200, 429) for c in statuses)
          and all(r is not None for c, r in codes if c == 429), repr(codes))


if __name__ == "__main__":
    main()
