// Softmax / LogSoftmax over the middle axis of [outer, len, inner].
// p: [outer, len, inner, log]
// T: how tensors are stored (f16 in the half variant); math is f32.
alias T = f32;

@group(0) @binding(0) var<storage, read> x: array<T>;
@group(0) @binding(1) var<storage, read_write> y: array<T>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let outer = p[0]; let len = p[1]; let inner = p[2];
    let rows = outer * inner;
    let stride = nw.x * 256u;
    for (var r = gid.x; r < rows; r += stride) {
        let o = r / inner;
        let j = r % inner;
        let base = o * len * inner + j;
        var m = -3.402823e38;
        for (var k = 0u; k < len; k++) { m = max(m, f32(x[base + k * inner])); }
        var s = 0.0;
        for (var k = 0u; k < len; k++) { s += exp(f32(x[base + k * inner]) - m); }
        for (var k = 0u; k < len; k++) {
            let v = f32(x[base + k * inner]) - m;
            if (p[3] == 1u) { y[base + k * inner] = T(v - log(s)); } else { y[base + k * inner] = T(exp(v) / s); }
        }
    }
}
