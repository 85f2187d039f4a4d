//! Generates the ONNX protobuf types from the vendored upstream `onnx-ml.proto`
//! and `onnx-data.proto` (sequences, maps and optionals of test data)
//! with a pure-Rust protobuf compiler (protox), so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/onnx-ml.proto");
    println!("cargo:rerun-if-changed=proto/onnx-data.proto");
    let descriptors = protox::compile(["onnx-ml.proto", "onnx-data.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
