//! A front door's settings: the `[serving]` table of `cluster.toml` (the
//! coordinator's front door) or of `worker.toml` (a worker's), and of
//! `tessera serve`: who may call the KServe v2 (HTTP, gRPC) and OpenAI
//! endpoints and what they may do.

use std::net::SocketAddr;
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

/// The front door's top-level keys in `cluster.toml`, `worker.toml` and
/// `tessera serve --config`, beside its `[serving]` table
/// ([`SERVING_TABLE`]).
pub const FRONT_DOOR_KEYS: [&str; 4] = [
    "http_listen",
    "grpc_listen",
    "http_max_body_bytes",
    "request_deadline_ms",
];

/// The name of the front door's table of [`SERVING_KEYS`].
pub const SERVING_TABLE: &str = "serving";

/// The largest HTTP body or gRPC message a front door takes by default.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 64 << 20;
/// A front door's request deadline by default.
pub const DEFAULT_REQUEST_DEADLINE_MS: u64 = 30_000;

/// A front door: where it listens, its limits and who may call it. The
/// same keys in the coordinator's `cluster.toml`, a worker's `worker.toml`
/// and a gateway's (`tessera serve --config`); each daemon reads it from
/// its file beside its own keys ([`FRONT_DOOR_KEYS`]).
///
/// ```toml
/// http_listen = "0.0.0.0:8000"   # KServe v2 over HTTP and OpenAI (empty: off)
/// grpc_listen = "0.0.0.0:8001"   # KServe v2 over gRPC (empty: off)
/// http_max_body_bytes = 67108864
/// request_deadline_ms = 30000
/// [serving]
/// model_control = true
/// ```
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(default)]
pub struct FrontDoorConfig {
    /// Address of the HTTP listener (KServe v2, OpenAI, Prometheus
    /// `/metrics`, the page); empty: no HTTP listener.
    pub http_listen: String,
    /// Address of the gRPC listener (KServe v2 `GRPCInferenceService`);
    /// empty: none.
    pub grpc_listen: String,
    /// Largest HTTP request body (larger: 413) and largest gRPC message
    /// (larger: OUT_OF_RANGE) accepted.
    pub http_max_body_bytes: u64,
    /// Deadline of a request whose caller gives none, ms.
    pub request_deadline_ms: u64,
    /// Who may call it and what they may do.
    pub serving: ServingConfig,
}

impl Default for FrontDoorConfig {
    fn default() -> Self {
        FrontDoorConfig {
            http_listen: String::new(),
            grpc_listen: String::new(),
            http_max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            request_deadline_ms: DEFAULT_REQUEST_DEADLINE_MS,
            serving: ServingConfig::default(),
        }
    }
}

/// Why a front door's settings cannot serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrontDoorConfigError {
    #[error(transparent)]
    ListenAddr(#[from] ListenAddrError),
    #[error("serving.tls_cert and serving.tls_key go together")]
    HalfTls,
    #[error("{0} must be positive")]
    NotPositive(&'static str),
}

impl FrontDoorConfig {
    /// The HTTP listener's address, `None` when off.
    pub fn http_addr(&self) -> Result<Option<SocketAddr>, ListenAddrError> {
        listen_addr("http_listen", &self.http_listen, 8000)
    }

    /// The gRPC listener's address, `None` when off.
    pub fn grpc_addr(&self) -> Result<Option<SocketAddr>, ListenAddrError> {
        listen_addr("grpc_listen", &self.grpc_listen, 8001)
    }

    /// The same, with the listeners command-line flags name instead of
    /// the file's.
    pub fn with_listeners(mut self, http: Option<SocketAddr>, grpc: Option<SocketAddr>) -> Self {
        if let Some(addr) = http {
            self.http_listen = addr.to_string();
        }
        if let Some(addr) = grpc {
            self.grpc_listen = addr.to_string();
        }
        self
    }

    /// The one check of its values (the files they name are the serving
    /// crate's to read): listeners are `IP:PORT`, TLS names both halves or
    /// neither, limits are positive.
    pub fn check(&self) -> Result<(), FrontDoorConfigError> {
        self.http_addr()?;
        self.grpc_addr()?;
        let serving = &self.serving;
        if serving.tls_cert.as_os_str().is_empty() != serving.tls_key.as_os_str().is_empty() {
            return Err(FrontDoorConfigError::HalfTls);
        }
        let positive = [
            ("serving.header_timeout_ms", serving.header_timeout_ms),
            ("http_max_body_bytes", self.http_max_body_bytes),
            ("request_deadline_ms", self.request_deadline_ms),
        ];
        match positive.iter().find(|(_, value)| *value == 0) {
            Some((key, _)) => Err(FrontDoorConfigError::NotPositive(key)),
            None => Ok(()),
        }
    }
}

/// A listener key that is not `IP:PORT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} '{text}': {source} (expected IP:PORT, e.g. 127.0.0.1:{example})")]
pub struct ListenAddrError {
    pub key: &'static str,
    pub text: String,
    /// A port the example shows.
    pub example: u16,
    pub source: std::net::AddrParseError,
}

/// `IP:PORT` of a listener key, `None` when empty.
fn listen_addr(
    key: &'static str,
    text: &str,
    example: u16,
) -> Result<Option<SocketAddr>, ListenAddrError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|source| ListenAddrError {
        key,
        text: text.to_string(),
        example,
        source,
    })
}

/// The top-level keys of a configuration file that none of `known` (each
/// a list of the keys one part of it reads) names, sorted: a daemon's file
/// is read in parts (its own keys, the front door's), so no one part can
/// refuse what it does not know.
pub fn unknown_keys<'a>(
    present: impl IntoIterator<Item = &'a str>,
    known: &[&[&str]],
) -> Vec<String> {
    let mut unknown: Vec<String> = present
        .into_iter()
        .filter(|key| !known.iter().any(|keys| keys.contains(key)))
        .map(str::to_string)
        .collect();
    unknown.sort();
    unknown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_front_door_checks_its_listeners_tls_and_limits() {
        let door = FrontDoorConfig::default();
        assert_eq!(door.check(), Ok(()));
        let bad = FrontDoorConfig {
            http_listen: "localhost:80".into(),
            ..FrontDoorConfig::default()
        };
        let e = bad.check().unwrap_err().to_string();
        assert!(e.starts_with("http_listen 'localhost:80'"), "{e}");
        let mut half = FrontDoorConfig::default();
        half.serving.tls_cert = "cert.pem".into();
        assert_eq!(half.check(), Err(FrontDoorConfigError::HalfTls));
        let zero = FrontDoorConfig {
            request_deadline_ms: 0,
            ..FrontDoorConfig::default()
        };
        assert_eq!(
            zero.check().unwrap_err().to_string(),
            "request_deadline_ms must be positive"
        );
    }

    #[test]
    fn flags_name_listeners_over_the_file() {
        let file = FrontDoorConfig {
            http_listen: "127.0.0.1:8000".into(),
            grpc_listen: "127.0.0.1:8001".into(),
            ..FrontDoorConfig::default()
        };
        let door = file.with_listeners(Some(([0, 0, 0, 0], 9000).into()), None);
        assert_eq!(door.http_addr().unwrap(), Some(([0, 0, 0, 0], 9000).into()));
        assert_eq!(
            door.grpc_addr().unwrap(),
            Some(([127, 0, 0, 1], 8001).into())
        );
    }

    #[test]
    fn keys_no_part_knows_are_named() {
        let own = ["name", "listen"];
        let present = ["listen", "http_listen", "serving", "htp_listen", "a"];
        assert_eq!(
            unknown_keys(present, &[&own, &FRONT_DOOR_KEYS, &[SERVING_TABLE]]),
            ["a", "htp_listen"]
        );
    }
}
