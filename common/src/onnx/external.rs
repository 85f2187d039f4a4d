//! A model's large initializers moved out to one external data file, as
//! ONNX lays external data out: the model keeps each one's name, type and
//! shape with `location`, `offset` and `length` in place of its bytes.
//!
//! onnxruntime maps a model file's external data into memory (on its CPU
//! provider) instead of copying it onto its heap: a session built from a
//! model with its weights inline holds them twice while it parses the
//! model (the protobuf's copy and the session's), and once after, on the
//! heap; built from the file and its data, it holds the data's pages the
//! kernel can drop and read back. The split here is pure; the caller
//! writes the two files.

use bytes::Bytes;

use super::proto::{tensor_proto::DataLocation, ModelProto, StringStringEntryProto, TensorProto};

/// Each weight starts at a multiple of this in the data file (a page: a
/// mapped weight starts on its own page, whatever its type's alignment).
pub const ALIGN: u64 = 4096;

/// A model whose large initializers are external data, and the data
/// file's contents in order: the weights, with zeros between them to keep
/// each at a multiple of [`ALIGN`].
pub struct ExternalWeights {
    /// The model without those initializers' bytes.
    pub model: ModelProto,
    /// The data file's pieces, in order (weights and padding).
    pub data: Vec<Bytes>,
    /// How many initializers were moved out.
    pub moved: usize,
}

/// `model` with every top-level initializer whose `raw_data` is at least
/// `min_bytes` long moved to the external data file `location` (a name
/// beside the model file). Initializers already external are left as they
/// are; nothing is copied (the pieces are the initializers' own bytes).
pub fn with_external_weights(
    model: &ModelProto,
    location: &str,
    min_bytes: usize,
) -> ExternalWeights {
    let mut model = model.clone();
    let mut data = Vec::new();
    let (mut at, mut moved) = (0u64, 0);
    let zeros = Bytes::from_static(&[0u8; ALIGN as usize]);
    for tensor in model
        .graph
        .iter_mut()
        .flat_map(|g| g.initializer.iter_mut())
    {
        let external = tensor.data_location == Some(DataLocation::External as i32);
        let Some(bytes) = tensor
            .raw_data
            .take_if(|b| !external && b.len() >= min_bytes)
        else {
            continue;
        };
        let pad = at.next_multiple_of(ALIGN) - at;
        if pad > 0 {
            data.push(zeros.slice(..pad as usize));
            at += pad;
        }
        set_external(tensor, location, at, bytes.len());
        at += bytes.len() as u64;
        data.push(bytes);
        moved += 1;
    }
    ExternalWeights { model, data, moved }
}

/// `model` (decoded from `file`'s bytes, its weights slices of them) with
/// every top-level initializer of at least `min_bytes` as external data
/// where its bytes already are in `file`, named `location`: nothing is
/// written or copied. Returns the model and how many moved.
pub fn external_in_place(
    model: &ModelProto,
    location: &str,
    file: &[u8],
    min_bytes: usize,
) -> (ModelProto, usize) {
    let mut model = model.clone();
    let (base, mut moved) = (file.as_ptr() as usize, 0);
    for tensor in model
        .graph
        .iter_mut()
        .flat_map(|g| g.initializer.iter_mut())
    {
        let external = tensor.data_location == Some(DataLocation::External as i32);
        let inside = |b: &mut Bytes| {
            let at = b.as_ptr() as usize;
            !external && b.len() >= min_bytes && at >= base && at + b.len() <= base + file.len()
        };
        let Some(bytes) = tensor.raw_data.take_if(inside) else {
            continue;
        };
        set_external(
            tensor,
            location,
            (bytes.as_ptr() as usize - base) as u64,
            bytes.len(),
        );
        moved += 1;
    }
    (model, moved)
}

/// Marks `tensor` external: `len` bytes at `offset` of `location`.
fn set_external(tensor: &mut TensorProto, location: &str, offset: u64, len: usize) {
    let entry = |key: &str, value: String| StringStringEntryProto {
        key: Some(key.into()),
        value: Some(value),
    };
    tensor.external_data = vec![
        entry("location", location.into()),
        entry("offset", offset.to_string()),
        entry("length", len.to_string()),
    ];
    tensor.data_location = Some(DataLocation::External as i32);
}

/// Why external data cannot be put back inline.
#[derive(Debug, thiserror::Error)]
#[error("initializer {tensor}: {message}")]
pub struct InlineError {
    pub tensor: String,
    pub message: String,
}

/// Puts back inline every top-level initializer of `model` whose external
/// data is in `location`, each as a slice of `data` (that file's bytes,
/// not copied): the reverse of [`with_external_weights`].
pub fn inline_weights(
    model: &mut ModelProto,
    location: &str,
    data: &Bytes,
) -> Result<(), InlineError> {
    for tensor in model
        .graph
        .iter_mut()
        .flat_map(|g| g.initializer.iter_mut())
    {
        if tensor.data_location != Some(DataLocation::External as i32) {
            continue;
        }
        let value = |key: &str| {
            tensor
                .external_data
                .iter()
                .find(|e| e.key.as_deref() == Some(key))
                .and_then(|e| e.value.as_deref())
        };
        if value("location") != Some(location) {
            continue;
        }
        let number = |key: &str| value(key).map(|v| v.parse::<usize>().ok());
        let range = match (number("offset"), number("length")) {
            (Some(Some(at)), Some(Some(len))) => at.checked_add(len).map(|end| at..end),
            (None, Some(Some(len))) => Some(0..len),
            _ => None,
        };
        let Some(range) = range.filter(|r| r.end <= data.len()) else {
            return Err(InlineError {
                tensor: tensor.name.clone().unwrap_or_default(),
                message: format!("its range is not within {location} ({} bytes)", data.len()),
            });
        };
        tensor.raw_data = Some(data.slice(range));
        tensor.external_data.clear();
        tensor.data_location = None;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::proto::GraphProto;
    use super::*;

    fn initializer(name: &str, bytes: Vec<u8>) -> TensorProto {
        TensorProto {
            name: Some(name.into()),
            dims: vec![bytes.len() as i64],
            data_type: Some(2),
            raw_data: Some(Bytes::from(bytes)),
            ..Default::default()
        }
    }

    #[test]
    fn large_weights_move_out_page_aligned_and_small_ones_stay() {
        let model = ModelProto {
            graph: Some(GraphProto {
                initializer: vec![
                    initializer("a", vec![1; 5000]),
                    initializer("small", vec![2; 10]),
                    initializer("b", vec![3; 4096]),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let out = with_external_weights(&model, "weights.bin", 1024);
        assert_eq!(out.moved, 2);
        let file: Vec<u8> = out.data.iter().flat_map(|b| b.iter().copied()).collect();
        let g = out.model.graph.as_ref().unwrap();
        let (a, small, b) = (&g.initializer[0], &g.initializer[1], &g.initializer[2]);
        assert_eq!(small.raw_data.as_deref(), Some(&[2u8; 10][..]));
        assert_eq!(small.data_location, None);
        for (t, fill, len) in [(a, 1u8, 5000usize), (b, 3, 4096)] {
            assert!(t.raw_data.is_none());
            assert_eq!(t.data_location, Some(DataLocation::External as i32));
            let value = |k: &str| {
                t.external_data
                    .iter()
                    .find(|e| e.key.as_deref() == Some(k))
                    .and_then(|e| e.value.clone())
                    .unwrap()
            };
            assert_eq!(value("location"), "weights.bin");
            let offset: usize = value("offset").parse().unwrap();
            assert_eq!(offset as u64 % ALIGN, 0);
            assert_eq!(value("length"), len.to_string());
            assert!(file[offset..offset + len].iter().all(|&x| x == fill));
        }
        assert_eq!(file.len(), 8192 + 4096);
        let mut back = out.model.clone();
        inline_weights(&mut back, "weights.bin", &Bytes::from(file)).unwrap();
        assert_eq!(back, model);
        let mut short = out.model;
        let err = inline_weights(&mut short, "weights.bin", &Bytes::from(vec![0u8; 100]));
        assert!(err
            .unwrap_err()
            .to_string()
            .contains("not within weights.bin"));
        // The original is untouched.
        let orig = &model.graph.as_ref().unwrap().initializer[0];
        assert_eq!(orig.raw_data.as_ref().map(Bytes::len), Some(5000));
    }

    #[test]
    fn weights_inside_the_file_become_references_to_where_they_are() {
        let file = Bytes::from((0..20_000u32).map(|i| (i % 256) as u8).collect::<Vec<u8>>());
        let mut inside = initializer("inside", vec![]);
        inside.raw_data = Some(file.slice(1001..9001));
        let outside = initializer("outside", vec![5; 8000]);
        let model = ModelProto {
            graph: Some(GraphProto {
                initializer: vec![inside, outside, initializer("small", vec![1; 10])],
                ..Default::default()
            }),
            ..Default::default()
        };
        let (out, moved) = external_in_place(&model, "blob", &file, 1024);
        assert_eq!(moved, 1);
        let g = out.graph.as_ref().unwrap();
        assert!(g.initializer[0].raw_data.is_none());
        assert_eq!(
            g.initializer[1].raw_data.as_ref().map(Bytes::len),
            Some(8000)
        );
        assert_eq!(g.initializer[2].raw_data.as_ref().map(Bytes::len), Some(10));
        let mut back = out.clone();
        inline_weights(&mut back, "blob", &file).unwrap();
        assert_eq!(back, model);
    }
}
