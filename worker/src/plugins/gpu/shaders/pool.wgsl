// 2-D pooling (1-D as H = 1); global pooling is global_pool.wgsl.
// p: [NC, H, W, OH, OW, KH, KW, sh, sw, dh, dw, pt, pl, mode (0 max, 1 avg),
//     count_include_pad, pb, pr, total]
// T: how tensors are stored (f16 in the half variant); math is f32.
alias T = f32;

@group(0) @binding(0) var<storage, read> x: array<T>;
@group(0) @binding(1) var<storage, read_write> y: array<T>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let H = p[1]; let W = p[2]; let OH = p[3]; let OW = p[4];
    let KH = p[5]; let KW = p[6]; let sh = p[7]; let sw = p[8]; let dh = p[9]; let dw = p[10];
    let pt = i32(p[11]); let pl = i32(p[12]);
    let mode = p[13];
    let include_pad = p[14];
    let pb = i32(p[15]); let pr = i32(p[16]);
    let total = p[17];
    let stride = nw.x * 256u;
    for (var i = gid.x; i < total; i += stride) {
        let ow = i % OW;
        let oh = (i / OW) % OH;
        let nc = i / (OW * OH);
        let base = nc * H * W;
        var best = -3.402823e38;
        var sum = 0.0;
        var count = 0u;
        var padded = 0u;
        for (var kh = 0u; kh < KH; kh++) {
            let ih = i32(oh * sh + kh * dh) - pt;
            for (var kw = 0u; kw < KW; kw++) {
                let iw = i32(ow * sw + kw * dw) - pl;
                if (ih >= -pt && ih < i32(H) + pb && iw >= -pl && iw < i32(W) + pr) { padded++; }
                if (ih < 0 || ih >= i32(H) || iw < 0 || iw >= i32(W)) { continue; }
                let v = f32(x[base + u32(ih) * W + u32(iw)]);
                best = max(best, v);
                sum += v;
                count++;
            }
        }
        if (mode == 0u) {
            y[i] = T(best);
        } else if (include_pad == 1u) {
            y[i] = T(sum / f32(max(padded, 1u)));
        } else {
            y[i] = T(sum / f32(max(count, 1u)));
        }
    }
}
