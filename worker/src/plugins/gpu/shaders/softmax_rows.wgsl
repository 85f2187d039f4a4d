// Softmax / LogSoftmax over the middle axis of [outer, len, inner] for long
// rows: one workgroup per row (rows beyond the launch's workgroups loop),
// 256 threads striding along it (workgroup_reduce.wgsl is appended).
// p: [outer, len, inner, log]
// T: how tensors are stored (f16 in the half variant); math is f32.
alias T = f32;

@group(0) @binding(0) var<storage, read> x: array<T>;
@group(0) @binding(1) var<storage, read_write> y: array<T>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nw: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let len = p[1];
    let inner = p[2];
    let rows = p[0] * inner;
    for (var r = wg.x; r < rows; r += nw.x) {
        let base = (r / inner) * len * inner + r % inner;
        var m = -3.402823e38;
        for (var k = t; k < len; k += 256u) { m = max(m, f32(x[base + k * inner])); }
        m = workgroup_reduce(t, m, true);
        var sum = 0.0;
        for (var k = t; k < len; k += 256u) { sum += exp(f32(x[base + k * inner]) - m); }
        sum = workgroup_reduce(t, sum, false);
        for (var k = t; k < len; k += 256u) {
            let v = f32(x[base + k * inner]) - m;
            if (p[3] == 1u) { y[base + k * inner] = T(v - log(sum)); } else { y[base + k * inner] = T(exp(v) / sum); }
        }
    }
}
