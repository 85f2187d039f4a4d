// GlobalAveragePool / GlobalMaxPool: one workgroup reduces each (n, c)
// plane (planes beyond the launch's workgroups loop), 256 threads striding
// over it (workgroup_reduce.wgsl is appended).
// p: [NC, HW, mode (0 max, 1 avg)]
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
    let NC = p[0];
    let HW = p[1];
    let is_max = p[2] == 0u;
    for (var plane = wg.x; plane < NC; plane += nw.x) {
        var acc = 0.0;
        if (is_max) { acc = -3.402823e38; }
        for (var i = t; i < HW; i += 256u) {
            let v = f32(x[plane * HW + i]);
            if (is_max) { acc = max(acc, v); } else { acc += v; }
        }
        let r = workgroup_reduce(t, acc, is_max);
        if (t == 0u) {
            if (is_max) { y[plane] = T(r); } else { y[plane] = T(r / f32(HW)); }
        }
    }
}
