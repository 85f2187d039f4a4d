//! A front door's settings: the `[serving]` table of `cluster.toml` (the
//! coordinator's front door) or of `worker.toml` (a worker's), and of
//! `tessera serve`: who may call the KServe v2 (HTTP, gRPC) and OpenAI
//! endpoints and what they may do.

use std::path::PathBuf;

use serde::Deserialize;

/// The keys of the `[serving]` table (environment: `TESSERA_SERVING_<KEY>`).
pub const SERVING_KEYS: [&str; 7] = [
    "model_control",
    "model_repository",
    "tls",
    "tls_cert",
    "tls_key",
    "tokens_file",
    "header_timeout_ms",
];

/// How the HTTP and gRPC listeners let callers in: `[serving]`.
///
/// ```toml
/// [serving]
/// model_control = true          # load/unload over HTTP and gRPC (default: 403)
/// model_repository = "models"   # loads by name: models/NAME.onnx or models/NAME/model.onnx
/// tls = true                    # HTTPS and gRPC over TLS (the coordinator's cluster certificate)
/// tokens_file = "tokens.txt"    # Authorization: Bearer TOKEN on every endpoint but liveness
/// ```
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServingConfig {
    /// Whether HTTP and gRPC callers may load and unload models (the
    /// cluster's own clients, over QUIC with their certificates, always
    /// may).
    pub model_control: bool,
    /// The folder HTTP and gRPC loads are confined to (empty: only the
    /// `[models.NAME]` tables can be loaded).
    pub model_repository: PathBuf,
    /// Serve HTTPS (and gRPC over TLS) instead of plain HTTP.
    pub tls: bool,
    /// A PEM certificate chain of the user's for TLS (empty: the
    /// coordinator's cluster certificate, `<certs>/<name>.pem`).
    pub tls_cert: PathBuf,
    /// The PEM private key of `tls_cert`.
    pub tls_key: PathBuf,
    /// One bearer token per line (`#` comments); when set, every endpoint
    /// but liveness wants `Authorization: Bearer TOKEN`. Re-read when the
    /// file changes and on SIGHUP.
    pub tokens_file: PathBuf,
    /// A connection that has not sent a whole request head (or finished
    /// its TLS handshake) this long after it opened or after its last
    /// request is closed (slow-loris clients).
    pub header_timeout_ms: u64,
}

/// How long a connection may take to send a request head by default.
pub const DEFAULT_HEADER_TIMEOUT_MS: u64 = 10_000;

impl Default for ServingConfig {
    fn default() -> Self {
        ServingConfig {
            model_control: false,
            model_repository: PathBuf::new(),
            tls: false,
            tls_cert: PathBuf::new(),
            tls_key: PathBuf::new(),
            tokens_file: PathBuf::new(),
            header_timeout_ms: DEFAULT_HEADER_TIMEOUT_MS,
        }
    }
}
