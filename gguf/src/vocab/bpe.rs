//! Byte-level BPE (`tokenizer.ggml.model = gpt2`): the text is split by
//! the regular expressions the pre-tokenizer `tokenizer.ggml.pre` names
//! (llama.cpp's table, llama-vocab.cpp), each piece mapped to GPT-2's
//! byte alphabet and merged by rank. In `tokenizer.json` terms: a
//! `Sequence` of `Split` pre-tokenizers (each further splitting what the
//! previous left), then `ByteLevel` without its own regex.

use serde_json::{json, Value as Json};

use super::{BpeModel, Merges, TokenIds, Vocabulary};
use crate::GgufError;

/// One pre-tokenizer of llama.cpp: the `tokenizer.ggml.pre` names that
/// select it, its regular expressions in order, whether a piece that is a
/// whole token skips the merges (llama.cpp's `ignore_merges`) and whether
/// the vocabulary adds a beginning-of-sequence token unless told.
struct Pre {
    names: &'static [&'static str],
    regexes: &'static [&'static str],
    ignore_merges: bool,
    add_bos: bool,
}

const GPT2: &str = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const LLAMA3: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const GPT4O: &str = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const TEKKEN: &str = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const DEEPSEEK3: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const SEED_CODER: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const BLOOM: &str = " ?[^(\\s|.,!?…。，、।۔،)]+";

/// llama.cpp's pre-tokenizers (llama-vocab.cpp) that map onto regular
/// expressions.
const PRE_TOKENIZERS: &[Pre] = &[
    Pre {
        names: &["default"],
        regexes: &[
            "[\\p{P}\\$\\+<=>\\^~\\|]+",
            GPT2,
            "\\p{N}+",
            "[0-9][0-9][0-9]",
        ],
        ignore_merges: false,
        add_bos: false,
    },
    Pre {
        names: &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
        ],
        regexes: &[LLAMA3],
        ignore_merges: true,
        add_bos: true,
    },
    Pre {
        names: &["dbrx", "smaug-bpe", "chatglm-bpe"],
        regexes: &[LLAMA3],
        ignore_merges: false,
        add_bos: false,
    },
    Pre {
        names: &["glm4"],
        regexes: &[LLAMA3],
        ignore_merges: true,
        add_bos: false,
    },
    Pre {
        names: &["deepseek-v3", "hunyuan-dense"],
        regexes: &["\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3],
        ignore_merges: false,
        add_bos: false,
    },
    Pre {
        names: &["deepseek-coder"],
        regexes: &[
            "[\r\n]",
            "\\s?\\p{L}+",
            "\\s?\\p{P}+",
            "[一-龥ࠀ-一가-퟿]+",
            "\\p{N}",
        ],
        ignore_merges: false,
        add_bos: false,
    },
    Pre {
        names: &["falcon"],
        regexes: &["[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2, "[0-9][0-9][0-9]"],
        ignore_merges: false,
        add_bos: false,
    },
    Pre {
        names: &[
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        regexes: &["\\p{N}", GPT2],
        ignore_merges: false,
        add_bos: false,
    },
    Pre {
        names: &[
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
            "exaone4",
            "jina-v1-en",
            "jina-v2-code",
            "roberta-bpe",
        ],
        regexes: &[GPT2],
        ignore_merges: false,
        add_bos: false,
    },
    Pre {
        names: &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "megrez",
            "stablelm2",
            "hunyuan",
            "solar-open",
        ],
        regexes: &[QWEN2],
        ignore_merges: false,
        add_bos: false,
    },
    Pre {
        names: &["poro-chat", "bloom", "gpt3-finnish"],
        regexes: &[BLOOM],
        ignore_merges: false,
        add_bos: false,
    },
    Pre {
        names: &["viking"],
        regexes: &[BLOOM, "\\p{N}"],
        ignore_merges: false,
        add_bos: false,
    },
    Pre {
        names: &["tekken"],
        regexes: &[TEKKEN],
        ignore_merges: true,
        add_bos: true,
    },
    Pre {
        names: &["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"],
        regexes: &[GPT4O],
        ignore_merges: false,
        add_bos: false,
    },
    Pre {
        names: &["superbpe"],
        regexes: &["\\p{N}+", "(?=(\\d{3})+(?!\\d))"],
        ignore_merges: false,
        add_bos: false,
    },
    Pre {
        names: &["seed-coder"],
        regexes: &[SEED_CODER],
        ignore_merges: false,
        add_bos: false,
    },
];

fn pre_tokenizer(name: Option<&str>) -> Result<&'static Pre, GgufError> {
    let name = name.unwrap_or("default");
    PRE_TOKENIZERS
        .iter()
        .find(|p| p.names.contains(&name))
        .ok_or_else(|| {
            GgufError::Vocabulary(format!(
                "the pre-tokenizer '{name}' (tokenizer.ggml.pre) is not supported"
            ))
        })
}

/// Whether a vocabulary with pre-tokenizer `name` adds a
/// beginning-of-sequence token when its metadata does not say.
pub fn adds_bos(name: Option<&str>) -> bool {
    pre_tokenizer(name).is_ok_and(|p| p.add_bos)
}

/// The model, normalizer, pre-tokenizer and decoder of `tokenizer.json`.
pub fn parts(v: &Vocabulary) -> Result<(BpeModel<'_>, Json, Json, Json), GgufError> {
    let pre = pre_tokenizer(v.pre.as_deref())?;
    if let Some(bad) = v.merges.iter().find(|m| m.split(' ').count() != 2) {
        return Err(GgufError::Vocabulary(format!(
            "the merge {bad:?} is not two tokens separated by a space"
        )));
    }
    let model = BpeModel {
        kind: "BPE",
        dropout: None,
        unk_token: None,
        continuing_subword_prefix: None,
        end_of_word_suffix: None,
        fuse_unk: false,
        byte_fallback: false,
        ignore_merges: pre.ignore_merges,
        vocab: TokenIds(&v.tokens),
        merges: Merges::Text(&v.merges),
    };
    let mut splits: Vec<Json> = pre
        .regexes
        .iter()
        .map(|r| {
            json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false})
        })
        .collect();
    splits.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}));
    let pre_tokenizer = json!({"type": "Sequence", "pretokenizers": splits});
    let decoder = json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true});
    Ok((model, Json::Null, pre_tokenizer, decoder))
}
