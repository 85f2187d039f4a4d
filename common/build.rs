//! Generates the ONNX protobuf types from the vendored upstream `onnx-ml.proto`
//! with a pure-Rust protobuf compiler (protox), so no `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/onnx-ml.proto");
    let descriptors = protox::compile(["onnx-ml.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
