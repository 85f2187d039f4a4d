//! The op codes the elementwise shaders switch on, named once. Each
//! variant's number is its `case` in the shader and its name the comment on
//! that case; the tests below read `unary.wgsl` and `binary.wgsl` and check
//! both sides agree, case by case.

/// `unary.wgsl`'s `apply` cases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum UnaryOp {
    Relu = 0,
    LeakyRelu = 1,
    Sigmoid = 2,
    Tanh = 3,
    HardSigmoid = 4,
    HardSwish = 5,
    Clip = 6,
    Erf = 7,
    Gelu = 8,
    GeluTanh = 9,
    Exp = 10,
    Neg = 11,
    Abs = 12,
    Sqrt = 13,
    Identity = 14,
    Reciprocal = 15,
    Elu = 16,
    Log = 17,
    Floor = 18,
    Ceil = 19,
}

impl UnaryOp {
    #[cfg(test)]
    pub const ALL: &'static [UnaryOp] = &[
        UnaryOp::Relu,
        UnaryOp::LeakyRelu,
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::HardSigmoid,
        UnaryOp::HardSwish,
        UnaryOp::Clip,
        UnaryOp::Erf,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Exp,
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Sqrt,
        UnaryOp::Identity,
        UnaryOp::Reciprocal,
        UnaryOp::Elu,
        UnaryOp::Log,
        UnaryOp::Floor,
        UnaryOp::Ceil,
    ];

    /// The number the shader switches on.
    pub fn code(self) -> u32 {
        self as u32
    }
}

/// `binary.wgsl`'s `apply` cases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum BinaryOp {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Div = 3,
    Pow = 4,
    Max = 5,
    Min = 6,
}

impl BinaryOp {
    pub const ALL: &'static [BinaryOp] = &[
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Max,
        BinaryOp::Min,
    ];

    /// The op of an ONNX op type, if it is one of these.
    pub fn of(op_type: &str) -> Option<BinaryOp> {
        BinaryOp::ALL
            .iter()
            .copied()
            .find(|op| format!("{op:?}") == op_type)
    }

    /// The number the shader switches on.
    pub fn code(self) -> u32 {
        self as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(number, name)` of each `case Nu: ... // Name` line of `apply`.
    fn cases(wgsl: &str) -> Vec<(u32, String)> {
        wgsl.lines()
            .filter_map(|line| {
                let rest = line.trim().strip_prefix("case ")?;
                let (number, rest) = rest.split_once("u:")?;
                let name = rest.rsplit_once("//").map_or("", |(_, n)| n.trim());
                let name = name.split([',', ' ']).next().unwrap_or("");
                Some((number.trim().parse().ok()?, name.to_string()))
            })
            .collect()
    }

    fn check<T: std::fmt::Debug>(wgsl: &str, all: &[T], code: impl Fn(&T) -> u32) {
        let cases = cases(wgsl);
        assert_eq!(cases.len(), all.len(), "one case per op: {cases:?}");
        for op in all {
            let name = format!("{op:?}");
            let case = cases.iter().find(|(n, _)| *n == code(op));
            let Some((_, shader_name)) = case else {
                panic!("{name} (code {}) has no case in the shader", code(op));
            };
            assert_eq!(shader_name, &name, "case {} is named otherwise", code(op));
        }
    }

    #[test]
    fn unary_codes_match_the_shader() {
        check(include_str!("../shaders/unary.wgsl"), UnaryOp::ALL, |op| {
            op.code()
        });
    }

    #[test]
    fn binary_codes_match_the_shader() {
        check(
            include_str!("../shaders/binary.wgsl"),
            BinaryOp::ALL,
            |op| op.code(),
        );
    }
}
