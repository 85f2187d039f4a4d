"""onnxruntime's MiniLM embeddings/s in one process on one thread: the
reference of the cluster bench's `embeddings` mode.

    ort_embeddings.py MODEL TOKENIZER TEXTS_JSON SINGLES BATCHES

Tokenizes as the front door does (the tokenizer's special tokens, padded
to the longest of a batch), runs the model, mean-pools and normalizes;
prints {"batch_1": embeddings/s, "batch_32": embeddings/s}.
"""

import json
import sys
import time

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

OUTPUT = "onnx::Shape_422"


def main() -> None:
    model, tokenizer, texts, singles, batches = sys.argv[1:6]
    texts = json.loads(texts)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_file(tokenizer)
    tok.enable_truncation(max_length=128)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")

    def embed(batch):
        enc = tok.encode_batch(batch)
        ids = np.array([e.ids for e in enc], np.int64)
        mask = np.array([e.attention_mask for e in enc], np.int64)
        hidden = session.run([OUTPUT], {"input_ids": ids, "attention_mask": mask})[0]
        m = mask[..., None].astype(np.float32)
        v = (hidden * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    embed(texts)
    started = time.perf_counter()
    for i in range(int(singles)):
        embed([texts[i % len(texts)]])
    one = int(singles) / (time.perf_counter() - started)
    started = time.perf_counter()
    for _ in range(int(batches)):
        embed(texts)
    many = int(batches) * len(texts) / (time.perf_counter() - started)
    print(json.dumps({"batch_1": one, "batch_32": many}))


if __name__ == "__main__":
    main()
