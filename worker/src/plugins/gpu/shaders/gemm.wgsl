// Batched GEMM: y[b] = alpha * op(A[b]) op(B[b]) + beta * C. 64x64 tiles of
// y per workgroup, 16-deep k steps through workgroup memory, 4x4 outputs
// per thread.
// p: [M, N, K, trans_a, trans_b, alpha bits, beta bits, has_c, c_sm, c_sn,
//     batch_rank, batch_dims[4], a_bstrides[4], b_bstrides[4]]
// T: how tensors are stored (f16 in the half variant); math is f32.
alias T = f32;

@group(0) @binding(0) var<storage, read> a: array<T>;
@group(0) @binding(1) var<storage, read> b: array<T>;
@group(0) @binding(2) var<storage, read> c: array<T>;
@group(0) @binding(3) var<storage, read_write> y: array<T>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

var<workgroup> ta: array<array<f32, 64>, 16>;
var<workgroup> tb: array<array<f32, 64>, 16>;

@compute @workgroup_size(16, 16)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let M = p[0];
    let N = p[1];
    let K = p[2];
    let trans_a = p[3];
    let trans_b = p[4];
    let row0 = wg.y * 64u;
    let col0 = wg.x * 64u;
    // Batch offsets.
    var rest = wg.z;
    var a_off = 0u;
    var b_off = 0u;
    let brank = p[10];
    for (var k = 0u; k < brank; k++) {
        let axis = brank - 1u - k;
        let dim = p[11u + axis];
        let cc = rest % dim;
        rest = rest / dim;
        a_off += cc * p[15u + axis];
        b_off += cc * p[19u + axis];
    }
    // Row i of the thread's 4x4 block in acc[i] (vectors, not an indexed
    // array: those can end up in local memory).
    var acc0 = vec4<f32>(); var acc1 = vec4<f32>(); var acc2 = vec4<f32>(); var acc3 = vec4<f32>();
    for (var k0 = 0u; k0 < K; k0 += 16u) {
        for (var j = 0u; j < 4u; j++) {
            let idx = tid + 256u * j;
            // A: 64 rows x 16 k; read along k, or along the rows when A is
            // transposed.
            var r = idx / 16u;
            var ka = idx % 16u;
            if (trans_a == 1u) { r = idx % 64u; ka = idx / 64u; }
            var va = 0.0;
            if (row0 + r < M && k0 + ka < K) {
                if (trans_a == 1u) {
                    va = f32(a[a_off + (k0 + ka) * M + row0 + r]);
                } else {
                    va = f32(a[a_off + (row0 + r) * K + k0 + ka]);
                }
            }
            ta[ka][r] = va;
            // B: 16 k x 64 columns; read along the columns, or along k when
            // B is transposed.
            var col = idx % 64u;
            var kb = idx / 64u;
            if (trans_b == 1u) { col = idx / 16u; kb = idx % 16u; }
            var vb = 0.0;
            if (col0 + col < N && k0 + kb < K) {
                if (trans_b == 1u) {
                    vb = f32(b[b_off + (col0 + col) * K + k0 + kb]);
                } else {
                    vb = f32(b[b_off + (k0 + kb) * N + col0 + col]);
                }
            }
            tb[kb][col] = vb;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk++) {
            let ra = vec4<f32>(ta[kk][lid.y], ta[kk][lid.y + 16u], ta[kk][lid.y + 32u], ta[kk][lid.y + 48u]);
            let rb = vec4<f32>(tb[kk][lid.x], tb[kk][lid.x + 16u], tb[kk][lid.x + 32u], tb[kk][lid.x + 48u]);
            acc0 += ra.x * rb;
            acc1 += ra.y * rb;
            acc2 += ra.z * rb;
            acc3 += ra.w * rb;
        }
        workgroupBarrier();
    }
    put(wg.z, row0 + lid.y, col0 + lid.x, acc0);
    put(wg.z, row0 + lid.y + 16u, col0 + lid.x, acc1);
    put(wg.z, row0 + lid.y + 32u, col0 + lid.x, acc2);
    put(wg.z, row0 + lid.y + 48u, col0 + lid.x, acc3);
}

// Writes f32(y[batch])[row][col + 16 j] = alpha * v[j] + beta * C, j < 4.
fn put(batch: u32, row: u32, col: u32, v: vec4<f32>) {
    let M = p[0];
    let N = p[1];
    if (row >= M) { return; }
    let alpha = bitcast<f32>(p[5]);
    let beta = bitcast<f32>(p[6]);
    for (var j = 0u; j < 4u; j++) {
        let cj = col + 16u * j;
        if (cj >= N) { continue; }
        var r = alpha * v[j];
        if (p[7] == 1u) {
            r += beta * f32(c[row * p[8] + cj * p[9]]);
        }
        y[batch * M * N + row * N + cj] = T(r);
    }
}
