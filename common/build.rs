//! Generates the ONNX protobuf types from the vendored upstream `onnx-ml.proto`
//! and `onnx-data.proto` (sequences, maps and optionals of test data)
//! with a pure-Rust protobuf compiler (protox), so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/onnx-ml.proto");
    println!("cargo:rerun-if-changed=proto/onnx-data.proto");
    let descriptors = protox::compile(["onnx-ml.proto", "onnx-data.proto"], ["proto"])?;
    // Tensor bytes as `bytes::Bytes`: a model decoded from a `Bytes` buffer
    // shares its weights with it, and clones of a model (the graph, each
    // exported subgraph) share them too instead of copying.
    prost_build::Config::new()
        .bytes([".onnx.TensorProto.raw_data"])
        .compile_fds(descriptors)?;
    Ok(())
}
