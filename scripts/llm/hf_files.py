"""The JSON files next to model.onnx: a transformers-style config.json,
the Hugging Face tokenizer files and onnxruntime-genai's genai_config.json.

The tokenizer is rebuilt from the GGUF vocabulary (tokenizer.ggml.*): a
byte-level BPE with SmolLM2's pre-tokenizer (each digit on its own, then
GPT-2's byte-level split), the layout of SmolLM2's own tokenizer.json. It
loads with the `tokenizers` library and with onnxruntime-genai's tokenizer.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import gguf

from llama_config import LlamaConfig, hf_config_json

# gguf.TokenType values that become added (special-cased) tokens.
_ADDED_TOKEN_TYPES = {int(gguf.TokenType.CONTROL), int(gguf.TokenType.USER_DEFINED)}


@dataclass(frozen=True)
class Vocabulary:
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    chat_template: str
    add_bos_token: bool
    unk_token_id: int


def vocabulary_from_gguf(reader: gguf.GGUFReader) -> Vocabulary:
    def field(key, default=None):
        found = reader.get_field(key)
        return default if found is None else found.contents()

    model = field("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"unsupported tokenizer.ggml.model {model!r} (want gpt2 byte-level BPE)")
    return Vocabulary(
        tokens=field("tokenizer.ggml.tokens"),
        token_types=[int(t) for t in field("tokenizer.ggml.token_type")],
        merges=field("tokenizer.ggml.merges"),
        chat_template=field("tokenizer.chat_template", ""),
        add_bos_token=bool(field("tokenizer.ggml.add_bos_token", False)),
        unk_token_id=int(field("tokenizer.ggml.unknown_token_id", 0)),
    )


def _added_tokens(vocab: Vocabulary) -> list[dict]:
    return [
        {
            "id": token_id,
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": kind == int(gguf.TokenType.CONTROL),
        }
        for token_id, (token, kind) in enumerate(zip(vocab.tokens, vocab.token_types))
        if kind in _ADDED_TOKEN_TYPES
    ]


def tokenizer_json(vocab: Vocabulary) -> dict:
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": True,
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(vocab),
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level],
        },
        "post_processor": {**byte_level, "trim_offsets": False},
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {token: token_id for token_id, token in enumerate(vocab.tokens)},
            "merges": vocab.merges,
        },
    }


def tokenizer_config_json(vocab: Vocabulary, config: LlamaConfig) -> dict:
    added = {
        str(token["id"]): {key: value for key, value in token.items() if key != "id"}
        for token in _added_tokens(vocab)
    }
    return {
        "add_bos_token": vocab.add_bos_token,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        **special_tokens_map(vocab, config),
        "chat_template": vocab.chat_template,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config.context_length,
        "tokenizer_class": "GPT2Tokenizer",
    }


def special_tokens_map(vocab: Vocabulary, config: LlamaConfig) -> dict:
    return {
        "bos_token": vocab.tokens[config.bos_token_id],
        "eos_token": vocab.tokens[config.eos_token_id],
        "pad_token": vocab.tokens[config.pad_token_id],
        "unk_token": vocab.tokens[vocab.unk_token_id],
    }


def genai_config_json(config: LlamaConfig) -> dict:
    """onnxruntime-genai's model description (schema of its builder's output)."""
    return {
        "model": {
            "bos_token_id": config.bos_token_id,
            "context_length": config.context_length,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx",
                "head_size": config.head_dim,
                "hidden_size": config.hidden_size,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "position_ids": "position_ids",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": config.num_heads,
                "num_hidden_layers": config.num_layers,
                "num_key_value_heads": config.num_kv_heads,
            },
            "eos_token_id": config.eos_token_id,
            "pad_token_id": config.pad_token_id,
            "type": "llama",
            "vocab_size": config.vocab_size,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": config.context_length,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }


def write_json(path: Path, content: dict) -> None:
    path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_support_files(out_dir: Path, config: LlamaConfig, vocab: Vocabulary) -> None:
    """config.json, genai_config.json and the three tokenizer files."""
    write_json(out_dir / "config.json", hf_config_json(config))
    write_json(out_dir / "tokenizer.json", tokenizer_json(vocab))
    write_json(out_dir / "tokenizer_config.json", tokenizer_config_json(vocab, config))
    write_json(out_dir / "special_tokens_map.json", special_tokens_map(vocab, config))
    write_json(out_dir / "genai_config.json", genai_config_json(config))
