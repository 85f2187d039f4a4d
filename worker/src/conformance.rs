//! The conformance suite, written once against `&dyn DevicePlugin`: the ONNX
//! backend node tests (`onnx/backend/test/data/node/*/` of the onnx 1.17
//! wheel: `model.onnx` and `test_data_set_0/{input,output}_N.pb`) through
//! QueryNetwork, compile and infer.
//!
//! Each test ends as *unsupported* (QueryNetwork refused a node), *passed*
//! or *failed*; a failure is any case QueryNetwork accepted that then did
//! not compile, did not run or gave a wrong answer. Requests run through
//! `infer_values`, so graphs that take or return sequences and optionals
//! (test data in `SequenceProto`/`OptionalProto`) are tested like the rest
//! on backends that carry them.
//! Floats compare with rtol 1e-3 and atol 1e-4 × max(1, max |expected|)
//! (NaN equals NaN; a DFT's zeros come out as ±1e-4 of its magnitudes),
//! integers and booleans exactly. bfloat16 test data, which onnx stores as
//! uint16 bits (numpy has no bfloat16), is read as bfloat16 where the model
//! declares it.
//!
//! Integer graph inputs are frozen into initializers with the test's own
//! values before querying (they are shapes, axes or indices, which real
//! models carry as constants), and so are the parameter inputs of the ops
//! listed in `PARAMETER_INPUTS` (batch-norm statistics, quantization
//! scales, resize scales, pad values: initializers in real models); every
//! plugin is tested the same way.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use prost::Message;
use tessera_common::onnx::proto::{
    type_proto, ModelProto, OptionalProto, SequenceProto, TensorProto, TypeProto, ValueInfoProto,
};
use tessera_common::onnx::{decode_model, ElemType};
use tessera_common::tensor::{Tensor, Value};

use crate::plugin::{Config, DevicePlugin};

/// The outcome of one node test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Unsupported(String),
    Failed(String),
}

/// Totals of a run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub passed: Vec<String>,
    pub unsupported: Vec<(String, String)>,
    pub failed: Vec<(String, String)>,
    /// Tests in [`ERRATA`] whose expected data the plugin did not match.
    pub errata: Vec<(String, String)>,
}

/// Node tests whose expected outputs disagree with onnxruntime 1.32 and,
/// for the int8 ones and Adam's, with the operator's specification
/// (checked): a plugin that does not match them is listed apart, neither
/// passed nor failed.
pub const ERRATA: &[(&str, &str)] = &[
    (
        "test_qlinearmatmul_2D_int8_float16",
        "expected data wraps int8 overflow; the spec and onnxruntime saturate",
    ),
    (
        "test_qlinearmatmul_2D_int8_float32",
        "expected data wraps int8 overflow; the spec and onnxruntime saturate",
    ),
    (
        "test_qlinearmatmul_3D_int8_float16",
        "expected data wraps int8 overflow; the spec and onnxruntime saturate",
    ),
    (
        "test_qlinearmatmul_3D_int8_float32",
        "expected data wraps int8 overflow; the spec and onnxruntime saturate",
    ),
    (
        "test_cast_FLOAT_to_STRING",
        "expected data print the shortest digits that round-trip; onnxruntime prints 8 \
         significant digits (0.60484552 for 0.6048455), the same float32",
    ),
    (
        "test_castlike_FLOAT_to_STRING",
        "expected data print the shortest digits that round-trip; onnxruntime prints 8 \
         significant digits (0.60484552 for 0.6048455), the same float32",
    ),
    (
        "test_castlike_FLOAT_to_STRING_expanded",
        "expected data print the shortest digits that round-trip; onnxruntime prints 8 \
         significant digits (0.60484552 for 0.6048455), the same float32",
    ),
    (
        "test_adam_multiple",
        "expected data were computed with epsilon 1e-2, which the node does not set \
         (the specification's default is 1e-6)",
    ),
    (
        "test_cast_FLOAT_to_BFLOAT16",
        "expected data truncate to bfloat16; onnxruntime rounds to nearest even",
    ),
    (
        "test_castlike_FLOAT_to_BFLOAT16",
        "expected data truncate to bfloat16; onnxruntime rounds to nearest even",
    ),
    (
        "test_castlike_FLOAT_to_BFLOAT16_expanded",
        "expected data truncate to bfloat16; onnxruntime rounds to nearest even",
    ),
];

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} passed, {} unsupported, {} failed, {} errata",
            self.passed.len(),
            self.unsupported.len(),
            self.failed.len(),
            self.errata.len()
        )
    }
}

/// The node-test folders under `root`, sorted.
pub fn node_tests(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// Runs every test folder through `plugin`.
pub fn run(plugin: &dyn DevicePlugin, tests: &[PathBuf]) -> Report {
    let mut report = Report::default();
    for dir in tests {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let outcome = catch_unwind(AssertUnwindSafe(|| run_one(plugin, dir)))
            .unwrap_or_else(|_| Outcome::Failed("panicked".into()));
        match outcome {
            Outcome::Passed => report.passed.push(name),
            Outcome::Unsupported(why) => report.unsupported.push((name, why)),
            Outcome::Failed(why) => match ERRATA.iter().find(|(test, _)| *test == name) {
                Some((_, erratum)) => report.errata.push((name, format!("{why} ({erratum})"))),
                None => report.failed.push((name, why)),
            },
        }
    }
    report
}

/// The element type of a tensor, or of the tensors a sequence or optional
/// holds.
fn declared_elem(ty: Option<&TypeProto>) -> ElemType {
    match ty.and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) => ElemType(t.elem_type.unwrap_or(0)),
        Some(type_proto::Value::SequenceType(s)) => declared_elem(s.elem_type.as_deref()),
        Some(type_proto::Value::OptionalType(o)) => declared_elem(o.elem_type.as_deref()),
        _ => ElemType::UNDEFINED,
    }
}

/// Decodes one test-data file as the value `declared` says it holds.
fn decode_value(bytes: &[u8], declared: Option<&ValueInfoProto>) -> Result<Value, String> {
    let ty = declared.and_then(|v| v.r#type.as_ref());
    let elem = declared_elem(ty);
    let text = |e: &dyn std::fmt::Display| e.to_string();
    match ty.and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::SequenceType(_)) => {
            let p = SequenceProto::decode(bytes).map_err(|e| text(&e))?;
            Value::from_sequence_proto(&p, elem).map_err(|e| text(&e))
        }
        Some(type_proto::Value::OptionalType(_)) => {
            let p = OptionalProto::decode(bytes).map_err(|e| text(&e))?;
            Value::from_optional_proto(&p, elem).map_err(|e| text(&e))
        }
        _ => {
            let p = TensorProto::decode(bytes).map_err(|e| text(&e))?;
            Tensor::from_proto(&p)
                .map(Value::Tensor)
                .map_err(|e| text(&e))
        }
    }
}

/// The test-data files `<prefix>N.pb` of `dir`, decoded as `declared`
/// (the graph's inputs or outputs, in order) says.
fn read_values(
    dir: &Path,
    prefix: &str,
    declared: &[&ValueInfoProto],
) -> Result<Vec<Value>, String> {
    read_files(dir, prefix)?
        .iter()
        .enumerate()
        .map(|(k, bytes)| decode_value(bytes, declared.get(k).copied()))
        .collect()
}

fn read_files(dir: &Path, prefix: &str) -> Result<Vec<Vec<u8>>, String> {
    let mut files: Vec<(usize, PathBuf)> = std::fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let stem = p
                .file_stem()?
                .to_str()?
                .strip_prefix(prefix)?
                .parse()
                .ok()?;
            Some((stem, p))
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|(_, p)| std::fs::read(&p).map_err(|e| e.to_string()))
        .collect()
}

/// Parameter inputs by op: the input positions that hold weights, scales,
/// zero points, pad values or window settings, which real models carry as
/// initializers (data inputs are never listed).
const PARAMETER_INPUTS: &[(&str, &[usize])] = &[
    ("BatchNormalization", &[1, 2, 3, 4]),
    ("Compress", &[1]),
    ("DequantizeLinear", &[1, 2]),
    ("Dropout", &[1, 2]),
    ("MelWeightMatrix", &[0, 1, 2, 3, 4]),
    ("OneHot", &[1, 2]),
    ("Pad", &[1, 2, 3]),
    ("QLinearMatMul", &[1, 2, 4, 5, 6, 7]),
    ("QuantizeLinear", &[1, 2]),
    ("Resize", &[1, 2, 3]),
    ("STFT", &[1, 2, 3]),
    ("Upsample", &[1]),
];

/// The graph inputs `graph`'s nodes use as parameter inputs.
fn parameter_inputs(graph: &tessera_common::onnx::proto::GraphProto) -> Vec<String> {
    let mut names = Vec::new();
    for node in &graph.node {
        let op = node.op_type.as_deref().unwrap_or("");
        let Some((_, positions)) = PARAMETER_INPUTS.iter().find(|(o, _)| *o == op) else {
            continue;
        };
        for &k in *positions {
            if let Some(name) = node.input.get(k).filter(|n| !n.is_empty()) {
                names.push(name.clone());
            }
        }
    }
    names
}

/// Runs one test folder.
pub fn run_one(plugin: &dyn DevicePlugin, dir: &Path) -> Outcome {
    let unsupported = |m: String| Outcome::Unsupported(m);
    let bytes = match std::fs::read(dir.join("model.onnx")) {
        Ok(b) => b,
        Err(e) => return Outcome::Failed(format!("cannot read model: {e}")),
    };
    let mut model: ModelProto = match decode_model(&bytes) {
        Ok(m) => m,
        Err(e) => return unsupported(format!("model: {e}")),
    };
    let Some(graph) = model.graph.as_mut() else {
        return Outcome::Failed("no graph".into());
    };
    let data = dir.join("test_data_set_0");
    let inits: Vec<String> = graph
        .initializer
        .iter()
        .filter_map(|t| t.name.clone())
        .collect();
    let real_inputs: Vec<usize> = (0..graph.input.len())
        .filter(|&i| !inits.contains(&graph.input[i].name.clone().unwrap_or_default()))
        .collect();
    let declared_inputs: Vec<&ValueInfoProto> =
        real_inputs.iter().map(|&i| &graph.input[i]).collect();
    let declared_outputs: Vec<&ValueInfoProto> = graph.output.iter().collect();
    let (mut inputs, mut expected) = match (
        read_values(&data, "input_", &declared_inputs),
        read_values(&data, "output_", &declared_outputs),
    ) {
        (Ok(i), Ok(o)) => (i, o),
        (Err(e), _) | (_, Err(e)) => return unsupported(format!("test data: {e}")),
    };
    as_declared_bfloat16(&mut inputs, &declared_inputs);
    as_declared_bfloat16(&mut expected, &declared_outputs);
    if real_inputs.len() != inputs.len() {
        return unsupported(format!(
            "{} graph inputs, {} test inputs",
            real_inputs.len(),
            inputs.len()
        ));
    }
    let feeds = freeze_parameters(graph, &real_inputs, inputs);
    check(plugin, &model, &feeds, &expected)
}

/// Freezes integer inputs and the parameter inputs of ops (see the module
/// doc) into initializers; the rest are the request's feeds.
fn freeze_parameters(
    graph: &mut tessera_common::onnx::proto::GraphProto,
    real_inputs: &[usize],
    inputs: Vec<Value>,
) -> Vec<Value> {
    let parameters = parameter_inputs(graph);
    let mut feeds = Vec::new();
    let mut frozen = Vec::new();
    for (&i, value) in real_inputs.iter().zip(inputs) {
        let name = graph.input[i].name.clone().unwrap_or_default();
        match value {
            Value::Tensor(t)
                if matches!(t.elem(), ElemType::INT64 | ElemType::INT32)
                    || parameters.contains(&name) =>
            {
                graph.initializer.push(t.to_proto(&name));
                frozen.push(i);
            }
            other => feeds.push(other),
        }
    }
    for &i in frozen.iter().rev() {
        graph.input.remove(i);
    }
    feeds
}

/// QueryNetwork, compile and one request on `plugin`, checked against
/// `expected`.
fn check(
    plugin: &dyn DevicePlugin,
    model: &ModelProto,
    feeds: &[Value],
    expected: &[Value],
) -> Outcome {
    let query = match plugin.query_network(model) {
        Ok(q) => q,
        Err(e) => return Outcome::Unsupported(format!("query_network: {e}")),
    };
    if let Some((node, why)) = query.unsupported.iter().next() {
        return Outcome::Unsupported(format!("{node}: {why}"));
    }
    let compiled = match plugin.compile(&model.encode_to_vec().into(), &Config::default()) {
        Ok(c) => c,
        Err(e) => return Outcome::Failed(format!("accepted but did not compile: {e}")),
    };
    let outputs = match compiled.infer_values(feeds) {
        Ok(r) => r,
        Err(e) => return Outcome::Failed(format!("accepted but did not run: {e}")),
    };
    if outputs.len() != expected.len() {
        return Outcome::Failed(format!(
            "{} outputs, expected {}",
            outputs.len(),
            expected.len()
        ));
    }
    for (k, (got, want)) in outputs.iter().zip(expected).enumerate() {
        if let Err(why) = compare_values(got, want) {
            return Outcome::Failed(format!("output {k}: {why}"));
        }
    }
    Outcome::Passed
}

/// How an output differs from the expected value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Mismatch {
    #[error("type {got} instead of {want}")]
    Type { got: ElemType, want: ElemType },
    #[error("shape {got:?} instead of {want:?}")]
    Shape { got: Vec<usize>, want: Vec<usize> },
    /// The first element that differs (beyond the tolerance), each as
    /// written in the message.
    #[error("element {index}: {got} instead of {want}")]
    Element {
        index: usize,
        got: String,
        want: String,
    },
    #[error("a string tensor that does not decode")]
    Undecodable,
    #[error("a sequence of {got} tensors, expected {want}")]
    SequenceLength { got: usize, want: usize },
    #[error("item {index}: {source}")]
    Item { index: usize, source: Box<Mismatch> },
    /// A value of another kind (a tensor for a sequence, an empty optional).
    #[error("{got} instead of {want}")]
    Kind { got: String, want: String },
}

/// Compares values: tensors as [`compare`] does, sequences item by item,
/// optionals by presence then contents.
pub fn compare_values(got: &Value, want: &Value) -> Result<(), Mismatch> {
    match (got, want) {
        (Value::Tensor(g), Value::Tensor(w)) => compare(g, w),
        (Value::Sequence { items: g, .. }, Value::Sequence { items: w, .. }) => {
            if g.len() != w.len() {
                return Err(Mismatch::SequenceLength {
                    got: g.len(),
                    want: w.len(),
                });
            }
            g.iter().zip(w).enumerate().try_for_each(|(index, (g, w))| {
                compare(g, w).map_err(|e| Mismatch::Item {
                    index,
                    source: Box::new(e),
                })
            })
        }
        (Value::Optional(None), Value::Optional(None)) => Ok(()),
        (Value::Optional(Some(g)), Value::Optional(Some(w))) => compare_values(g, w),
        (g, w) => Err(Mismatch::Kind {
            got: g.to_string(),
            want: w.to_string(),
        }),
    }
}

/// uint16 test data for tensors the model declares bfloat16, as bfloat16.
fn as_declared_bfloat16(values: &mut [Value], declared: &[&ValueInfoProto]) {
    for (v, d) in values.iter_mut().zip(declared) {
        let bf16 = crate::plugin::TensorSpec::from_value_info(d)
            .is_some_and(|s| s.elem == ElemType::BFLOAT16);
        let Value::Tensor(t) = v else { continue };
        if bf16 && t.elem() == ElemType::UINT16 {
            if let Ok(retyped) =
                Tensor::new(ElemType::BFLOAT16, t.shape().to_vec(), t.shared_bytes())
            {
                *t = retyped;
            }
        }
    }
}

fn f16_to_f32(bits: u16) -> f32 {
    let sign = (bits >> 15) as u32;
    let exp = ((bits >> 10) & 0x1f) as u32;
    let frac = (bits & 0x3ff) as u32;
    let v = match (exp, frac) {
        (0, 0) => 0.0,
        (0, f) => (f as f32) * 2f32.powi(-24),
        (31, 0) => f32::INFINITY,
        (31, _) => f32::NAN,
        (e, f) => f32::from_bits(((e + 112) << 23) | (f << 13)),
    };
    if sign == 1 {
        -v
    } else {
        v
    }
}

fn as_f64(t: &Tensor) -> Option<Vec<f64>> {
    let b = t.bytes();
    Some(match t.elem() {
        ElemType::FLOAT => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
        ElemType::DOUBLE => b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect(),
        ElemType::FLOAT16 => b
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]])) as f64)
            .collect(),
        ElemType::BFLOAT16 => b
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16) as f64)
            .collect(),
        _ => return None,
    })
}

/// Compares an output with the expected tensor (see the module doc).
pub fn compare(got: &Tensor, want: &Tensor) -> Result<(), Mismatch> {
    if got.elem() != want.elem() {
        return Err(Mismatch::Type {
            got: got.elem(),
            want: want.elem(),
        });
    }
    if got.shape() != want.shape() {
        return Err(Mismatch::Shape {
            got: got.shape().to_vec(),
            want: want.shape().to_vec(),
        });
    }
    match (as_f64(got), as_f64(want)) {
        (Some(g), Some(w)) => {
            let scale = w
                .iter()
                .filter(|v| v.is_finite())
                .fold(1.0f64, |m, v| m.max(v.abs()));
            for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                let close = (a.is_nan() && b.is_nan())
                    || a == b
                    || (a - b).abs() <= 1e-4 * scale + 1e-3 * b.abs();
                if !close {
                    return Err(Mismatch::Element {
                        index: i,
                        got: a.to_string(),
                        want: b.to_string(),
                    });
                }
            }
            Ok(())
        }
        _ if got.bytes() == want.bytes() => Ok(()),
        _ if got.elem() == ElemType::STRING => {
            let (g, w) = (got.strings(), want.strings());
            let (Ok(g), Ok(w)) = (g, w) else {
                return Err(Mismatch::Undecodable);
            };
            let first = g.iter().zip(&w).position(|(a, b)| a != b).unwrap_or(0);
            let text = |v: &[&[u8]]| {
                String::from_utf8_lossy(v.get(first).copied().unwrap_or(b"")).into_owned()
            };
            Err(Mismatch::Element {
                index: first,
                got: format!("{:?}", text(&g)),
                want: format!("{:?}", text(&w)),
            })
        }
        _ => {
            let width = got.elem().size_bytes().unwrap_or(1).max(1) as usize;
            let first = got
                .bytes()
                .chunks(width)
                .zip(want.bytes().chunks(width))
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            let at = |t: &Tensor| {
                t.bytes()
                    .get(first * width..(first + 1) * width)
                    .map(<[u8]>::to_vec)
            };
            Err(Mismatch::Element {
                index: first,
                got: format!("bytes {:?}", at(got).unwrap_or_default()),
                want: format!("bytes {:?}", at(want).unwrap_or_default()),
            })
        }
    }
}
