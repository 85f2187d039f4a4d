pub mod affinity;
pub mod dump;
pub mod export;
pub mod graph;
pub mod onnx;
pub mod partition;
pub mod synth;
