//! SentencePiece (`tokenizer.ggml.model = llama`) as llama.cpp runs it:
//! spaces become `▁`, a `▁` goes before the text and after each special
//! token (`add_space_prefix`), and adjacent pieces merge while their
//! concatenation is a token, the highest-scoring first; a character that
//! no token holds falls back to its UTF-8 bytes (`<0xNN>` tokens).
//!
//! In `tokenizer.json` terms: normalizers `Prepend("▁")` (applied to each
//! stretch of text between added tokens, as llama.cpp's prefix is) and
//! `Replace(" ", "▁")`, and a BPE model with `byte_fallback` whose merges
//! are every split of every token into two tokens, ranked by the merged
//! token's score: merging the best-ranked adjacent pair is llama.cpp's
//! merging of the best-scoring one.

use std::collections::HashMap;

use serde_json::{json, Value as Json};

use super::{BpeModel, Merges, TokenIds, TokenType, Vocabulary};

const SPACE: &str = "\u{2581}";

/// Every (left, right) pair of tokens whose concatenation is a normal or
/// user-defined token, best score first (ties: lower merged id, then
/// lower left id).
fn merges(v: &Vocabulary) -> Vec<[&str; 2]> {
    let ids: HashMap<&str, usize> = v
        .tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| mergeable(v.types[*i]))
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut pairs: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (&text, &merged) in &ids {
        for (cut, _) in text.char_indices().skip(1) {
            let (left, right) = text.split_at(cut);
            if let (Some(&l), Some(&r)) = (ids.get(left), ids.get(right)) {
                pairs.push((v.scores[merged], merged, l, r));
            }
        }
    }
    pairs.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    pairs
        .into_iter()
        .map(|(_, _, l, r)| [v.tokens[l].as_str(), v.tokens[r].as_str()])
        .collect()
}

/// Tokens the merges may make or start from (llama.cpp looks up any
/// token's text; control and byte tokens never occur in the text it
/// merges).
fn mergeable(ty: TokenType) -> bool {
    matches!(
        ty,
        TokenType::Normal | TokenType::UserDefined | TokenType::Unused
    )
}

/// The model, normalizer, pre-tokenizer and decoder of `tokenizer.json`.
pub fn parts(v: &Vocabulary) -> (BpeModel<'_>, Json, Json, Json) {
    let model = BpeModel {
        kind: "BPE",
        dropout: None,
        unk_token: v.text(v.unk),
        continuing_subword_prefix: None,
        end_of_word_suffix: None,
        fuse_unk: true,
        byte_fallback: true,
        ignore_merges: false,
        vocab: TokenIds(&v.tokens),
        merges: Merges::Pairs(merges(v)),
    };
    let mut normalizers = Vec::new();
    if v.add_space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": SPACE}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": SPACE}));
    let normalizer = json!({"type": "Sequence", "normalizers": normalizers});
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": SPACE}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if v.add_space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let decoder = json!({"type": "Sequence", "decoders": decoders});
    (model, normalizer, Json::Null, decoder)
}
