//! Tensors against NumPy and ONNX: `.npy` files written by NumPy read back
//! equal to the same arrays as `TensorProto`s (the ONNX node-test data of
//! onnx 1.17 included), and `.npy` files we write load in NumPy unchanged.

use std::path::Path;
use std::process::Command;

use prost::Message;
use tessera_common::onnx::proto::TensorProto;
use tessera_common::tensor::{read_npy, write_npy, Tensor};

const MAKE: &str = r#"
import glob, os, sys
import numpy as np, onnx
from onnx import numpy_helper
out = sys.argv[1]
arrays = {
    "f32": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
    "f64": np.array([[1e-300, -2.5]], dtype=np.float64),
    "i64": np.array([-(2**62), 5], dtype=np.int64),
    "i32": np.arange(-3, 3, dtype=np.int32),
    "i8": np.array([-128, 127], dtype=np.int8),
    "u8": np.arange(10, dtype=np.uint8).reshape(2, 5),
    "bool": np.array([True, False, True]),
    "f16": np.array([0.5, -1.25, 65504], dtype=np.float16),
    "scalar": np.array(3.0, dtype=np.float32),
    "empty": np.zeros((0, 4), dtype=np.float32),
}
for name, a in arrays.items():
    np.save(os.path.join(out, name + ".npy"), a)
    with open(os.path.join(out, name + ".pb"), "wb") as f:
        f.write(numpy_helper.from_array(a, name).SerializeToString())
# Real node-test data (typed fields and raw data alike).
root = os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/node")
count = 0
for pb in sorted(glob.glob(root + "/*/test_data_set_0/*.pb")):
    t = onnx.TensorProto()
    try:
        with open(pb, "rb") as f:
            t.ParseFromString(f.read())
        # Sequence and optional tests keep other protos in .pb files.
        if t.data_type in (0, onnx.TensorProto.STRING, onnx.TensorProto.BFLOAT16) or t.data_type > 16:
            continue
        a = numpy_helper.to_array(t)
    except Exception:
        continue
    if a.dtype.byteorder == ">" or a.dtype.kind not in "fiub" or a.dtype.itemsize > 8:
        continue
    name = "node_%04d" % count
    np.save(os.path.join(out, name + ".npy"), a.copy(order="C"))
    with open(os.path.join(out, name + ".pb"), "wb") as f:
        f.write(t.SerializeToString())
    count += 1
print(count)
"#;

const CHECK: &str = r#"
import os, sys
import numpy as np
out = sys.argv[1]
bad = 0
for name in sorted(os.listdir(out)):
    if not name.endswith(".theirs.npy"):
        continue
    theirs = np.load(os.path.join(out, name))
    ours = np.load(os.path.join(out, name.replace(".theirs.npy", ".ours.npy")))
    if theirs.dtype != ours.dtype or theirs.shape != ours.shape or theirs.tobytes() != ours.tobytes():
        print("mismatch", name, theirs.dtype, ours.dtype, theirs.shape, ours.shape)
        bad += 1
sys.exit(1 if bad else 0)
"#;

fn python(script: &str, dir: &Path) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(dir)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn npy_and_tensor_proto_agree_with_numpy_and_onnx() {
    let dir = std::env::temp_dir().join(format!("tessera-npy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let node_tensors: usize = python(MAKE, &dir).trim().parse().unwrap();
    assert!(
        node_tensors > 500,
        "only {node_tensors} node-test tensors found"
    );
    let mut checked = 0;
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    for npy in names
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "npy"))
    {
        let from_npy = read_npy(&std::fs::read(npy).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", npy.display()));
        let pb =
            TensorProto::decode(&std::fs::read(npy.with_extension("pb")).unwrap()[..]).unwrap();
        let from_pb = Tensor::from_proto(&pb).unwrap_or_else(|e| panic!("{}: {e}", npy.display()));
        assert_eq!(from_npy, from_pb, "{}", npy.display());
        // Our writer, read back by NumPy (checked below).
        let stem = npy.file_stem().unwrap().to_string_lossy().into_owned();
        std::fs::rename(npy, dir.join(format!("{stem}.theirs.npy"))).unwrap();
        std::fs::write(
            dir.join(format!("{stem}.ours.npy")),
            write_npy(&from_npy).unwrap(),
        )
        .unwrap();
        checked += 1;
    }
    python(CHECK, &dir);
    println!("tensor interop: {checked} arrays ({node_tensors} from ONNX node tests) agree with NumPy and onnx");
    let _ = std::fs::remove_dir_all(&dir);
}
