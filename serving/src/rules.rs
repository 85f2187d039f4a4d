//! What a front door's listeners share: who may call them and what they
//! may do (`[serving]`).
//!
//! - **Model control** ([`crate::control`]): loading and unloading models
//!   over HTTP or gRPC is off unless `[serving] model_control = true`
//!   (403 / PERMISSION_DENIED); with it on, loads are confined to
//!   `model_repository` ([`crate::confine`]). The cluster's own clients
//!   (QUIC, mutual TLS) always may.
//! - **Tokens** ([`crate::tokens`]): with `tokens_file`, every endpoint
//!   but the health probes want `Authorization: Bearer TOKEN` (401 /
//!   UNAUTHENTICATED), checked by one middleware ([`crate::auth`]) in
//!   front of both listeners.
//! - **Connections** ([`crate::listener`]): plain or TLS (rustls; the
//!   process's cluster certificate or the user's), HTTP/1.1 and HTTP/2 on
//!   one port, with a deadline for a request's head and a bound on open
//!   connections.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera_common::serving::ServingConfig;
use tessera_common::wire::control::ModelState;
use tessera_net::certs::NodeIdentity;

use crate::confine::ModelRepository;
use crate::tokens::Tokens;
use crate::Door;

/// Why the listeners could not be set up at start.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("[serving] tokens_file {}: {reason}", path.display())]
    TokensFile { path: PathBuf, reason: String },
    #[error("[serving] model_repository {}: {reason}", path.display())]
    Repository { path: PathBuf, reason: String },
    #[error("[serving] TLS certificate {}: {reason}", path.display())]
    Certificate { path: PathBuf, reason: String },
    #[error("the {what} listener cannot listen on {addr}: {source}")]
    Listen {
        what: &'static str,
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// The listeners' settings, checked and loaded at start.
pub struct Rules {
    pub model_control: bool,
    pub repository: Option<ModelRepository>,
    pub tokens: Option<Arc<Tokens>>,
    /// TLS for both listeners, when `tls = true`.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    pub header_timeout: std::time::Duration,
}

impl Rules {
    /// The files `[serving]` names, as `--check-config` checks them for
    /// every daemon: the model repository is a folder, the tokens file
    /// reads and holds a token (an empty one would refuse every request).
    /// The listeners check the same again when they start.
    pub fn check_files(s: &ServingConfig) -> Result<(), SetupError> {
        if !s.model_repository.as_os_str().is_empty() {
            ModelRepository::open(&s.model_repository)?;
        }
        if !s.tokens_file.as_os_str().is_empty() && Tokens::load(&s.tokens_file)?.count() == 0 {
            return Err(SetupError::TokensFile {
                path: s.tokens_file.clone(),
                reason: "it holds no token".into(),
            });
        }
        Ok(())
    }

    /// `[serving]` checked: the repository folder exists, the tokens file
    /// reads, the certificate and key load (`identity`, the process's
    /// cluster certificate, read from `cert_path`, unless the user's).
    pub fn from_config(
        s: &ServingConfig,
        identity: &NodeIdentity,
        cert_path: &Path,
    ) -> Result<Rules, SetupError> {
        let repository = if s.model_repository.as_os_str().is_empty() {
            None
        } else {
            Some(ModelRepository::open(&s.model_repository)?)
        };
        let tokens = if s.tokens_file.as_os_str().is_empty() {
            None
        } else {
            Some(Arc::new(Tokens::load(&s.tokens_file)?))
        };
        let tls = if s.tls {
            Some(tls_acceptor(s, identity, cert_path)?)
        } else {
            None
        };
        Ok(Rules {
            model_control: s.model_control,
            repository,
            tokens,
            tls,
            header_timeout: std::time::Duration::from_millis(s.header_timeout_ms),
        })
    }

    /// `https` or `http`: what the listeners speak.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }
}

/// The TLS server side: the user's `tls_cert`/`tls_key`, else the
/// process's cluster certificate (which names `localhost`, the loopback
/// addresses and the hosts given to `tessera certs init --hosts`).
fn tls_acceptor(
    s: &ServingConfig,
    identity: &NodeIdentity,
    own_cert: &Path,
) -> Result<tokio_rustls::TlsAcceptor, SetupError> {
    let (cert_path, cert, key) = if s.tls_cert.as_os_str().is_empty() {
        let path = own_cert.to_path_buf();
        (path, identity.cert_pem.clone(), identity.key_pem.clone())
    } else {
        let (cert, key) = (read(&s.tls_cert)?, read(&s.tls_key)?);
        (s.tls_cert.clone(), cert, key)
    };
    let server =
        tessera_net::tls::web_server_config(&cert, &key).map_err(|e| SetupError::Certificate {
            path: cert_path,
            reason: e.to_string(),
        })?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(server)))
}

fn read(path: &Path) -> Result<String, SetupError> {
    std::fs::read_to_string(path).map_err(|e| SetupError::Certificate {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Reads the tokens file again on every SIGHUP, until the front door
/// shuts down (with a tokens file only: otherwise SIGHUP keeps its
/// default meaning).
pub async fn reload_tokens_on_sighup(door: Arc<Door>) {
    let Some(tokens) = door.rules.tokens.clone() else {
        return;
    };
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => return tracing::warn!("SIGHUP cannot reload the tokens: {e}"),
    };
    loop {
        tokio::select! {
            got = hangups.recv() => {
                if got.is_none() {
                    return;
                }
                tracing::info!("SIGHUP: reading the tokens file again");
                tokens.reload();
            }
            () = door.closed() => return,
        }
    }
}

/// Why the server is not ready.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    #[error("no worker is registered")]
    NoWorker,
    /// The cluster was never seen: the coordinator does not answer.
    #[error("the cluster's state is not known yet: {0}")]
    NoCoordinator(String),
    /// Models wanted but not deployed yet, each with its state.
    #[error("models not deployed yet: {}", waiting_list(.0))]
    Deploying(Vec<(String, ModelState)>),
}

fn waiting_list(models: &[(String, ModelState)]) -> String {
    let named: Vec<String> = models
        .iter()
        .map(|(name, state)| format!("{name} ({})", state.as_str().to_lowercase()))
        .collect();
    named.join(", ")
}

/// Logs one warning at start when listeners (`(what, address)`) are open
/// to other hosts without tokens.
pub fn warn_if_open(listeners: &[(&str, std::net::SocketAddr)], serving: &Rules) {
    if serving.tokens.is_some() {
        return;
    }
    let open: Vec<String> = listeners
        .iter()
        .filter(|(_, addr)| !addr.ip().is_loopback())
        .map(|(what, addr)| format!("{what} on {addr}"))
        .collect();
    if !open.is_empty() {
        tracing::warn!(
            "{} accept{} requests from other hosts without a token: anyone who reaches them can run the models{}; set [serving] tokens_file (and tls = true) to require a token",
            open.join(" and "),
            if open.len() == 1 { "s" } else { "" },
            if serving.model_control { " and load or unload them" } else { "" }
        );
    }
}
