//! The tokenizer.json made from small vocabularies, run by the
//! `tokenizers` crate (the requester's tokenizer).

use super::*;
use crate::file::GgufFile;
use crate::testing::Writer;

fn vocabulary(write: impl FnOnce(&mut Writer)) -> Vocabulary {
    let mut w = Writer::new();
    w.kv_str("general.architecture", "llama");
    write(&mut w);
    let bytes = w.finish();
    let file = GgufFile::parse(&bytes).unwrap();
    Vocabulary::from_meta(&Meta { file: &file }).unwrap()
}

fn tokenizer(v: &Vocabulary) -> tokenizers::Tokenizer {
    let json = v.tokenizer_json().unwrap();
    tokenizers::Tokenizer::from_bytes(json.as_bytes()).unwrap()
}

fn ids(t: &tokenizers::Tokenizer, text: &str, special: bool) -> Vec<u32> {
    t.encode(text, special).unwrap().get_ids().to_vec()
}

/// A SentencePiece vocabulary: `<unk> <s> </s>`, the 256 byte tokens,
/// then pieces with scores.
fn spm() -> Vocabulary {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let pieces = ["▁", "a", "b", "▁a", "ab", "▁ab", "<|user|>"];
    for p in pieces {
        tokens.push(p.into());
        types.push(if p.starts_with("<|") { 4 } else { 1 });
    }
    let n = tokens.len();
    // "▁ab" scores best, then "ab", then "▁a".
    let mut scores = vec![0.0f32; n];
    scores[n - 7..].copy_from_slice(&[-1.0, -2.0, -3.0, -6.0, -5.0, -4.0, 0.0]);
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    vocabulary(|w| {
        w.kv_str("tokenizer.ggml.model", "llama");
        w.kv_strs("tokenizer.ggml.tokens", &refs);
        w.kv_f32s("tokenizer.ggml.scores", &scores);
        w.kv_i32s("tokenizer.ggml.token_type", &types);
        w.kv_u32("tokenizer.ggml.bos_token_id", 1);
        w.kv_u32("tokenizer.ggml.eos_token_id", 2);
        w.kv_u32("tokenizer.ggml.unknown_token_id", 0);
    })
}

#[test]
fn sentencepiece_merges_by_score_adds_the_space_and_falls_back_to_bytes() {
    let v = spm();
    assert!(v.add_bos && v.add_space_prefix);
    assert_eq!(v.end_of_generation, vec![2]);
    let t = tokenizer(&v);
    let id = |s: &str| v.tokens.iter().position(|t| t == s).unwrap() as u32;
    // "ab ab" -> ▁ab ▁ab, after the beginning-of-sequence token.
    assert_eq!(ids(&t, "ab ab", true), vec![1, id("▁ab"), id("▁ab")]);
    // é is no piece: its two UTF-8 bytes.
    assert_eq!(
        ids(&t, "é", false),
        vec![id("▁"), id("<0xC3>"), id("<0xA9>")]
    );
    // After an added token the text starts with a space again.
    assert_eq!(
        ids(&t, "a<|user|>b", false),
        vec![id("▁a"), id("<|user|>"), id("▁"), id("b")]
    );
    let decoded = t.decode(&ids(&t, "ab ab", true), true).unwrap();
    assert_eq!(decoded, "ab ab");
}

#[test]
fn byte_level_bpe_follows_the_pre_tokenizer() {
    // GPT-2's byte alphabet maps ' ' to 'Ġ'.
    let tokens = ["a", "b", "Ġ", "1", "2", "ab", "Ġab", "<|im_end|>"];
    let merges = ["a b", "Ġ ab"];
    let v = vocabulary(|w| {
        w.kv_str("tokenizer.ggml.model", "gpt2");
        w.kv_str("tokenizer.ggml.pre", "smollm");
        w.kv_strs("tokenizer.ggml.tokens", &tokens);
        w.kv_strs("tokenizer.ggml.merges", &merges);
        w.kv_i32s("tokenizer.ggml.token_type", &[1, 1, 1, 1, 1, 1, 1, 3]);
        w.kv_u32("tokenizer.ggml.eos_token_id", 7);
    });
    assert!(!v.add_bos);
    let t = tokenizer(&v);
    assert_eq!(ids(&t, "ab ab", true), vec![5, 6]);
    // smollm splits digits one by one.
    assert_eq!(ids(&t, "12", true), vec![3, 4]);
    assert_eq!(ids(&t, "ab<|im_end|>", true), vec![5, 7]);
    assert_eq!(t.decode(&[5, 6], false).unwrap(), "ab ab");
}

#[test]
fn bad_vocabularies_are_named() {
    let mut w = Writer::new();
    w.kv_str("tokenizer.ggml.model", "bert");
    let bytes = w.finish();
    let file = GgufFile::parse(&bytes).unwrap();
    let e = Vocabulary::from_meta(&Meta { file: &file })
        .unwrap_err()
        .to_string();
    assert!(e.contains("'bert' is not supported"), "{e}");
    let mut w = Writer::new();
    w.kv_str("tokenizer.ggml.model", "gpt2");
    w.kv_strs("tokenizer.ggml.tokens", &["a"]);
    w.kv_strs("tokenizer.ggml.merges", &[]);
    w.kv_str("tokenizer.ggml.pre", "no-such-pre");
    let bytes = w.finish();
    let file = GgufFile::parse(&bytes).unwrap();
    let v = Vocabulary::from_meta(&Meta { file: &file }).unwrap();
    let e = v.tokenizer_json().unwrap_err().to_string();
    assert!(e.contains("no-such-pre"), "{e}");
}
