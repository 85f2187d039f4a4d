
// A reduction across a 256-thread workgroup (appended to the kernels that
// use it): every thread calls it with its local index `t` and value `v` in
// uniform control flow, and gets the maximum (`is_max`) or the sum.
var<workgroup> part: array<f32, 256>;

fn workgroup_reduce(t: u32, v: f32, is_max: bool) -> f32 {
    part[t] = v;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (t < s) {
            if (is_max) { part[t] = max(part[t], part[t + s]); } else { part[t] += part[t + s]; }
        }
        workgroupBarrier();
    }
    let r = part[0];
    workgroupBarrier();
    return r;
}
