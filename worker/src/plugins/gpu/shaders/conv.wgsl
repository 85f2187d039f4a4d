// Direct 2-D convolution (1-D as H = 1), groups, strides, dilations, pads.
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
    let sh = p[10]; let sw = p[11]; let dh = p[12]; let dw = p[13];
    let pt = i32(p[14]); let pl = i32(p[15]);
    let total = p[17];
    let cg = C / G;
    let mg = M / G;
    let stride = nw.x * 256u;
    for (var i = gid.x; i < total; i += stride) {
        let ow = i % OW;
        let oh = (i / OW) % OH;
        let m = (i / (OW * OH)) % M;
        let n = i / (OW * OH * M);
        let g = m / mg;
        var acc = 0.0;
        if (p[16] == 1u) { acc = f32(bias[m]); }
        for (var ci = 0u; ci < cg; ci++) {
            let c = g * cg + ci;
            let xbase = (n * C + c) * H * W;
            let wbase = (m * cg + ci) * KH * KW;
            for (var kh = 0u; kh < KH; kh++) {
                let ih = i32(oh * sh + kh * dh) - pt;
                if (ih < 0 || ih >= i32(H)) { continue; }
                for (var kw = 0u; kw < KW; kw++) {
                    let iw = i32(ow * sw + kw * dw) - pl;
                    if (iw < 0 || iw >= i32(W)) { continue; }
                    acc += f32(x[xbase + u32(ih) * W + u32(iw)]) * f32(w[wbase + kh * KW + kw]);
                }
            }
        }
        y[i] = T(acc);
    }
}
