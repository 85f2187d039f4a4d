// Elementwise binary op with numpy broadcasting.
// p: [n, rank, op, out_dims[6], a_strides[6], b_strides[6]]
// T: how tensors are stored (f16 in the half variant); math is f32.
alias T = f32;

@group(0) @binding(0) var<storage, read> a: array<T>;
@group(0) @binding(1) var<storage, read> b: array<T>;
@group(0) @binding(2) var<storage, read_write> y: array<T>;
@group(0) @binding(3) var<storage, read> p: array<u32>;

fn apply(op: u32, x: f32, z: f32) -> f32 {
    switch op {
        case 0u: { return x + z; }  // Add
        case 1u: { return x - z; }  // Sub
        case 2u: { return x * z; }  // Mul
        case 3u: { return x / z; }  // Div
        case 4u: {                  // Pow
            // ONNX Pow: a negative base with an integral exponent is defined.
            if (x < 0.0 && z == round(z)) {
                let r = pow(-x, z);
                if (u32(abs(z)) % 2u == 1u) { return -r; }
                return r;
            }
            if (x == 0.0 && z == 0.0) { return 1.0; }
            return pow(x, z);
        }
        case 5u: { return max(x, z); }  // Max
        case 6u: { return min(x, z); }  // Min
        // Unreachable: codes come from `BinaryOp` (ops/codes.rs); NaN if not.
        default: { return sqrt(-1.0 - abs(x)); }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let n = p[0];
    let rank = p[1];
    let op = p[2];
    let stride = nw.x * 256u;
    for (var i = gid.x; i < n; i += stride) {
        var rest = i;
        var ia = 0u;
        var ib = 0u;
        for (var d = 0u; d < rank; d++) {
            let axis = rank - 1u - d;
            let dim = p[3u + axis];
            let c = rest % dim;
            rest = rest / dim;
            ia += c * p[9u + axis];
            ib += c * p[15u + axis];
        }
        y[i] = T(apply(op, f32(a[ia]), f32(b[ib])));
    }
}
