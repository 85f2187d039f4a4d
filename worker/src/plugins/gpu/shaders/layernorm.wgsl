// LayerNormalization over the trailing `len` elements of each row:
// y = (x - mean) / sqrt(var + eps) * scale + bias (scale, bias of `len`);
// also each row's mean and 1 / sqrt(var + eps).
// p: [rows, len, eps bits, has_bias]
// T: how tensors are stored (f16 in the half variant); math is f32.
alias T = f32;

@group(0) @binding(0) var<storage, read> x: array<T>;
@group(0) @binding(1) var<storage, read> scale: array<T>;
@group(0) @binding(2) var<storage, read> bias: array<T>;
@group(0) @binding(3) var<storage, read_write> y: array<T>;
@group(0) @binding(4) var<storage, read_write> mean_out: array<T>;
@group(0) @binding(5) var<storage, read_write> inv_out: array<T>;
@group(0) @binding(6) var<storage, read> p: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let rows = p[0];
    let len = p[1];
    let eps = bitcast<f32>(p[2]);
    let stride = nw.x * 64u;
    for (var r = gid.x; r < rows; r += stride) {
        let base = r * len;
        var mean = 0.0;
        for (var k = 0u; k < len; k++) { mean += f32(x[base + k]); }
        mean = mean / f32(len);
        var v = 0.0;
        for (var k = 0u; k < len; k++) { let d = f32(x[base + k]) - mean; v += d * d; }
        let inv = 1.0 / sqrt(v / f32(len) + eps);
        mean_out[r] = T(mean);
        inv_out[r] = T(inv);
        for (var k = 0u; k < len; k++) {
            var o = (f32(x[base + k]) - mean) * inv * f32(scale[k]);
            if (p[3] == 1u) { o += f32(bias[k]); }
            y[base + k] = T(o);
        }
    }
}
