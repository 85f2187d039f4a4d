//! Times one pass of Tessera's kernels over every matrix of a GGUF with
//! kernels (one activation row), as a decode step reads them.
use tessera_gguf::file::GgufFile;
use tessera_gguf::kernels::{self, Blocks};

fn main() {
    let path = std::env::args().nth(1).expect("a GGUF");
    let bytes = std::fs::read(path).unwrap();
    let file = GgufFile::parse(&bytes).unwrap();
    let mats: Vec<(Blocks, Vec<f32>, Vec<f32>)> = file
        .tensors()
        .iter()
        .filter(|t| t.dims.len() == 2 && kernels::has_kernel(t.ty))
        .map(|t| {
            let (rows, cols) = t.rows_cols();
            let b = Blocks::new(t.ty, rows, cols, file.data(t)).unwrap();
            let x: Vec<f32> = (0..cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            (b, x, vec![0f32; rows])
        })
        .collect();
    let total: usize = mats.iter().map(|(b, _, _)| b.rows * b.cols).sum();
    for pass in 0..5 {
        let t = std::time::Instant::now();
        for (b, x, y) in &mats {
            let mut y = y.clone();
            kernels::matmul(b, x, &mut y, &kernels::serial).unwrap();
        }
        println!(
            "pass {pass}: {:.1} ms for {:.2} G weights",
            t.elapsed().as_secs_f64() * 1e3,
            total as f64 / 1e9
        );
    }
}
