// BatchNormalization (inference): y = (x - mean[c]) / sqrt(var[c] + eps) * scale[c] + bias[c].
// p: [n, C, inner, eps bits]
// T: how tensors are stored (f16 in the half variant); math is f32.
alias T = f32;

@group(0) @binding(0) var<storage, read> x: array<T>;
@group(0) @binding(1) var<storage, read> scale: array<T>;
@group(0) @binding(2) var<storage, read> bias: array<T>;
@group(0) @binding(3) var<storage, read> mean: array<T>;
@group(0) @binding(4) var<storage, read> variance: array<T>;
@group(0) @binding(5) var<storage, read_write> y: array<T>;
@group(0) @binding(6) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let n = p[0]; let C = p[1]; let inner = p[2];
    let eps = bitcast<f32>(p[3]);
    let stride = nw.x * 256u;
    for (var i = gid.x; i < n; i += stride) {
        let c = (i / inner) % C;
        y[i] = T((f32(x[i]) - f32(mean[c])) / sqrt(f32(variance[c]) + eps) * f32(scale[c]) + f32(bias[c]));
    }
}
