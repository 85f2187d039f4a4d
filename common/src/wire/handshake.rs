//! The handshake: the first frame each way on every connection, after TLS
//! has authenticated the peer's certificate. The dialer says [`Hello`]; the
//! listener answers [`Handshake::Welcome`] or [`Handshake::Refused`] and
//! closes.

use serde::{Deserialize, Serialize};

use super::frame::{FrameKind, Limits};
use super::{codec, WireError, PROTOCOL_VERSION};

/// What a node is in the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    Coordinator,
    Worker,
    Client,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Coordinator => "coordinator",
            Role::Worker => "worker",
            Role::Client => "client",
        })
    }
}

impl Role {
    /// The role named `name` (`coordinator`, `worker`, `client`).
    pub fn parse(name: &str) -> Option<Role> {
        match name {
            "coordinator" => Some(Role::Coordinator),
            "worker" => Some(Role::Worker),
            "client" => Some(Role::Client),
            _ => None,
        }
    }
}

/// What a peer's certificate proves: the node name and role the cluster CA
/// signed (`None`: a certificate made without a role).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertIdentity {
    pub name: String,
    pub role: Option<Role>,
}

/// Who is speaking.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u16,
    pub cluster: String,
    /// The node's name (a worker's `--name`, `coordinator`, a client id).
    pub node: String,
    pub role: Role,
    /// The software version, for logs.
    pub software: String,
    /// On a same-host connection: the shared-memory region this node
    /// writes the payloads it sends into, for the peer to attach
    /// (`tessera-net`'s `shared`); `None` elsewhere.
    pub shared_memory: Option<String>,
}

impl Hello {
    /// A hello in this build's protocol version.
    pub fn new(cluster: &str, node: &str, role: Role) -> Hello {
        Hello {
            protocol: PROTOCOL_VERSION,
            cluster: cluster.into(),
            node: node.into(),
            role,
            software: env!("CARGO_PKG_VERSION").into(),
            shared_memory: None,
        }
    }
}

/// Handshake frames.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Handshake {
    Hello(Hello),
    /// Accepted; the listener's own hello.
    Welcome(Hello),
    /// Refused, and why; the connection closes.
    Refused(String),
}

impl Handshake {
    /// The whole frame.
    pub fn encode(&self, limits: &Limits) -> Result<Vec<u8>, WireError> {
        codec::encode_frame(FrameKind::Handshake, self, 0, limits)
    }
}

/// Why a hello was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error("{node} speaks protocol version {theirs}; this node speaks {ours}")]
    Version {
        node: String,
        ours: u16,
        theirs: u16,
    },
    #[error("{node} belongs to cluster '{theirs}', not '{ours}'")]
    Cluster {
        node: String,
        ours: String,
        theirs: String,
    },
    #[error("a {role} ({node}) may not connect here; expected {expected}")]
    Role {
        node: String,
        role: Role,
        expected: String,
    },
    #[error("a peer claiming to be the {role} '{node}' shows the certificate of {cert}")]
    Identity {
        node: String,
        role: Role,
        /// What the certificate says, e.g. `the client 'client'`.
        cert: String,
    },
    #[error("the certificate of '{0}' names no role (made by an older `tessera certs init`): issue it again")]
    NoRole(String),
}

/// Checks that a hello claims what the peer's certificate proves: the same
/// node name and role. A certificate of the cluster cannot pass for
/// another node (a client's for a worker, one worker's for another).
pub fn check_identity(hello: &Hello, cert: &CertIdentity) -> Result<(), HandshakeError> {
    let role = cert
        .role
        .ok_or_else(|| HandshakeError::NoRole(cert.name.clone()))?;
    if cert.name != hello.node || role != hello.role {
        return Err(HandshakeError::Identity {
            node: hello.node.clone(),
            role: hello.role,
            cert: format!("the {role} '{}'", cert.name),
        });
    }
    Ok(())
}

/// Checks a peer's hello: same protocol version, same cluster, a role this
/// listener accepts.
pub fn check(hello: &Hello, cluster: &str, accepted: &[Role]) -> Result<(), HandshakeError> {
    if hello.protocol != PROTOCOL_VERSION {
        return Err(HandshakeError::Version {
            node: hello.node.clone(),
            ours: PROTOCOL_VERSION,
            theirs: hello.protocol,
        });
    }
    if hello.cluster != cluster {
        return Err(HandshakeError::Cluster {
            node: hello.node.clone(),
            ours: cluster.into(),
            theirs: hello.cluster.clone(),
        });
    }
    if !accepted.contains(&hello.role) {
        let expected: Vec<String> = accepted.iter().map(Role::to_string).collect();
        return Err(HandshakeError::Role {
            node: hello.node.clone(),
            role: hello.role,
            expected: expected.join(" or "),
        });
    }
    Ok(())
}
