//! A GGUF file built into a generative model: its decoder graph, its
//! tokenizer and what a generation needs to know (special tokens, the chat
//! template, the context), read from a memory map one tensor at a time.

use std::path::Path;

use tessera_common::onnx::proto::ModelProto;
use tessera_common::wire::generate::{
    GenerationSpec, DEFAULT_MAX_QUEUED, DEFAULT_QUEUE_TIMEOUT_MS,
};

mod tensors;
mod weights;

use crate::config::{DecoderConfig, Meta};
use crate::file::{GgufFile, TensorInfo};
use crate::graph::decoder::{self, MAX_POSITIONS};
use crate::vocab::Vocabulary;
use crate::GgufError;
use tensors::Tensors;

/// How the graph is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BuildOptions {
    /// `MatMulNBits`' accuracy level: 4 (int8 activations, onnxruntime's
    /// fast kernels) or 0 (float32 activations: exact up to rounding).
    pub accuracy_level: i64,
    /// Weights of the types Tessera has kernels for (`kernels::KERNEL_TYPES`)
    /// kept as the file's blocks and multiplied by those kernels
    /// (`crate::kernels`, operators only Tessera's onnxruntime plugin
    /// runs), with activations rounded to 8 bits as llama.cpp rounds
    /// them; else every quantized weight is `MatMulNBits`' (a graph any
    /// onnxruntime runs: `tessera convert`).
    pub native: bool,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            accuracy_level: 4,
            native: true,
        }
    }
}

impl BuildOptions {
    /// A graph any onnxruntime runs (`MatMulNBits`), with int8 or (`exact`)
    /// float32 activations.
    pub fn portable(exact: bool) -> BuildOptions {
        BuildOptions {
            accuracy_level: if exact { 0 } else { 4 },
            native: false,
        }
    }
}

/// A GGUF built: everything a generative folder holds.
pub struct GgufModel {
    pub config: DecoderConfig,
    pub vocab: Vocabulary,
    pub model: ModelProto,
    /// `tokenizer.json`.
    pub tokenizer_json: String,
}

impl GgufModel {
    /// Builds the model of a GGUF file read through a memory map; each
    /// tensor's pages are given back once it is converted, so the process
    /// holds about one copy of the weights (the converted one).
    pub fn read(path: &Path, options: &BuildOptions) -> Result<GgufModel, GgufError> {
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and private; a file changed under
        // it changes what is read (as any read would), nothing else.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let release = |t: &TensorInfo<'_>| {
            // SAFETY: dropping pages of a read-only file mapping only makes
            // a later access read them from the file again; nothing holds
            // this tensor's bytes any more.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    t.offset as usize,
                    t.len as usize,
                )
            };
        };
        Self::build(&map, options, &release)
    }

    /// Builds the model of a GGUF file's bytes.
    pub fn from_bytes(bytes: &[u8], options: &BuildOptions) -> Result<GgufModel, GgufError> {
        Self::build(bytes, options, &|_| {})
    }

    fn build(
        bytes: &[u8],
        options: &BuildOptions,
        release: &dyn Fn(&TensorInfo<'_>),
    ) -> Result<GgufModel, GgufError> {
        let file = GgufFile::parse(bytes)?;
        let meta = Meta { file: &file };
        let mut config = DecoderConfig::from_meta(&meta)?;
        let vocab = Vocabulary::from_meta(&meta)?;
        let tensors = Tensors {
            file: &file,
            native: options.native,
            release,
            used: Default::default(),
        };
        let (weights, context) = weights::read(&tensors, &config)?;
        config.context_length = context;
        if let Some(name) = tensors.unused().first() {
            return Err(GgufError::Tensor {
                name: name.to_string(),
                reason: format!("not a tensor of a {} decoder Tessera reads", config.arch),
            });
        }
        if vocab.len() != weights.embedding.rows() {
            return Err(GgufError::Vocabulary(format!(
                "{} tokens for an embedding of {} rows",
                vocab.len(),
                weights.embedding.rows()
            )));
        }
        let tokenizer_json = vocab.tokenizer_json()?;
        tracing::debug!(nodes = config.layers, "building the graph");
        let model = decoder::build(&config, weights, (options.accuracy_level, options.native));
        Ok(GgufModel {
            config,
            vocab,
            model,
            tokenizer_json,
        })
    }

    /// What a generation needs to know; each copy keeps state for
    /// `max_sequences` sequences.
    pub fn generation_spec(&self, max_sequences: u32) -> Result<GenerationSpec, GgufError> {
        generation_spec(
            &self.vocab,
            &self.config,
            &self.tokenizer_json,
            max_sequences,
        )
    }
}

/// The generation spec of a vocabulary and config.
pub fn generation_spec(
    vocab: &Vocabulary,
    config: &DecoderConfig,
    tokenizer_json: &str,
    max_sequences: u32,
) -> Result<GenerationSpec, GgufError> {
    if vocab.end_of_generation.is_empty() {
        return Err(GgufError::Vocabulary(
            "no end-of-sequence token (tokenizer.ggml.eos_token_id)".into(),
        ));
    }
    Ok(GenerationSpec {
        tokenizer_json: tokenizer_json.to_string(),
        tokenizer_bytes: tokenizer_json.len() as u64,
        chat_template: vocab.chat_template.clone(),
        bos_token: vocab.text(vocab.bos).map(str::to_string),
        eos_token: vocab.text(vocab.eos).map(str::to_string),
        eos_token_ids: vocab.end_of_generation.clone(),
        context_length: config.context_length.min(MAX_POSITIONS) as u32,
        max_sequences,
        max_queued: DEFAULT_MAX_QUEUED,
        queue_timeout_ms: DEFAULT_QUEUE_TIMEOUT_MS,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{tiny_llama, Tiny, TINY_VOCAB};

    fn build(t: &Tiny) -> Result<GgufModel, GgufError> {
        GgufModel::from_bytes(&tiny_llama(t), &BuildOptions::default())
    }

    #[test]
    fn a_tiny_llama_builds_the_decoder_s_interface() {
        let m = build(&Tiny::default()).unwrap();
        let g = m.model.graph.as_ref().unwrap();
        let names = |v: &[tessera_common::onnx::proto::ValueInfoProto]| -> Vec<String> {
            v.iter().filter_map(|i| i.name.clone()).collect()
        };
        let inputs = names(&g.input);
        assert_eq!(
            &inputs[..3],
            ["input_ids", "attention_mask", "position_ids"]
        );
        assert_eq!(inputs.len(), 3 + 2 * 2);
        let outputs = names(&g.output);
        assert_eq!(outputs[0], "logits");
        assert_eq!(outputs.len(), 1 + 2 * 2);
        let padding = m
            .model
            .metadata_props
            .iter()
            .find(|p| p.key.as_deref() == Some(decoder::PADDING_KEY));
        assert_eq!(padding.and_then(|p| p.value.as_deref()), Some("right"));
        let spec = m.generation_spec(2).unwrap();
        assert_eq!(spec.eos_token_ids, vec![TINY_VOCAB as u32 - 1]);
        assert_eq!(spec.context_length, 128);
        assert!(GgufModel::from_bytes(
            &tiny_llama(&Tiny {
                untied: true,
                ..Default::default()
            }),
            &BuildOptions::default()
        )
        .is_ok());
    }

    #[test]
    fn a_broken_model_is_named_in_one_line() {
        let cases = [
            (
                Tiny {
                    drop_tokens: 1,
                    ..Default::default()
                },
                "39 tokens for an embedding of 40 rows",
            ),
            (
                Tiny {
                    without: vec!["blk.1.ffn_down.weight".into()],
                    ..Default::default()
                },
                "GGUF tensor blk.1.ffn_down.weight: missing",
            ),
            (
                Tiny {
                    extra: Some("blk.0.attn_rot_embd".into()),
                    ..Default::default()
                },
                "GGUF tensor blk.0.attn_rot_embd: not a tensor of a llama decoder",
            ),
            (
                Tiny {
                    kv_heads: 3,
                    ..Default::default()
                },
                "3 key/value heads for 4 query heads",
            ),
        ];
        for (tiny, want) in cases {
            let e = build(&tiny).err().expect(want).to_string();
            assert!(e.contains(want), "{e:?} lacks {want:?}");
            assert!(!e.contains('\n'), "{e:?}");
        }
    }
}
