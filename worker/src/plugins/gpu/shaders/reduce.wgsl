// Reductions over any set of axes. For each output element (the input's
// shape with reduced axes set to 1), visit every reduced coordinate.
// p: [n_out, rank, mode (0 sum, 1 mean, 2 max, 3 min), red_count,
//     out_dims[6], in_strides[6], red_dims[6]]
// T: how tensors are stored (f16 in the half variant); math is f32.
alias T = f32;

@group(0) @binding(0) var<storage, read> x: array<T>;
@group(0) @binding(1) var<storage, read_write> y: array<T>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let n = p[0];
    let rank = p[1];
    let mode = p[2];
    let count = p[3];
    let stride = nw.x * 256u;
    for (var i = gid.x; i < n; i += stride) {
        var rest = i;
        var base = 0u;
        for (var k = 0u; k < rank; k++) {
            let axis = rank - 1u - k;
            let dim = p[4u + axis];
            base += (rest % dim) * p[10u + axis];
            rest = rest / dim;
        }
        var acc = 0.0;
        if (mode == 2u) { acc = -3.402823e38; }
        if (mode == 3u) { acc = 3.402823e38; }
        for (var r = 0u; r < count; r++) {
            var rr = r;
            var off = base;
            for (var k = 0u; k < rank; k++) {
                let axis = rank - 1u - k;
                let dim = p[16u + axis];
                off += (rr % dim) * p[10u + axis];
                rr = rr / dim;
            }
            let v = f32(x[off]);
            switch mode {
                case 2u: { acc = max(acc, v); }
                case 3u: { acc = min(acc, v); }
                default: { acc += v; }
            }
        }
        if (mode == 1u) { acc = acc / f32(max(count, 1u)); }
        y[i] = T(acc);
    }
}
