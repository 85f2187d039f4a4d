// Resize of the last two axes of a 4-D tensor, nearest or (bi)linear.
// p: [NC, H, W, OH, OW, mode (0 nearest, 1 linear), coord (0 half_pixel,
//     1 asymmetric, 2 align_corners, 3 pytorch_half_pixel), nearest
//     (0 round_prefer_floor, 1 round_prefer_ceil, 2 floor, 3 ceil),
//     scale_h bits, scale_w bits, total]
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

fn source(o: u32, in_len: u32, out_len: u32, scale: f32, coord: u32) -> f32 {
    let fo = f32(o);
    switch coord {
        case 1u: { return fo / scale; }
        case 2u: {
            // The spec's length_resized is length_original * scale (not
            // rounded down) when scales are given.
            let resized = f32(in_len) * scale;
            if (resized <= 1.0) { return 0.0; }
            return fo * f32(in_len - 1u) / (resized - 1.0);
        }
        case 3u: {
            if (out_len == 1u) { return 0.0; }
            return (fo + 0.5) / scale - 0.5;
        }
        default: { return (fo + 0.5) / scale - 0.5; }
    }
}

fn nearest(v: f32, mode: u32) -> i32 {
    switch mode {
        case 1u: { if (v - floor(v) == 0.5) { return i32(ceil(v)); } return i32(round(v)); }
        case 2u: { return i32(floor(v)); }
        case 3u: { return i32(ceil(v)); }
        default: { if (v - floor(v) == 0.5) { return i32(floor(v)); } return i32(round(v)); }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let H = p[1]; let W = p[2]; let OH = p[3]; let OW = p[4];
    let mode = p[5]; let coord = p[6]; let nmode = p[7];
    let sh = bitcast<f32>(p[8]); let sw = bitcast<f32>(p[9]);
    let total = p[10];
    let stride = nw.x * 256u;
    for (var i = gid.x; i < total; i += stride) {
        let ow = i % OW;
        let oh = (i / OW) % OH;
        let nc = i / (OW * OH);
        let base = nc * H * W;
        let fy = source(oh, H, OH, sh, coord);
        let fx = source(ow, W, OW, sw, coord);
        if (mode == 0u) {
            let iy = clamp(nearest(fy, nmode), 0, i32(H) - 1);
            let ix = clamp(nearest(fx, nmode), 0, i32(W) - 1);
            y[i] = x[base + u32(iy) * W + u32(ix)];
        } else {
            let cy = clamp(fy, 0.0, f32(H - 1u));
            let cx = clamp(fx, 0.0, f32(W - 1u));
            let y0 = u32(floor(cy)); let x0 = u32(floor(cx));
            let y1 = min(y0 + 1u, H - 1u); let x1 = min(x0 + 1u, W - 1u);
            let dy = cy - f32(y0); let dx = cx - f32(x0);
            let a = x[base + y0 * W + x0] * (1.0 - dx) + x[base + y0 * W + x1] * dx;
            let b = x[base + y1 * W + x0] * (1.0 - dx) + x[base + y1 * W + x1] * dx;
            y[i] = a * (1.0 - dy) + b * dy;
        }
    }
}
