"""Tessera's /v1/embeddings through the real `openai` client, against a
reference computed here with onnxruntime, the `tokenizers` package and the
pooling the model's sentence-transformers config names.

    embeddings_test.py BASE_URL MODEL ONNX OUTPUT TOKENIZER MODULES POOLING

MODEL is a named model of the coordinator's cluster.toml declared as an
embedding one; ONNX its file and OUTPUT its token vectors' output;
TOKENIZER its tokenizer.json; MODULES and POOLING sentence-transformers'
modules.json and 1_Pooling/config.json (mean or CLS pooling, Normalize or
not). Checks texts one and 32 at a time, 16 requests at once, float and
base64, token-id input, usage, /v1/models' listing, an over-long input refused and truncated when
asked, and that related sentences are nearer than unrelated ones. Exits
non-zero on the first failure.
"""

import base64
import concurrent.futures
import json
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import onnxruntime as ort
import openai
from tokenizers import Tokenizer

from http_json import post

TOLERANCE = 1e-5


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok' if ok else 'FAIL'}: {name} {detail}")
    if not ok:
        sys.exit(1)


class Reference:
    def __init__(self, onnx, output, tokenizer, modules, pooling, max_length):
        self.session = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])
        self.output = output
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.tokenizer = Tokenizer.from_file(tokenizer)
        self.tokenizer.enable_truncation(max_length=max_length)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self.normalize = any(m["type"].endswith("Normalize") for m in json.load(open(modules)))
        config = json.load(open(pooling))
        self.cls = config.get("pooling_mode_cls_token", False)
        assert self.cls or config.get("pooling_mode_mean_tokens"), config

    def ids(self, text):
        self.tokenizer.no_padding()
        ids = self.tokenizer.encode(text).ids
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        return ids

    def __call__(self, texts):
        enc = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in enc], np.int64)
        mask = np.array([e.attention_mask for e in enc], np.int64)
        feed = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        hidden = self.session.run([self.output], feed)[0]
        if self.cls:
            v = hidden[:, 0]
        else:
            m = mask[..., None].astype(np.float32)
            v = (hidden * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
        if self.normalize:
            v = v / np.clip(np.linalg.norm(v, axis=1, keepdims=True), 1e-12, None)
        return v, int(mask.sum())


def vectors(answer):
    return np.array([d.embedding for d in sorted(answer.data, key=lambda d: d.index)], np.float32)


SENTENCES = [
    "A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
    "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.", "A monkey is playing drums.",
    "Someone in a gorilla costume is playing a set of drums.", "The cat sits outside",
    "A man is playing guitar", "The new movie is awesome", "The new movie is so great",
    "I love pasta", "Do you like pizza?", "Tessera splits models over many machines.",
    "Quantum computers factor large numbers.", "Paris is the capital of France.",
    "Berlin is the capital of Germany.", "She sells sea shells by the sea shore.",
    "Émile a mangé une crêpe à Montréal.", "naïve café résumé", "東京は日本の首都です。",
    "Hello, world!", "What's the weather like today?", "It is raining cats and dogs.",
    "The quick brown fox jumps over the lazy dog.", "Lorem ipsum dolor sit amet.",
    "A very short one.", "x", "", "Numbers like 3.14159 and 2.71828 are famous.",
]


def main() -> None:
    base, model, onnx, output, tokenizer, modules, pooling = sys.argv[1:8]
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=120)
    deadline = time.monotonic() + 180
    listed = {}
    while model not in listed and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base}/models", timeout=30) as r:
                listed = {m["id"]: m for m in json.loads(r.read())["data"]}
        except (urllib.error.URLError, ConnectionError):
            pass
        if model not in listed:
            time.sleep(0.5)
    check("/v1/models lists the embedding model", listed.get(model, {}).get("task") == "embed",
          repr(listed.get(model)))
    max_length = listed[model]["max_model_len"]
    ref = Reference(onnx, output, tokenizer, modules, pooling, max_length)

    # One text; the client asks for base64 by default and decodes it.
    one = client.embeddings.create(model=model, input=SENTENCES[0])
    want, tokens = ref(SENTENCES[:1])
    got = vectors(one)
    diff = float(np.abs(got - want).max())
    check("one text equals the reference", got.shape == want.shape and diff <= TOLERANCE,
          f"max |diff| {diff:.2e}, shape {got.shape}")
    check("usage counts its tokens", one.usage.prompt_tokens == tokens
          and one.usage.total_tokens == tokens, repr(one.usage))

    # 32 texts at once, as floats.
    many = client.embeddings.create(model=model, input=SENTENCES, encoding_format="float")
    want, tokens = ref(SENTENCES)
    got = vectors(many)
    diff = float(np.abs(got - want).max())
    check("32 texts equal the reference", got.shape == want.shape and diff <= TOLERANCE,
          f"max |diff| {diff:.2e}")
    check("usage counts every input's tokens", many.usage.prompt_tokens == tokens,
          f"{many.usage!r} vs {tokens}")
    status, raw = post(f"{base}/embeddings", {"model": model, "input": SENTENCES[:2],
                                              "encoding_format": "base64"})
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4")
                        for d in raw["data"]])
    check("base64 is the same float32 vectors", status == 200
          and np.array_equal(decoded, got[:2]), f"{status}")

    # 16 requests of one text at once: the worker batches those of one
    # length (max_batch), each answer its own text's.
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        alone = list(pool.map(lambda t: vectors(client.embeddings.create(
            model=model, input=t, encoding_format="float"))[0], SENTENCES[:16]))
    want = np.stack([ref([t])[0][0] for t in SENTENCES[:16]])
    diff = float(np.abs(np.stack(alone) - want).max())
    check("16 requests at once each get their own text's vector", diff <= TOLERANCE, f"{diff:.2e}")

    unit = got / np.linalg.norm(got, axis=1, keepdims=True)
    sim = unit @ unit.T
    check("related sentences are nearer than unrelated ones",
          sim[0, 1] > sim[0, 15] and sim[11, 12] > sim[11, 16], f"{sim[0, 1]:.3f} {sim[0, 15]:.3f}")

    # Token ids, as they are (the special tokens the tokenizer adds included).
    ids = ref.ids(SENTENCES[3])
    by_ids = vectors(client.embeddings.create(model=model, input=[ids, ref.ids(SENTENCES[4])],
                                              encoding_format="float"))
    diff = float(np.abs(by_ids - got[3:5]).max())
    check("token-id input gives the text's vectors", diff <= TOLERANCE, f"{diff:.2e}")

    long = " ".join(["word"] * (max_length + 40))
    status, err = post(f"{base}/embeddings", {"model": model, "input": ["short", long]})
    check("an input beyond the model's length is refused, clearly",
          status == 400 and str(max_length) in json.dumps(err), f"{status} {err}")
    status, cut = post(f"{base}/embeddings", {"model": model, "input": long, "truncate": True})
    want, tokens = ref([long])
    diff = float(np.abs(np.array(cut["data"][0]["embedding"]) - want[0]).max()) if status == 200 else 1
    check("truncate: true cuts it to the model's length", status == 200 and diff <= TOLERANCE
          and cut["usage"]["prompt_tokens"] == max_length, f"{status} {diff:.2e}")
    status, cut = post(f"{base}/embeddings", {"model": model, "input": long,
                                              "truncate_prompt_tokens": 16})
    check("truncate_prompt_tokens cuts it to that many", status == 200
          and cut["usage"]["prompt_tokens"] == 16, f"{status} {cut.get('usage')}")
    for name, body, code in [
        ("an unknown model is 404", {"model": "nope", "input": "x"}, 404),
        ("a bad encoding_format is 400", {"model": model, "input": "x", "encoding_format": "hex"}, 400),
        ("a token beyond the vocabulary is 400", {"model": model, "input": [[10**8]]}, 400),
        ("no input is 400", {"model": model, "input": []}, 400),
        ("other dimensions are 400", {"model": model, "input": "x", "dimensions": 7}, 400),
    ]:
        status, err = post(f"{base}/embeddings", body)
        check(name, status == code and "error" in err, f"{status} {err}")
    again = client.embeddings.create(model=model, input="still serving")
    check("still serving after the bad requests", len(again.data[0].embedding) == got.shape[1])


if __name__ == "__main__":
    main()
