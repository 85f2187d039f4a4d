// Batched GEMM, 16x16 tiles: y[b] = alpha * op(A[b]) op(B[b]) + beta * C.
// p: [M, N, K, trans_a, trans_b, alpha bits, beta bits, has_c, c_sm, c_sn,
//     batch_rank, batch_dims[4], a_bstrides[4], b_bstrides[4]]
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read> c: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

var<workgroup> ta: array<array<f32, 16>, 16>;
var<workgroup> tb: array<array<f32, 16>, 16>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let M = p[0];
    let N = p[1];
    let K = p[2];
    let trans_a = p[3];
    let trans_b = p[4];
    let row = wg.y * 16u + lid.y;
    let col = wg.x * 16u + lid.x;
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
    var acc = 0.0;
    let tiles = (K + 15u) / 16u;
    for (var t = 0u; t < tiles; t++) {
        let ka = t * 16u + lid.x;
        var va = 0.0;
        if (row < M && ka < K) {
            if (trans_a == 1u) { va = a[a_off + ka * M + row]; } else { va = a[a_off + row * K + ka]; }
        }
        ta[lid.y][lid.x] = va;
        let kb = t * 16u + lid.y;
        var vb = 0.0;
        if (col < N && kb < K) {
            if (trans_b == 1u) { vb = b[b_off + col * K + kb]; } else { vb = b[b_off + kb * N + col]; }
        }
        tb[lid.y][lid.x] = vb;
        workgroupBarrier();
        for (var i = 0u; i < 16u; i++) {
            acc += ta[lid.y][i] * tb[i][lid.x];
        }
        workgroupBarrier();
    }
    if (row < M && col < N) {
        var v = bitcast<f32>(p[5]) * acc;
        if (p[7] == 1u) {
            v += bitcast<f32>(p[6]) * c[row * p[8] + col * p[9]];
        }
        y[wg.z * M * N + row * N + col] = v;
    }
}
