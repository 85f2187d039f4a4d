//! Generates the KServe v2 gRPC service (`proto/inference.proto`) with a
//! pure-Rust protobuf compiler (protox), so no `protoc` is needed: the
//! server always, and the client that the gRPC bench and tests use.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/inference.proto");
    let descriptors = protox::compile(["inference.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_transport(false)
        // Tensor bytes as `bytes::Bytes`: shared with the request buffer.
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .compile_fds(descriptors)?;
    Ok(())
}
