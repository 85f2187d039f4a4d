//! The GPU's figures for the cost model, measured: GFLOPS from a GEMM
//! and memory bandwidth from a copy.

use std::collections::HashMap;
use std::time::Instant;

use tessera_common::declined::Declined;

use super::builder::{groups_1d, Builder, Step};
use super::context::Gpu;
use crate::plugin::PluginError;

/// Measures (GFLOPS, GB/s) on `gpu`: a 512³ GEMM and a 64 MB copy, each
/// run a few times after a warm-up.
pub fn calibrate(gpu: &Gpu) -> Result<(f64, f64), PluginError> {
    let consts = HashMap::new();
    let mut b = Builder::new(gpu, 17, &consts);
    let err = |e: Declined| PluginError::Infer(e.to_string());
    let n = 512usize;
    let a = b.output("a", vec![n, n]).map_err(err)?;
    let w = b.output("w", vec![n, n]).map_err(err)?;
    let y = b.output("y", vec![n, n]).map_err(err)?;
    let mut p = vec![
        n as u32,
        n as u32,
        n as u32,
        0,
        0,
        1f32.to_bits(),
        0,
        0,
        0,
        0,
        0,
    ];
    p.extend([1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
    let groups = (n.div_ceil(64) as u32, n.div_ceil(64) as u32, 1);
    b.dispatch("gemm", &[a, w, w, y], &p, groups).map_err(err)?;
    let words = 16usize << 20;
    let src = b.output("src", vec![words]).map_err(err)?;
    let dst = b.output("dst", vec![words]).map_err(err)?;
    let mut c = vec![words as u32, 1, 0, 0];
    c.extend([
        words as u32,
        1,
        1,
        1,
        1,
        1,
        1,
        0,
        0,
        0,
        0,
        0,
        1,
        0,
        0,
        0,
        0,
        0,
    ]);
    b.dispatch("copy", &[src, dst], &c, groups_1d(words))
        .map_err(err)?;
    let time = |step: &Step| -> Result<f64, PluginError> {
        let mut best = f64::MAX;
        for _ in 0..4 {
            let started = Instant::now();
            let mut encoder = gpu
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None });
            {
                let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                pass.set_pipeline(&step.pipeline);
                pass.set_bind_group(0, &step.bind_group, &[]);
                pass.dispatch_workgroups(step.groups.0, step.groups.1, step.groups.2);
            }
            gpu.queue.submit([encoder.finish()]);
            gpu.wait()?;
            best = best.min(started.elapsed().as_secs_f64());
        }
        Ok(best)
    };
    let gemm = time(&b.steps[0])?;
    let copy = time(&b.steps[1])?;
    let gflops = 2.0 * (n * n * n) as f64 / gemm / 1e9;
    let gbps = 2.0 * (words * 4) as f64 / copy / 1e9;
    Ok((gflops, gbps))
}
