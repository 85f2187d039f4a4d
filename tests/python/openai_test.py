"""Tessera's OpenAI-compatible endpoints through the real `openai` client.

    openai_test.py BASE_URL MODEL EXPECTED_JSON

MODEL is a named model of the coordinator's cluster.toml (a generative
model folder). EXPECTED_JSON holds onnxruntime-genai's greedy texts: {"plain": {prompt,
text}, "chat": {prompt, text}}. Exits non-zero on the first failure.
"""

import json
import sys
import time

import openai


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


if __name__ == "__main__":
    main()
