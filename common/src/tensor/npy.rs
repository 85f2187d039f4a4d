//! NumPy `.npy` files (format versions 1.0–3.0, little-endian, C order).

use super::{Tensor, TensorError};
use crate::onnx::ElemType;

const MAGIC: &[u8] = b"\x93NUMPY";

fn descr_of(elem: ElemType) -> Option<&'static str> {
    Some(match elem {
        ElemType::FLOAT => "<f4",
        ElemType::UINT8 => "|u1",
        ElemType::INT8 => "|i1",
        ElemType::UINT16 => "<u2",
        ElemType::INT16 => "<i2",
        ElemType::INT32 => "<i4",
        ElemType::INT64 => "<i8",
        ElemType::BOOL => "|b1",
        ElemType::FLOAT16 => "<f2",
        ElemType::DOUBLE => "<f8",
        ElemType::UINT32 => "<u4",
        ElemType::UINT64 => "<u8",
        _ => return None,
    })
}

fn elem_of(descr: &str) -> Option<ElemType> {
    // '=' (native) is little-endian on every platform we build for.
    let d = descr.replacen('=', "<", 1);
    let d = if d.len() == 3 && d.ends_with('1') {
        format!("|{}", &d[1..])
    } else {
        d
    };
    ElemType::NUMERIC
        .iter()
        .copied()
        .find(|&e| descr_of(e) == Some(d.as_str()))
}

/// Reads a `.npy` file's bytes.
pub fn read_npy(bytes: &[u8]) -> Result<Tensor, TensorError> {
    let err = |m: &str| TensorError::Npy(m.to_string());
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(err("missing the \\x93NUMPY magic"));
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(TensorError::Npy(format!("unsupported format version {v}"))),
    };
    let end = start
        .checked_add(header_len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| err("truncated header"))?;
    let header = std::str::from_utf8(&bytes[start..end]).map_err(|_| err("header is not text"))?;
    let field = |key: &str| -> Result<&str, TensorError> {
        let at = header
            .find(&format!("'{key}'"))
            .ok_or_else(|| TensorError::Npy(format!("header has no '{key}'")))?;
        let rest = header[at + key.len() + 2..].trim_start();
        rest.strip_prefix(':')
            .map(str::trim_start)
            .ok_or_else(|| TensorError::Npy(format!("bad '{key}' entry")))
    };
    let descr = field("descr")?;
    let descr = descr
        .strip_prefix('\'')
        .and_then(|d| d.split('\'').next())
        .ok_or_else(|| err("bad 'descr'"))?;
    let elem = elem_of(descr).ok_or_else(|| {
        TensorError::Npy(format!(
            "unsupported dtype '{descr}' (big-endian, object, string or structured)"
        ))
    })?;
    if field("fortran_order")?.starts_with("True") {
        return Err(err(
            "Fortran-order arrays are not supported (save np.ascontiguousarray(a))",
        ));
    }
    let shape_text = field("shape")?;
    let inner = shape_text
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| err("bad 'shape'"))?;
    let shape = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.trim_end_matches('L')
                .parse::<usize>()
                .map_err(|_| TensorError::Npy(format!("bad dimension '{s}'")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Tensor::new(elem, shape, bytes[end..].to_vec())
}

/// Writes a tensor as a version 1.0 `.npy` file.
pub fn write_npy(t: &Tensor) -> Result<Vec<u8>, TensorError> {
    let descr = descr_of(t.elem()).ok_or_else(|| TensorError::UnsupportedType(t.elem().name()))?;
    let shape = match t.shape() {
        [d] => format!("({d},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Pad so that the data starts on a 64-byte boundary; end with '\n'.
    while (MAGIC.len() + 4 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + header.len() + t.bytes().len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(t.bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bad_files() {
        for t in [
            Tensor::from_values(vec![2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap(),
            Tensor::from_values(vec![4], &[1i64, -2, 3, -4]).unwrap(),
            Tensor::from_values(vec![], &[7u8]).unwrap(),
            Tensor::from_values(vec![0, 5], &[] as &[f64]).unwrap(),
            Tensor::from_values(vec![2], &[true, false]).unwrap(),
        ] {
            let bytes = write_npy(&t).unwrap();
            assert_eq!((bytes.len() - t.bytes().len()) % 64, 0);
            assert_eq!(read_npy(&bytes).unwrap(), t);
        }
        let good = write_npy(&Tensor::from_values(vec![2], &[1.0f32, 2.0]).unwrap()).unwrap();
        assert!(read_npy(&good[..good.len() - 1])
            .unwrap_err()
            .to_string()
            .contains("needs 8 bytes"));
        assert!(read_npy(b"not npy").is_err());
        assert!(read_npy(&good[..20]).is_err());
        let mut big_endian = good.clone();
        let at = big_endian.windows(3).position(|w| w == b"<f4").unwrap();
        big_endian[at] = b'>';
        let e = read_npy(&big_endian).unwrap_err().to_string();
        assert!(e.contains("unsupported dtype"), "{e}");
    }
}
