"""Streams one greedy completion through the real `openai` client.

    openai_stream.py BASE_URL MODEL PROMPT MAX_TOKENS

Waits (up to 120 s) for MODEL to be listed, prints `chunk: N` after each
streamed chunk (flushed, so that a test can act mid-stream), then
`text: ` and the whole text as JSON. Exits non-zero on an error.
"""

import json
import sys
import time

import openai


def main() -> None:
    base, model, prompt, max_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
    deadline = time.monotonic() + 120
    while True:
        try:
            if model in [m.id for m in client.models.list().data]:
                break
        except openai.APIConnectionError:
            pass
        if time.monotonic() > deadline:
            sys.exit(f"{model} was not listed within 120 s")
        time.sleep(0.5)
    parts = client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
    )
    text = []
    for n, chunk in enumerate(parts, 1):
        text.append(chunk.choices[0].text)
        print(f"chunk: {n}", flush=True)
    print("text: " + json.dumps("".join(text)), flush=True)


if __name__ == "__main__":
    main()
