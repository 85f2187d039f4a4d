// Adds up a split-K conv's partial sums (conv_gemm.wgsl) and the bias.
// p: [total (N*M*Q), splits, Q, M, has_bias]
// T: how tensors are stored (f16 in the half variant); math is f32.
alias T = f32;

@group(0) @binding(0) var<storage, read> partial: array<T>;
@group(0) @binding(1) var<storage, read> bias: array<T>;
@group(0) @binding(2) var<storage, read_write> y: array<T>;
@group(0) @binding(3) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let total = p[0];
    let splits = p[1];
    let stride = nw.x * 256u;
    for (var i = gid.x; i < total; i += stride) {
        var v = 0.0;
        if (p[4] == 1u) { v = f32(bias[(i / p[2]) % p[3]]); }
        for (var s = 0u; s < splits; s++) {
            v += f32(partial[s * total + i]);
        }
        y[i] = T(v);
    }
}
