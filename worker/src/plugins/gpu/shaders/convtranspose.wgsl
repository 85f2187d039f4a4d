// 2-D transposed convolution (1-D as H = 1), groups, strides, dilations,
// pads, output padding. Weights [C, M/group, KH, KW].
// p: [N, C, H, W, M, OH, OW, KH, KW, group, sh, sw, dh, dw, pt, pl, has_bias, total]
// T: how tensors are stored (f16 in the half variant); math is f32.
alias T = f32;

@group(0) @binding(0) var<storage, read> x: array<T>;
@group(0) @binding(1) var<storage, read> w: array<T>;
@group(0) @binding(2) var<storage, read> bias: array<T>;
@group(0) @binding(3) var<storage, read_write> y: array<T>;
@group(0) @binding(4) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let C = p[1]; let H = p[2]; let W = p[3]; let M = p[4];
    let OH = p[5]; let OW = p[6]; let KH = p[7]; let KW = p[8]; let G = p[9];
    let sh = i32(p[10]); let sw = i32(p[11]); let dh = i32(p[12]); let dw = i32(p[13]);
    let pt = i32(p[14]); let pl = i32(p[15]);
    let total = p[17];
    let cg = C / G;
    let mg = M / G;
    let stride = nw.x * 256u;
    for (var i = gid.x; i < total; i += stride) {
        let ow = i32(i % OW);
        let oh = i32((i / OW) % OH);
        let m = (i / (OW * OH)) % M;
        let n = i / (OW * OH * M);
        let g = m / mg;
        let mi = m % mg;
        var acc = 0.0;
        if (p[16] == 1u) { acc = f32(bias[m]); }
        for (var kh = 0; kh < i32(KH); kh++) {
            let th = oh + pt - kh * dh;
            if (th < 0 || th % sh != 0) { continue; }
            let ih = th / sh;
            if (ih >= i32(H)) { continue; }
            for (var kw = 0; kw < i32(KW); kw++) {
                let tw = ow + pl - kw * dw;
                if (tw < 0 || tw % sw != 0) { continue; }
                let iw = tw / sw;
                if (iw >= i32(W)) { continue; }
                for (var ci = 0u; ci < cg; ci++) {
                    let c = g * cg + ci;
                    acc += f32(x[((n * C + c) * H + u32(ih)) * W + u32(iw)])
                        * f32(w[((c * mg + mi) * KH + u32(kh)) * KW + u32(kw)]);
                }
            }
        }
        y[i] = T(acc);
    }
}
