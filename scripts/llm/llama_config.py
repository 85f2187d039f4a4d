"""Hyperparameters of a llama-architecture decoder, read from GGUF metadata
and written to / read from a transformers-style config.json.

The same dataclass drives the ONNX graph builder, the genai_config.json
writer and the numpy reference forward, so the real model and the tiny test
model share every line of code that depends on the architecture.
"""

from dataclasses import dataclass, replace

import gguf


@dataclass(frozen=True)
class LlamaConfig:
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    rope_theta: float
    rms_eps: float
    context_length: int
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int
    # False where the GGUF has its own output head (output.weight), as most
    # llama models larger than ~1B do; True: the head is the embedding.
    tie_word_embeddings: bool = True

    @property
    def kv_groups(self) -> int:
        """Query heads that share one key/value head."""
        return self.num_heads // self.num_kv_heads


def _field(reader: gguf.GGUFReader, key: str):
    field = reader.get_field(key)
    if field is None:
        raise KeyError(f"GGUF metadata has no {key}")
    return field.contents()


def config_from_gguf(reader: gguf.GGUFReader) -> LlamaConfig:
    """The llama hyperparameters stored in a GGUF file's metadata."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"unsupported GGUF architecture {arch!r} (want llama)")
    if reader.get_field("llama.rope.scaling.type") is not None:
        raise ValueError("scaled RoPE is not supported")
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    key_length = reader.get_field("llama.attention.key_length")
    eos = int(_field(reader, "tokenizer.ggml.eos_token_id"))
    pad = reader.get_field("tokenizer.ggml.padding_token_id")
    config = LlamaConfig(
        num_layers=int(_field(reader, "llama.block_count")),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        head_dim=int(key_length.contents()) if key_length is not None else hidden // heads,
        ffn_size=int(_field(reader, "llama.feed_forward_length")),
        vocab_size=len(_field(reader, "tokenizer.ggml.tokens")),
        rope_theta=float(_field(reader, "llama.rope.freq_base")),
        rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        context_length=int(_field(reader, "llama.context_length")),
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=eos,
        # Many GGUFs name no padding token; padded positions are masked, so
        # any id serves, and onnxruntime-genai's configs use end-of-sequence.
        pad_token_id=int(pad.contents()) if pad is not None else eos,
        tie_word_embeddings=all(t.name != "output.weight" for t in reader.tensors),
    )
    rope_dims = reader.get_field("llama.rope.dimension_count")
    if rope_dims is not None and int(rope_dims.contents()) != config.head_dim:
        raise ValueError("partial RoPE (rope.dimension_count != head_dim) is not supported")
    return config


def hf_config_json(config: LlamaConfig) -> dict:
    """The model's transformers-style config.json (read back by check_model.py)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.ffn_size,
        "max_position_embeddings": config.context_length,
        "num_attention_heads": config.num_heads,
        "num_hidden_layers": config.num_layers,
        "num_key_value_heads": config.num_kv_heads,
        "rms_norm_eps": config.rms_eps,
        "rope_scaling": None,
        "rope_theta": config.rope_theta,
        "tie_word_embeddings": config.tie_word_embeddings,
        "torch_dtype": "float32",
        "vocab_size": config.vocab_size,
    }


def config_from_hf_json(content: dict) -> LlamaConfig:
    """The inverse of hf_config_json."""
    return LlamaConfig(
        num_layers=content["num_hidden_layers"],
        hidden_size=content["hidden_size"],
        num_heads=content["num_attention_heads"],
        num_kv_heads=content["num_key_value_heads"],
        head_dim=content["head_dim"],
        ffn_size=content["intermediate_size"],
        vocab_size=content["vocab_size"],
        rope_theta=content["rope_theta"],
        rms_eps=content["rms_norm_eps"],
        context_length=content["max_position_embeddings"],
        bos_token_id=content["bos_token_id"],
        eos_token_id=content["eos_token_id"],
        pad_token_id=content["pad_token_id"],
        tie_word_embeddings=content.get("tie_word_embeddings", True),
    )


def tiny_config(base: LlamaConfig) -> LlamaConfig:
    """A 2-layer model with the base model's vocabulary and special tokens."""
    return replace(
        base,
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        ffn_size=128,
        context_length=512,
        tie_word_embeddings=True,
    )
