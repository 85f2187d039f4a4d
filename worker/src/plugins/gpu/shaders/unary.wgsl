// Elementwise unary ops. p: [n, op, alpha (f32 bits), beta (f32 bits)]
// T: how tensors are stored (f16 in the half variant); math is f32.
alias T = f32;

@group(0) @binding(0) var<storage, read> x: array<T>;
@group(0) @binding(1) var<storage, read_write> y: array<T>;
@group(0) @binding(2) var<storage, read> p: array<u32>;

// Abramowitz and Stegun 7.1.26 (|error| < 1.5e-7).
fn erf_(v: f32) -> f32 {
    let s = sign(v);
    let a = abs(v);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t;
    return s * (1.0 - poly * exp(-a * a));
}

fn sigmoid_(v: f32) -> f32 {
    if (v >= 0.0) { return 1.0 / (1.0 + exp(-v)); }
    let e = exp(v);
    return e / (1.0 + e);
}

fn apply(op: u32, v: f32, alpha: f32, beta: f32) -> f32 {
    switch op {
        case 0u: { return max(v, 0.0); }                         // Relu
        case 1u: { return select(alpha * v, v, v >= 0.0); }     // LeakyRelu
        case 2u: { return sigmoid_(v); }                         // Sigmoid
        case 3u: {                                               // Tanh
            if (abs(v) > 10.0) { return sign(v); }
            let e = exp(2.0 * v);
            return (e - 1.0) / (e + 1.0);
        }
        case 4u: { return clamp(alpha * v + beta, 0.0, 1.0); }   // HardSigmoid
        case 5u: { return v * clamp(v / 6.0 + 0.5, 0.0, 1.0); }  // HardSwish
        case 6u: { return min(max(v, alpha), beta); }            // Clip
        case 7u: { return erf_(v); }                             // Erf
        case 8u: { return 0.5 * v * (1.0 + erf_(v * 0.70710678118654752)); } // Gelu
        case 9u: {                                               // GeluTanh (Gelu, tanh approximation)
            let u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
            var t = sign(u);
            if (abs(u) <= 10.0) { let e = exp(2.0 * u); t = (e - 1.0) / (e + 1.0); }
            return 0.5 * v * (1.0 + t);
        }
        case 10u: { return exp(v); }                            // Exp
        case 11u: { return -v; }                                // Neg
        case 12u: { return abs(v); }                            // Abs
        case 13u: { return sqrt(v); }                           // Sqrt
        case 14u: { return v; }                                  // Identity
        case 15u: { return 1.0 / v; }                            // Reciprocal
        case 16u: { return select(alpha * (exp(v) - 1.0), v, v >= 0.0); } // Elu
        case 17u: { return log(v); }                            // Log
        case 18u: { return floor(v); }                          // Floor
        case 19u: { return ceil(v); }                           // Ceil
        // Unreachable: codes come from `UnaryOp` (ops/codes.rs). NaN (not a
        // silent identity) if one ever is not.
        default: { return sqrt(-1.0 - abs(v)); }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let n = p[0];
    let op = p[1];
    let alpha = bitcast<f32>(p[2]);
    let beta = bitcast<f32>(p[3]);
    let stride = nw.x * 256u;
    for (var i = gid.x; i < n; i += stride) {
        y[i] = T(apply(op, f32(x[i]), alpha, beta));
    }
}
