//! A small GGUF writer for the unit tests (the integration tests write
//! theirs with the `gguf` Python package and llama.cpp's quantizer).

pub struct Writer {
    kv: Vec<u8>,
    kv_count: u64,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

impl Writer {
    pub fn new() -> Writer {
        Writer {
            kv: Vec::new(),
            kv_count: 0,
            tensors: Vec::new(),
        }
    }

    fn key(&mut self, key: &str, ty: u32) {
        self.kv_count += 1;
        put_str(&mut self.kv, key);
        self.kv.extend(ty.to_le_bytes());
    }

    pub fn kv_str(&mut self, key: &str, v: &str) {
        self.key(key, 8);
        put_str(&mut self.kv, v);
    }

    pub fn kv_u32(&mut self, key: &str, v: u32) {
        self.key(key, 4);
        self.kv.extend(v.to_le_bytes());
    }

    pub fn kv_f32(&mut self, key: &str, v: f32) {
        self.key(key, 6);
        self.kv.extend(v.to_le_bytes());
    }

    pub fn kv_strs(&mut self, key: &str, v: &[&str]) {
        self.key(key, 9);
        self.kv.extend(8u32.to_le_bytes());
        self.kv.extend((v.len() as u64).to_le_bytes());
        for s in v {
            put_str(&mut self.kv, s);
        }
    }

    pub fn kv_f32s(&mut self, key: &str, v: &[f32]) {
        self.key(key, 9);
        self.kv.extend(6u32.to_le_bytes());
        self.kv.extend((v.len() as u64).to_le_bytes());
        for x in v {
            self.kv.extend(x.to_le_bytes());
        }
    }

    pub fn kv_i32s(&mut self, key: &str, v: &[i32]) {
        self.key(key, 9);
        self.kv.extend(5u32.to_le_bytes());
        self.kv.extend((v.len() as u64).to_le_bytes());
        for x in v {
            self.kv.extend(x.to_le_bytes());
        }
    }

    /// A tensor of ggml type `ty` with ggml dims and raw bytes.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, bytes: Vec<u8>) {
        self.tensors
            .push((name.to_string(), dims.to_vec(), ty, bytes));
    }

    pub fn tensor_f32(&mut self, name: &str, dims: &[u64], values: &[f32]) {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.tensor(name, dims, 0, bytes);
    }

    pub fn finish(self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend(self.kv_count.to_le_bytes());
        out.extend(&self.kv);
        let mut offset = 0u64;
        for (name, dims, ty, bytes) in &self.tensors {
            put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (bytes.len() as u64).div_ceil(32) * 32;
        }
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        for (_, _, _, bytes) in &self.tensors {
            out.extend(bytes);
            while !out.len().is_multiple_of(32) {
                out.push(0);
            }
        }
        out
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A tiny llama GGUF's shape and what to spoil in it.
pub struct Tiny {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    pub untied: bool,
    /// Tokens left out of the vocabulary (it then disagrees with the
    /// embedding).
    pub drop_tokens: usize,
    /// Tensors left out.
    pub without: Vec<String>,
    /// An extra tensor of this name.
    pub extra: Option<String>,
}

impl Default for Tiny {
    fn default() -> Self {
        Tiny {
            layers: 2,
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            ffn: 128,
            untied: false,
            drop_tokens: 0,
            without: Vec::new(),
            extra: None,
        }
    }
}

/// The tiny model's vocabulary: 40 byte-level tokens, the last a control
/// token.
pub const TINY_VOCAB: usize = 40;

/// A complete llama GGUF with seeded random F32 weights.
pub fn tiny_llama(t: &Tiny) -> Vec<u8> {
    let mut w = Writer::new();
    w.kv_str("general.architecture", "llama");
    w.kv_u32("llama.block_count", t.layers as u32);
    w.kv_u32("llama.embedding_length", t.hidden as u32);
    w.kv_u32("llama.feed_forward_length", t.ffn as u32);
    w.kv_u32("llama.attention.head_count", t.heads as u32);
    w.kv_u32("llama.attention.head_count_kv", t.kv_heads as u32);
    w.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5);
    w.kv_u32("llama.context_length", 128);
    let mut tokens: Vec<String> = (0..TINY_VOCAB - 1).map(|i| format!("t{i}")).collect();
    tokens.push("<|im_end|>".into());
    let mut types = vec![1; TINY_VOCAB - 1];
    types.push(3);
    tokens.truncate(TINY_VOCAB - t.drop_tokens);
    types.truncate(TINY_VOCAB - t.drop_tokens);
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    w.kv_str("tokenizer.ggml.model", "gpt2");
    w.kv_str("tokenizer.ggml.pre", "smollm");
    w.kv_strs("tokenizer.ggml.tokens", &refs);
    w.kv_i32s("tokenizer.ggml.token_type", &types);
    w.kv_strs("tokenizer.ggml.merges", &["t 1"]);
    w.kv_u32(
        "tokenizer.ggml.eos_token_id",
        (TINY_VOCAB - 1 - t.drop_tokens) as u32,
    );
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut random = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
            })
            .collect()
    };
    let (h, ffn) = (t.hidden as u64, t.ffn as u64);
    let (q, kv) = (h, h / t.heads as u64 * t.kv_heads as u64);
    let mut tensors: Vec<(String, Vec<u64>)> =
        vec![("token_embd.weight".into(), vec![h, TINY_VOCAB as u64])];
    for l in 0..t.layers {
        for (name, dims) in [
            ("attn_norm", vec![h]),
            ("attn_q", vec![h, q]),
            ("attn_k", vec![h, kv]),
            ("attn_v", vec![h, kv]),
            ("attn_output", vec![q, h]),
            ("ffn_norm", vec![h]),
            ("ffn_gate", vec![h, ffn]),
            ("ffn_up", vec![h, ffn]),
            ("ffn_down", vec![ffn, h]),
        ] {
            tensors.push((format!("blk.{l}.{name}.weight"), dims));
        }
    }
    tensors.push(("output_norm.weight".into(), vec![h]));
    if t.untied {
        tensors.push(("output.weight".into(), vec![h, TINY_VOCAB as u64]));
    }
    if let Some(extra) = &t.extra {
        tensors.push((extra.clone(), vec![h]));
    }
    for (name, dims) in tensors {
        if t.without.contains(&name) {
            continue;
        }
        let n = dims.iter().product::<u64>() as usize;
        let values = if dims.len() == 1 {
            vec![1.0; n]
        } else {
            random(n)
        };
        w.tensor_f32(&name, &dims, &values);
    }
    w.finish()
}
