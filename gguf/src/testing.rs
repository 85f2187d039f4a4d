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
        while out.len() % 32 != 0 {
            out.push(0);
        }
        for (_, _, _, bytes) in &self.tensors {
            out.extend(bytes);
            while out.len() % 32 != 0 {
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
