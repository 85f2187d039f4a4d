// Resize of the last two axes of a 4-D tensor, nearest or (bi)linear, by
// tables of source rows and columns the host computed.
// p: [NC, H, W, OH, OW, mode (0 nearest, 1 linear), total,
//     per output row: (first, second, weight of the second) input row,
//     per output column: likewise for input columns]
// T: how tensors are stored (f16 in the half variant); math is f32.
alias T = f32;

@group(0) @binding(0) var<storage, read> x: array<T>;
@group(0) @binding(1) var<storage, read_write> y: array<T>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let H = p[1]; let W = p[2]; let OH = p[3]; let OW = p[4];
    let mode = p[5];
    let total = p[6];
    let stride = nw.x * 256u;
    for (var i = gid.x; i < total; i += stride) {
        let ow = i % OW;
        let oh = (i / OW) % OH;
        let nc = i / (OW * OH);
        let base = nc * H * W;
        let r = 7u + 3u * oh;
        let c = 7u + 3u * OH + 3u * ow;
        let y0 = p[r]; let x0 = p[c];
        if (mode == 0u) {
            y[i] = T(f32(x[base + y0 * W + x0]));
        } else {
            let y1 = p[r + 1u]; let x1 = p[c + 1u];
            let dy = bitcast<f32>(p[r + 2u]); let dx = bitcast<f32>(p[c + 2u]);
            let a = f32(x[base + y0 * W + x0]) * (1.0 - dx) + f32(x[base + y0 * W + x1]) * dx;
            let b = f32(x[base + y1 * W + x0]) * (1.0 - dx) + f32(x[base + y1 * W + x1]) * dx;
            y[i] = T(a * (1.0 - dy) + b * dy);
        }
    }
}
