//! A built GGUF written as an onnxruntime-genai folder (`tessera convert`):
//! `model.onnx` with its weights in `model.onnx.data`, `genai_config.json`
//! (written last: a folder that has it is complete), `tokenizer.json`,
//! `tokenizer_config.json` and `special_tokens_map.json`. onnxruntime-genai
//! and Tessera's folder loading both read it.

use std::io::Write;
use std::path::Path;

use serde_json::{json, Value as Json};
use tessera_common::onnx::proto::{
    tensor_proto::DataLocation, StringStringEntryProto, TensorProto,
};

use crate::model::GgufModel;
use crate::vocab::Kind;
use crate::GgufError;

pub const MODEL_FILE: &str = "model.onnx";
pub const DATA_FILE: &str = "model.onnx.data";
/// Initializers of at most this many bytes stay inside `model.onnx`.
const INLINE_AT_MOST: usize = 1024;
/// Offsets of weights in the data file are multiples of this.
const DATA_ALIGNMENT: u64 = 64;

/// What [`fn@write`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub model_bytes: u64,
    pub data_bytes: u64,
}

/// Writes `model` into `dir` (created if missing).
pub fn write(model: GgufModel, dir: &Path) -> Result<Written, GgufError> {
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| GgufError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let genai = dir.join("genai_config.json");
    if genai.exists() {
        std::fs::remove_file(&genai).map_err(io(&genai))?;
    }
    let GgufModel {
        config,
        vocab,
        mut model,
        tokenizer_json,
    } = model;
    let data_path = dir.join(DATA_FILE);
    let data_file = std::fs::File::create(&data_path).map_err(io(&data_path))?;
    let mut data = std::io::BufWriter::with_capacity(1 << 20, data_file);
    let mut offset = 0u64;
    if let Some(graph) = model.graph.as_mut() {
        for t in &mut graph.initializer {
            offset = externalize(t, &mut data, offset).map_err(io(&data_path))?;
        }
    }
    data.flush().map_err(io(&data_path))?;
    let model_path = dir.join(MODEL_FILE);
    let encoded = tessera_common::onnx::encode_model(&model);
    std::fs::write(&model_path, &encoded).map_err(io(&model_path))?;
    let files: [(&str, Json); 3] = [
        ("tokenizer_config.json", tokenizer_config(&vocab, &config)),
        ("special_tokens_map.json", special_tokens(&vocab)),
        ("genai_config.json", genai_config(&vocab, &config)),
    ];
    let tok = dir.join("tokenizer.json");
    std::fs::write(&tok, tokenizer_json).map_err(io(&tok))?;
    for (name, content) in files {
        let path = dir.join(name);
        let text = serde_json::to_string_pretty(&content).unwrap_or_default();
        std::fs::write(&path, text + "\n").map_err(io(&path))?;
    }
    Ok(Written {
        model_bytes: encoded.len() as u64,
        data_bytes: offset,
    })
}

/// Moves a large initializer's bytes to the data file at `offset`
/// (aligned); returns where the next one goes.
fn externalize(t: &mut TensorProto, data: &mut impl Write, offset: u64) -> std::io::Result<u64> {
    let Some(raw) = t.raw_data.as_ref().filter(|r| r.len() > INLINE_AT_MOST) else {
        return Ok(offset);
    };
    let start = offset.div_ceil(DATA_ALIGNMENT) * DATA_ALIGNMENT;
    data.write_all(&vec![0u8; (start - offset) as usize])?;
    data.write_all(raw)?;
    let len = raw.len() as u64;
    let entry = |k: &str, v: String| StringStringEntryProto {
        key: Some(k.into()),
        value: Some(v),
    };
    t.external_data = vec![
        entry("location", DATA_FILE.into()),
        entry("offset", start.to_string()),
        entry("length", len.to_string()),
    ];
    t.data_location = Some(DataLocation::External as i32);
    t.raw_data = None;
    Ok(start + len)
}

fn token(vocab: &crate::vocab::Vocabulary, id: Option<u32>) -> Json {
    vocab.text(id).map_or(Json::Null, |t| json!(t))
}

fn special_tokens(vocab: &crate::vocab::Vocabulary) -> Json {
    json!({
        "bos_token": token(vocab, vocab.bos),
        "eos_token": token(vocab, vocab.eos),
        "pad_token": token(vocab, vocab.pad.or(vocab.eos)),
        "unk_token": token(vocab, vocab.unk),
    })
}

fn tokenizer_config(
    vocab: &crate::vocab::Vocabulary,
    config: &crate::config::DecoderConfig,
) -> Json {
    let mut c = special_tokens(vocab);
    let class = match vocab.kind {
        Kind::Bpe => "GPT2Tokenizer",
        Kind::Spm => "LlamaTokenizer",
    };
    let fields = [
        ("add_bos_token", json!(vocab.add_bos)),
        ("add_eos_token", json!(vocab.add_eos)),
        ("chat_template", json!(vocab.chat_template)),
        ("clean_up_tokenization_spaces", json!(false)),
        ("model_max_length", json!(config.context_length)),
        ("tokenizer_class", json!(class)),
    ];
    if let Some(map) = c.as_object_mut() {
        map.extend(fields.into_iter().map(|(k, v)| (k.to_string(), v)));
    }
    c
}

/// onnxruntime-genai's model description (its builder's schema).
fn genai_config(vocab: &crate::vocab::Vocabulary, c: &crate::config::DecoderConfig) -> Json {
    let context = c.context_length.min(crate::graph::decoder::MAX_POSITIONS);
    let eos: Vec<u32> = vocab.end_of_generation.clone();
    json!({
        "model": {
            "bos_token_id": vocab.bos,
            "context_length": context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": MODEL_FILE,
                "head_size": c.head_dim,
                "hidden_size": c.hidden,
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
                "num_attention_heads": c.heads,
                "num_hidden_layers": c.layers,
                "num_key_value_heads": c.kv_heads,
            },
            "eos_token_id": eos,
            "pad_token_id": vocab.pad.or(vocab.eos),
            "type": "llama",
            "vocab_size": vocab.len(),
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": false,
            "early_stopping": true,
            "length_penalty": 1.0,
            "max_length": context,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": false,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    })
}
