//! Times one pass of Tessera's kernels over every matrix of a GGUF with
//! kernels (one activation row), as a decode step reads them.
use tessera_gguf::file::GgufFile;
use tessera_gguf::kernels::{self, Blocks};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: kernel_pass MODEL.gguf")?;
    let bytes = std::fs::read(path)?;
    let file = GgufFile::parse(&bytes)?;
    let mats = file
        .tensors()
        .iter()
        .filter(|t| t.dims.len() == 2 && kernels::has_kernel(t.ty))
        .map(|t| {
            let (rows, cols) = t.rows_cols();
            let b = Blocks::new(t.ty, rows, cols, file.data(t))?;
            let x: Vec<f32> = (0..cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            Ok((b, x, vec![0f32; rows]))
        })
        .collect::<Result<Vec<(Blocks, Vec<f32>, Vec<f32>)>, Box<dyn std::error::Error>>>()?;
    let total: usize = mats.iter().map(|(b, _, _)| b.rows * b.cols).sum();
    for pass in 0..5 {
        let t = std::time::Instant::now();
        for (b, x, y) in &mats {
            let mut y = y.clone();
            kernels::matmul(b, x, &mut y, &kernels::serial)?;
        }
        println!(
            "pass {pass}: {:.1} ms for {:.2} G weights",
            t.elapsed().as_secs_f64() * 1e3,
            total as f64 / 1e9
        );
    }
    Ok(())
}
