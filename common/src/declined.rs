//! Why a rule does not handle a node: a decomposition rule that cannot
//! rewrite it exactly, or a backend's lowering that has no kernel for it.
//! The message says what (the same words QueryNetwork and the
//! decomposition report show); the variant says which kind of reason it
//! is, so a caller can tell a model that is wrong from one that is merely
//! beyond a rule.
//!
//! # Example
//!
//! ```
//! use tessera_common::declined::{unknown, Declined};
//!
//! let why = unknown("input shape is not static");
//! assert!(matches!(why, Declined::Unknown(_)));
//! assert_eq!(why.to_string(), "input shape is not static");
//! let why = why.map(|m| format!("Det not decomposed: {m}"));
//! assert_eq!(why, Declined::Unknown("Det not decomposed: input shape is not static".into()));
//! ```

/// Why a rule does not handle a node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Declined {
    /// A variant the rule has no exact rewrite or kernel for: an attribute
    /// value, an element type, a rank or size beyond its limits.
    #[error("{0}")]
    Unsupported(String),
    /// Something the rule needs is not known where it looks: a static
    /// shape, an element type, a constant value.
    #[error("{0}")]
    Unknown(String),
    /// The node contradicts itself or its op's definition: a missing
    /// input, shapes that do not match, an axis out of range.
    #[error("{0}")]
    Invalid(String),
    /// The rule covers only a variant backends lack (a 16-bit Max, a
    /// batch-first LSTM); this node is another, left as it is for the
    /// backend, which runs such nodes natively.
    #[error("{0}")]
    Native(String),
    /// The device refused what the lowering asked of it: a kernel that did
    /// not compile, a binding it did not validate.
    #[error("{0}")]
    Refused(String),
}

impl Declined {
    /// The same kind of reason with its message rewritten by `f` (to add
    /// what it is about, or a second reason).
    pub fn map(self, f: impl FnOnce(String) -> String) -> Declined {
        match self {
            Declined::Unsupported(m) => Declined::Unsupported(f(m)),
            Declined::Unknown(m) => Declined::Unknown(f(m)),
            Declined::Invalid(m) => Declined::Invalid(f(m)),
            Declined::Native(m) => Declined::Native(f(m)),
            Declined::Refused(m) => Declined::Refused(f(m)),
        }
    }
}

/// [`Declined::Unsupported`].
pub fn unsupported(why: impl Into<String>) -> Declined {
    Declined::Unsupported(why.into())
}

/// [`Declined::Unknown`].
pub fn unknown(why: impl Into<String>) -> Declined {
    Declined::Unknown(why.into())
}

/// [`Declined::Invalid`].
pub fn invalid(why: impl Into<String>) -> Declined {
    Declined::Invalid(why.into())
}

/// [`Declined::Native`].
pub fn native(why: impl Into<String>) -> Declined {
    Declined::Native(why.into())
}

/// [`Declined::Refused`].
pub fn refused(why: impl std::fmt::Display) -> Declined {
    Declined::Refused(why.to_string())
}
