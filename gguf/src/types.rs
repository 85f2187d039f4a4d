//! ggml's tensor types: their numbers in a GGUF file, names, and block
//! layouts (elements per block, bytes per block), from ggml.h and
//! ggml-common.h. Every type ggml knows is listed so that a file's layout
//! can be checked and a type Tessera does not read named in the error.

/// A tensor's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

/// One row of [`TYPES`]: number, name, elements per block, bytes per block.
struct TypeRow(u32, &'static str, u64, u64);

/// Every type of ggml 0.9 (llama.cpp as llama-cpp-python 0.3.36 vendors it).
const TYPES: &[TypeRow] = &[
    TypeRow(0, "F32", 1, 4),
    TypeRow(1, "F16", 1, 2),
    TypeRow(2, "Q4_0", 32, 18),
    TypeRow(3, "Q4_1", 32, 20),
    TypeRow(6, "Q5_0", 32, 22),
    TypeRow(7, "Q5_1", 32, 24),
    TypeRow(8, "Q8_0", 32, 34),
    TypeRow(9, "Q8_1", 32, 36),
    TypeRow(10, "Q2_K", 256, 84),
    TypeRow(11, "Q3_K", 256, 110),
    TypeRow(12, "Q4_K", 256, 144),
    TypeRow(13, "Q5_K", 256, 176),
    TypeRow(14, "Q6_K", 256, 210),
    TypeRow(15, "Q8_K", 256, 292),
    TypeRow(16, "IQ2_XXS", 256, 66),
    TypeRow(17, "IQ2_XS", 256, 74),
    TypeRow(18, "IQ3_XXS", 256, 98),
    TypeRow(19, "IQ1_S", 256, 50),
    TypeRow(20, "IQ4_NL", 32, 18),
    TypeRow(21, "IQ3_S", 256, 110),
    TypeRow(22, "IQ2_S", 256, 82),
    TypeRow(23, "IQ4_XS", 256, 136),
    TypeRow(24, "I8", 1, 1),
    TypeRow(25, "I16", 1, 2),
    TypeRow(26, "I32", 1, 4),
    TypeRow(27, "I64", 1, 8),
    TypeRow(28, "F64", 1, 8),
    TypeRow(29, "IQ1_M", 256, 56),
    TypeRow(30, "BF16", 1, 2),
    TypeRow(34, "TQ1_0", 256, 54),
    TypeRow(35, "TQ2_0", 256, 66),
    TypeRow(39, "MXFP4", 32, 17),
];

impl GgmlType {
    pub const F32: GgmlType = GgmlType(0);
    pub const F16: GgmlType = GgmlType(1);
    pub const Q4_0: GgmlType = GgmlType(2);
    pub const Q4_1: GgmlType = GgmlType(3);
    pub const Q5_0: GgmlType = GgmlType(6);
    pub const Q5_1: GgmlType = GgmlType(7);
    pub const Q8_0: GgmlType = GgmlType(8);
    pub const Q2_K: GgmlType = GgmlType(10);
    pub const Q3_K: GgmlType = GgmlType(11);
    pub const Q4_K: GgmlType = GgmlType(12);
    pub const Q5_K: GgmlType = GgmlType(13);
    pub const Q6_K: GgmlType = GgmlType(14);
    pub const BF16: GgmlType = GgmlType(30);

    pub fn from_id(id: u32) -> GgmlType {
        GgmlType(id)
    }

    fn row(self) -> Option<&'static TypeRow> {
        TYPES.iter().find(|r| r.0 == self.0)
    }

    /// ggml's name, e.g. `Q4_K` (`type 41` for a number ggml 0.9 lacks).
    pub fn name(self) -> String {
        self.row()
            .map_or_else(|| format!("type {}", self.0), |r| r.1.to_string())
    }

    /// Elements per block and bytes per block.
    pub fn block(self) -> Option<(u64, u64)> {
        self.row().map(|r| (r.2, r.3))
    }

    /// The bytes of a tensor of this type and these ggml dimensions
    /// (`dims[0]` the row length, a whole number of blocks).
    pub fn data_len(self, dims: &[u64]) -> Result<u64, String> {
        let (block, bytes) = self
            .block()
            .ok_or_else(|| format!("unknown tensor type {}", self.0))?;
        let row = dims.first().copied().unwrap_or(1);
        if !row.is_multiple_of(block) {
            return Err(format!(
                "rows of {row} elements are not whole {} blocks of {block}",
                self.name()
            ));
        }
        let rows = dims[1..]
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or("its dimensions overflow")?;
        (row / block)
            .checked_mul(bytes)
            .and_then(|r| r.checked_mul(rows))
            .ok_or_else(|| "its size overflows".to_string())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_follow_ggml_s_blocks() {
        assert_eq!(GgmlType::Q4_K.data_len(&[512, 3]), Ok(2 * 144 * 3));
        assert_eq!(GgmlType::F16.data_len(&[7, 2]), Ok(28));
        assert!(GgmlType::Q4_0.data_len(&[33, 1]).is_err());
        assert!(GgmlType(99).data_len(&[1]).is_err());
        assert_eq!(GgmlType(23).name(), "IQ4_XS");
        assert_eq!(GgmlType(99).name(), "type 99");
    }
}
