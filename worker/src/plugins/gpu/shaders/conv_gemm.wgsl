// Convolution as an implicit GEMM (no im2col buffer): for image n and
// group g (workgroup z), Y[m, q] = sum_k W[m, k] * X[k, q], k = (ci, kh, kw),
// q = (oh, ow). 64x64 output tiles, 16-deep k steps through workgroup
// memory, 4x4 outputs per thread. For convs with many output channels per
// group; depthwise ones use the direct kernel (conv.wgsl).
// Split K: where few tiles would leave a big GPU idle, workgroup z also
// picks one of `splits` ranges of k, and y is a [splits, N, M, Q] buffer
// of partial sums that conv_splitk.wgsl adds up (with the bias).
// p: [N, C, H, W, M, OH, OW, KH, KW, group, sh, sw, dh, dw, pt, pl, has_bias,
//     total, splits, k per split]
// T: how tensors are stored (f16 in the half variant); math is f32.
alias T = f32;

@group(0) @binding(0) var<storage, read> x: array<T>;
@group(0) @binding(1) var<storage, read> w: array<T>;
@group(0) @binding(2) var<storage, read> bias: array<T>;
@group(0) @binding(3) var<storage, read_write> y: array<T>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

var<workgroup> tw: array<array<f32, 64>, 16>;
var<workgroup> tx: array<array<f32, 64>, 16>;

@compute @workgroup_size(16, 16)
fn main(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) tid: u32,
) {
    let C = p[1]; let H = p[2]; let W = p[3]; let M = p[4];
    let OH = p[5]; let OW = p[6]; let KH = p[7]; let KW = p[8]; let G = p[9];
    let sh = p[10]; let sw = p[11]; let dh = p[12]; let dw = p[13];
    let pt = i32(p[14]); let pl = i32(p[15]);
    let cg = C / G;
    let mg = M / G;
    let taps = KH * KW;
    let K = cg * taps;
    let Q = OH * OW;
    let splits = p[18];
    let split = wg.z % splits;
    let n = (wg.z / splits) / G;
    let g = (wg.z / splits) % G;
    let k_begin = split * p[19];
    let k_end = min(K, k_begin + p[19]);
    let m0 = wg.y * 64u;
    let q0 = wg.x * 64u;
    let xbase = (n * C + g * cg) * H * W;
    let wbase = g * mg * K;
    // Row i of the thread's 4x4 block in acc[i] (vectors, not an indexed
    // array: those can end up in local memory).
    var acc0 = vec4<f32>(); var acc1 = vec4<f32>(); var acc2 = vec4<f32>(); var acc3 = vec4<f32>();
    for (var k0 = k_begin; k0 < k_end; k0 += 16u) {
        for (var j = 0u; j < 4u; j++) {
            let idx = tid + 256u * j;
            // Weights: 64 rows (output channels) x 16 k, read along k.
            let r = idx / 16u;
            let kw_ = idx % 16u;
            var vw = 0.0;
            if (m0 + r < mg && k0 + kw_ < k_end) {
                vw = f32(w[wbase + (m0 + r) * K + k0 + kw_]);
            }
            tw[kw_][r] = vw;
            // Input: 16 k x 64 output positions, read along the positions.
            let kx = idx / 64u;
            let c = idx % 64u;
            let q = q0 + c;
            let k = k0 + kx;
            var vx = 0.0;
            if (q < Q && k < k_end) {
                let ci = k / taps;
                let tap = k % taps;
                let ih = i32((q / OW) * sh + (tap / KW) * dh) - pt;
                let iw = i32((q % OW) * sw + (tap % KW) * dw) - pl;
                if (ih >= 0 && ih < i32(H) && iw >= 0 && iw < i32(W)) {
                    vx = f32(x[xbase + ci * H * W + u32(ih) * W + u32(iw)]);
                }
            }
            tx[kx][c] = vx;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk++) {
            let a = vec4<f32>(tw[kk][lid.y], tw[kk][lid.y + 16u], tw[kk][lid.y + 32u], tw[kk][lid.y + 48u]);
            let b = vec4<f32>(tx[kk][lid.x], tx[kk][lid.x + 16u], tx[kk][lid.x + 32u], tx[kk][lid.x + 48u]);
            acc0 += a.x * b;
            acc1 += a.y * b;
            acc2 += a.z * b;
            acc3 += a.w * b;
        }
        workgroupBarrier();
    }
    // Partial sums go to plane `split` of the [splits, N, M, Q] buffer.
    let image = split * p[0] + n;
    put(image, g, m0 + lid.y, q0 + lid.x, acc0);
    put(image, g, m0 + lid.y + 16u, q0 + lid.x, acc1);
    put(image, g, m0 + lid.y + 32u, q0 + lid.x, acc2);
    put(image, g, m0 + lid.y + 48u, q0 + lid.x, acc3);
}

// Writes outputs (q, q + 16, q + 32, q + 48) of channel m of group g of
// image n (the bias where K is not split).
fn put(n: u32, g: u32, m: u32, q: u32, v: vec4<f32>) {
    let M = p[4];
    let mg = M / p[9];
    let Q = p[5] * p[6];
    if (m >= mg) { return; }
    var b0 = 0.0;
    if (p[16] == 1u && p[18] == 1u) { b0 = f32(bias[g * mg + m]); }
    let base = (n * M + g * mg + m) * Q;
    for (var j = 0u; j < 4u; j++) {
        if (q + 16u * j < Q) {
            y[base + q + 16u * j] = T(v[j] + b0);
        }
    }
}
