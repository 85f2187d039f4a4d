//! A GGUF's vocabulary (`tokenizer.ggml.*`) as a Hugging Face
//! `tokenizer.json` that tokenizes as llama.cpp does: byte-level BPE with
//! the pre-tokenizer `tokenizer.ggml.pre` names (`bpe`), or
//! SentencePiece's merges by score with byte fallback and the added space
//! (`spm`). Control, user-defined and unknown tokens are added tokens
//! (matched in the text before anything else, as llama.cpp partitions
//! them); beginning- and end-of-sequence ids, the end-of-generation set
//! and the chat template come from the metadata.

mod bpe;
mod spm;

use serde_json::{json, Value as Json};

use crate::config::Meta;
use crate::GgufError;

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_number(n: i128) -> TokenType {
        match n {
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Normal,
        }
    }

    /// Matched in the text as a whole before tokenizing the rest.
    fn is_added(self) -> bool {
        matches!(
            self,
            TokenType::Control | TokenType::UserDefined | TokenType::Unknown
        )
    }
}

/// The tokenizer models read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `gpt2`: byte-level BPE.
    Bpe,
    /// `llama`: SentencePiece.
    Spm,
}

/// Texts of tokens llama.cpp ends a generation at (its
/// `special_eog_ids`), which it takes as control tokens whatever their
/// type says.
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "[e~[",
];

/// A GGUF's vocabulary.
#[derive(Debug, Clone)]
pub struct Vocabulary {
    pub kind: Kind,
    pub tokens: Vec<String>,
    pub types: Vec<TokenType>,
    pub scores: Vec<f32>,
    pub merges: Vec<String>,
    /// `tokenizer.ggml.pre` (BPE).
    pub pre: Option<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    /// Ids that end a generation: end-of-sequence, end-of-turn and
    /// end-of-message tokens.
    pub end_of_generation: Vec<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    /// Special tokens take the whitespace after them (llama.cpp's RSTRIP,
    /// which it sets for Phi-3 by the model's name).
    pub strip_after_special: bool,
    pub chat_template: Option<String>,
}

/// Whether llama.cpp strips the whitespace after special tokens for a
/// model of this `general.name`.
fn strips_after_special(name: Option<&str>) -> bool {
    let name = name.unwrap_or_default().to_lowercase();
    ["phi-3", "phi3"].iter().any(|n| name.contains(n))
}

/// Special tokens llama.cpp leaves unstripped in a model it strips for.
const KEEP_SPACE_AFTER: &[&str] = &["<unk>", "<s>", "<|endoftext|>"];

impl Vocabulary {
    pub fn from_meta(meta: &Meta<'_, '_>) -> Result<Vocabulary, GgufError> {
        let model = meta.str("tokenizer.ggml.model")?;
        let kind = match model {
            "gpt2" => Kind::Bpe,
            "llama" => Kind::Spm,
            other => {
                return Err(GgufError::Vocabulary(format!(
                    "tokenizer.ggml.model '{other}' is not supported (gpt2, byte-level BPE, and llama, SentencePiece, are)"
                )))
            }
        };
        let Lists {
            tokens,
            mut types,
            scores,
            merges,
        } = Lists::from_meta(meta, kind)?;
        let n = tokens.len();
        let id = |k: &str| -> Result<Option<u32>, GgufError> {
            let key = format!("tokenizer.ggml.{k}");
            match meta.opt_u64(&key)? {
                // llama.cpp writes -1 (as u32::MAX) for "none".
                Some(v) if v >= u32::MAX as u64 => Ok(None),
                Some(v) if v as usize >= n => Err(GgufError::Metadata {
                    key,
                    reason: format!("token {v} is not in a vocabulary of {n}"),
                }),
                Some(v) => Ok(Some(v as u32)),
                None => Ok(None),
            }
        };
        let spm = kind == Kind::Spm;
        let (bos, eos) = (id("bos_token_id")?, id("eos_token_id")?);
        let mut end_of_generation: Vec<u32> = [eos, id("eot_token_id")?, id("eom_token_id")?]
            .into_iter()
            .flatten()
            .collect();
        for (i, t) in tokens.iter().enumerate() {
            if END_OF_GENERATION_TEXTS.contains(&t.as_str()) {
                end_of_generation.push(i as u32);
                types[i] = TokenType::Control;
            }
        }
        end_of_generation.sort_unstable();
        end_of_generation.dedup();
        let pre = meta.opt_str("tokenizer.ggml.pre")?.map(str::to_string);
        let flag = |k: &str, default: bool| -> Result<bool, GgufError> {
            Ok(meta
                .opt_bool(&format!("tokenizer.ggml.{k}"))?
                .unwrap_or(default))
        };
        Ok(Vocabulary {
            kind,
            add_bos: flag("add_bos_token", spm || bpe::adds_bos(pre.as_deref()))?,
            add_eos: flag("add_eos_token", false)?,
            add_space_prefix: flag("add_space_prefix", spm)?,
            strip_after_special: strips_after_special(meta.opt_str("general.name")?),
            unk: id("unknown_token_id")?,
            pad: id("padding_token_id")?,
            chat_template: meta.opt_str("tokenizer.chat_template")?.map(str::to_string),
            tokens,
            types,
            scores,
            merges,
            pre,
            bos,
            eos,
            end_of_generation,
        })
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// A token's text.
    pub fn text(&self, id: Option<u32>) -> Option<&str> {
        id.and_then(|i| self.tokens.get(i as usize))
            .map(String::as_str)
    }

    /// The Hugging Face `tokenizer.json`, serialized from the vocabulary's
    /// own strings (no tree of copies: a vocabulary of 128k tokens and
    /// 280k merges stays a few megabytes).
    pub fn tokenizer_json(&self) -> Result<String, GgufError> {
        let (model, normalizer, pre_tokenizer, decoder) = match self.kind {
            Kind::Bpe => bpe::parts(self)?,
            Kind::Spm => spm::parts(self),
        };
        let json = TokenizerJson {
            version: "1.0",
            truncation: None,
            padding: None,
            added_tokens: self.added_tokens(),
            normalizer,
            pre_tokenizer,
            post_processor: self.post_processor(),
            decoder,
            model,
        };
        serde_json::to_string(&json)
            .map_err(|e| GgufError::Vocabulary(format!("tokenizer.json: {e}")))
    }

    fn added_tokens(&self) -> Vec<Json> {
        self.tokens
            .iter()
            .zip(&self.types)
            .enumerate()
            .filter(|(_, (_, ty))| ty.is_added())
            .map(|(id, (content, ty))| {
                json!({
                    "id": id,
                    "content": content,
                    "single_word": false,
                    "lstrip": false,
                    "rstrip": self.strip_after_special
                        && !KEEP_SPACE_AFTER.contains(&content.as_str()),
                    "normalized": false,
                    "special": *ty != TokenType::UserDefined,
                })
            })
            .collect()
    }

    /// Beginning- and end-of-sequence tokens where the model adds them
    /// (after the byte-level step for BPE, whose offsets it trims).
    fn post_processor(&self) -> Json {
        let mut single = Vec::new();
        let mut special = serde_json::Map::new();
        let mut add = |id: Option<u32>, at_end: bool, single: &mut Vec<Json>| {
            let Some(text) = self.text(id) else { return };
            let piece = json!({"SpecialToken": {"id": text, "type_id": 0}});
            if at_end {
                single.push(piece);
            } else {
                single.insert(0, piece);
            }
            special.insert(
                text.to_string(),
                json!({"id": text, "ids": [id], "tokens": [text]}),
            );
        };
        single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
        if self.add_bos {
            add(self.bos, false, &mut single);
        }
        if self.add_eos {
            add(self.eos, true, &mut single);
        }
        let template = json!({
            "type": "TemplateProcessing",
            "single": single,
            "pair": single,
            "special_tokens": special,
        });
        match self.kind {
            Kind::Bpe => json!({
                "type": "Sequence",
                "processors": [
                    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
                    template,
                ],
            }),
            Kind::Spm => template,
        }
    }
}

/// `tokenizer.json`.
#[derive(serde::Serialize)]
struct TokenizerJson<'a> {
    version: &'static str,
    truncation: Option<()>,
    padding: Option<()>,
    added_tokens: Vec<Json>,
    normalizer: Json,
    pre_tokenizer: Json,
    post_processor: Json,
    decoder: Json,
    model: BpeModel<'a>,
}

/// `tokenizer.json`'s model: a BPE over the vocabulary's strings.
#[derive(serde::Serialize)]
struct BpeModel<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    dropout: Option<f32>,
    unk_token: Option<&'a str>,
    continuing_subword_prefix: Option<&'a str>,
    end_of_word_suffix: Option<&'a str>,
    fuse_unk: bool,
    byte_fallback: bool,
    ignore_merges: bool,
    vocab: TokenIds<'a>,
    merges: Merges<'a>,
}

/// The vocabulary as a map from each token to its id.
struct TokenIds<'a>(&'a [String]);

impl serde::Serialize for TokenIds<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().enumerate().map(|(i, t)| (t.as_str(), i)))
    }
}

/// Merges as the file has them (`"left right"`) or as pairs.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum Merges<'a> {
    Text(&'a [String]),
    Pairs(Vec<[&'a str; 2]>),
}

/// The vocabulary's lists: tokens, their types and scores, the merges.
struct Lists {
    tokens: Vec<String>,
    types: Vec<TokenType>,
    scores: Vec<f32>,
    merges: Vec<String>,
}

impl Lists {
    fn from_meta(meta: &Meta<'_, '_>, kind: Kind) -> Result<Lists, GgufError> {
        let strings = |key: &str| -> Result<Option<Vec<String>>, GgufError> {
            Ok(match meta.opt_array(key)? {
                Some(a) => Some(a.strings(key)?.into_iter().map(str::to_string).collect()),
                None => None,
            })
        };
        let key = "tokenizer.ggml.tokens";
        let tokens = strings(key)?.ok_or_else(|| GgufError::MissingKey(key.into()))?;
        if tokens.is_empty() {
            return Err(GgufError::Vocabulary(
                "tokenizer.ggml.tokens is empty".into(),
            ));
        }
        let n = tokens.len();
        let key = "tokenizer.ggml.token_type";
        let types = match meta.opt_array(key)? {
            Some(a) => a
                .integers(key)?
                .into_iter()
                .map(TokenType::from_number)
                .collect(),
            None => vec![TokenType::Normal; n],
        };
        let key = "tokenizer.ggml.scores";
        let scores = match meta.opt_array(key)? {
            Some(a) => a.numbers(key)?.into_iter().map(|s| s as f32).collect(),
            None => vec![0.0; n],
        };
        check_len("tokenizer.ggml.token_type", types.len(), n)?;
        check_len("tokenizer.ggml.scores", scores.len(), n)?;
        let key = "tokenizer.ggml.merges";
        let merges = match strings(key)? {
            Some(m) => m,
            None if kind == Kind::Bpe => return Err(GgufError::MissingKey(key.into())),
            None => Vec::new(),
        };
        Ok(Lists {
            tokens,
            types,
            scores,
            merges,
        })
    }
}

fn check_len(key: &str, got: usize, want: usize) -> Result<(), GgufError> {
    if got != want {
        return Err(GgufError::Metadata {
            key: key.to_string(),
            reason: format!("{got} entries for {want} tokens"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
