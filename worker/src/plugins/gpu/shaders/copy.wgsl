// Strided copy: Transpose, Concat, Slice, Split, Expand. For each index of
// iter_dims: y[dst_off + sum(c * dst_strides)] = x[src_off + sum(c * src_strides)].
// p: [n, rank, src_off, dst_off, dims[6], src_strides[6] (i32 bits), dst_strides[6]]
// T: how tensors are stored (f16 in the half variant); math is f32.
alias T = f32;

@group(0) @binding(0) var<storage, read> x: array<T>;
@group(0) @binding(1) var<storage, read_write> y: array<T>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let n = p[0];
    let rank = p[1];
    let stride = nw.x * 256u;
    for (var i = gid.x; i < n; i += stride) {
        var rest = i;
        var s = i32(p[2]);
        var d = p[3];
        for (var k = 0u; k < rank; k++) {
            let axis = rank - 1u - k;
            let dim = p[4u + axis];
            let c = rest % dim;
            rest = rest / dim;
            s += i32(c) * bitcast<i32>(p[10u + axis]);
            d += c * p[16u + axis];
        }
        y[d] = x[u32(s)];
    }
}
