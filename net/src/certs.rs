//! The cluster's certificates: a CA per cluster, and a certificate per node
//! signed by it (`tessera certs init`). Every certificate names its node
//! (common name) and its role (organizational unit: coordinator, worker or
//! client) and carries [`CLUSTER_SAN`], the name peers verify servers by,
//! so any node can dial any other by address. TLS proves membership of the
//! cluster (signed by its CA); the handshake then checks that the node name
//! and role a peer claims are the ones its certificate proves
//! ([`peer_identity`]), so one node's certificate cannot pass for another.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use tessera_common::wire::handshake::{CertIdentity, Role};

use crate::NetError;

/// The DNS name in every node certificate; TLS clients verify servers
/// against it.
pub const CLUSTER_SAN: &str = "tessera.cluster";

/// Names every coordinator certificate also carries, so HTTPS and gRPC
/// clients on the coordinator's host can verify it by the name they dial.
pub const LOCAL_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

fn cert_error(e: rcgen::Error) -> NetError {
    NetError::Certificate(e.to_string())
}

/// A cluster CA: its certificate and signing key, PEM.
pub struct ClusterCa {
    pub cert_pem: String,
    key: KeyPair,
    cert: rcgen::Certificate,
}

/// A node's certificate (signed by the cluster CA) and key, PEM, with the
/// CA certificate it trusts.
#[derive(Clone)]
pub struct NodeIdentity {
    pub name: String,
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
}

impl std::fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("NodeIdentity")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ClusterCa {
    /// A new CA for `cluster`.
    pub fn generate(cluster: &str) -> Result<ClusterCa, NetError> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(cert_error)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("Tessera cluster CA: {cluster}"));
        dn.push(DnType::OrganizationName, cluster);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().map_err(cert_error)?;
        let cert = params.self_signed(&key).map_err(cert_error)?;
        Ok(ClusterCa {
            cert_pem: cert.pem(),
            key,
            cert,
        })
    }

    /// The CA from its PEM certificate and key (as `certs init` wrote them).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<ClusterCa, NetError> {
        let key = KeyPair::from_pem(key_pem).map_err(cert_error)?;
        let params = CertificateParams::from_ca_cert_pem(cert_pem).map_err(cert_error)?;
        // Re-signing the same subject and key gives an issuer equivalent to
        // the stored certificate for signing.
        let cert = params.self_signed(&key).map_err(cert_error)?;
        Ok(ClusterCa {
            cert_pem: cert_pem.to_string(),
            key,
            cert,
        })
    }

    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A certificate for node `name` in `role`, valid as TLS server and
    /// client. The name is the subject's common name (and a DNS name); the
    /// role its organizational unit: what peers check a hello against.
    pub fn issue(&self, name: &str, role: Role) -> Result<NodeIdentity, NetError> {
        self.issue_for_hosts(name, role, &[])
    }

    /// [`ClusterCa::issue`], and the certificate also names `hosts` (DNS
    /// names or IP addresses): the names HTTPS and gRPC clients reach the
    /// coordinator by. A coordinator's certificate always names
    /// [`LOCAL_HOSTS`] too.
    pub fn issue_for_hosts(
        &self,
        name: &str,
        role: Role,
        hosts: &[&str],
    ) -> Result<NodeIdentity, NetError> {
        if name.is_empty() || name.len() > 64 || !name.chars().all(valid_name_char) {
            return Err(NetError::Certificate(format!(
                "node name '{name}' must be 1–64 characters of A-Z a-z 0-9 . _ -"
            )));
        }
        let mut names = vec![CLUSTER_SAN.to_string(), name.to_string()];
        if role == Role::Coordinator {
            names.extend(LOCAL_HOSTS.iter().map(|h| h.to_string()));
            names.extend(hosts.iter().map(|h| h.to_string()));
        }
        let mut seen = std::collections::HashSet::new();
        names.retain(|n| seen.insert(n.clone()));
        // IP addresses become IP SANs, the rest DNS names.
        let mut params = CertificateParams::new(names).map_err(cert_error)?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        dn.push(DnType::OrganizationalUnitName, role.to_string());
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(cert_error)?;
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .map_err(cert_error)?;
        Ok(NodeIdentity {
            name: name.to_string(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_pem: self.cert_pem.clone(),
        })
    }
}

fn valid_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// A node of `tessera certs init --nodes`: `NAME` or `NAME:ROLE`. Without
/// a role, `coordinator` is the coordinator, names starting with `client`
/// are clients, and every other name is a worker.
pub fn parse_node(spec: &str) -> Result<(String, Role), NetError> {
    let (name, role) = match spec.split_once(':') {
        Some((name, role)) => {
            let role = Role::parse(role).ok_or_else(|| {
                NetError::Certificate(format!(
                    "'{spec}': the role must be coordinator, worker or client"
                ))
            })?;
            (name, role)
        }
        None if spec == "coordinator" => (spec, Role::Coordinator),
        None if spec.starts_with("client") => (spec, Role::Client),
        None => (spec, Role::Worker),
    };
    Ok((name.to_string(), role))
}

/// Throw-away certificates for an embedded cluster: a fresh CA (never
/// written anywhere) and one identity per node (`NAME[:ROLE]`, see
/// [`parse_node`]).
pub fn ephemeral(cluster: &str, nodes: &[&str]) -> Result<Vec<NodeIdentity>, NetError> {
    let ca = ClusterCa::generate(cluster)?;
    nodes
        .iter()
        .map(|spec| {
            let (name, role) = parse_node(spec)?;
            ca.issue(&name, role)
        })
        .collect()
}

/// The role a PEM certificate file names (`None`: unreadable, or made
/// without a role by an older `tessera certs init`).
pub fn role_of_file(path: &Path) -> Option<Role> {
    let pem = std::fs::read(path).ok()?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    let role = cert
        .subject()
        .iter_organizational_unit()
        .filter_map(|ou| ou.as_str().ok())
        .find_map(Role::parse);
    role
}

/// The node name and role a peer's certificate proves (the connection's
/// TLS handshake has checked it against the cluster CA).
pub fn peer_identity(connection: &quinn::Connection) -> Result<CertIdentity, NetError> {
    let bad = |why: &str| NetError::Certificate(format!("the peer's certificate: {why}"));
    let chain = connection
        .peer_identity()
        .and_then(|any| {
            any.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
                .ok()
        })
        .ok_or_else(|| bad("none was shown"))?;
    let der = chain.first().ok_or_else(|| bad("an empty chain"))?;
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| bad(&e.to_string()))?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .ok_or_else(|| bad("no common name"))?
        .to_string();
    let role = subject
        .iter_organizational_unit()
        .filter_map(|ou| ou.as_str().ok())
        .find_map(Role::parse);
    Ok(CertIdentity { name, role })
}

fn write(path: &Path, contents: &str, secret: bool) -> Result<(), NetError> {
    std::fs::write(path, contents).map_err(|e| NetError::Io {
        what: format!("write {}", path.display()),
        source: e,
    })?;
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| {
            NetError::Io {
                what: format!("chmod {}", path.display()),
                source: e,
            }
        })?;
    }
    #[cfg(not(unix))]
    let _ = secret;
    Ok(())
}

fn read(path: &Path) -> Result<String, NetError> {
    std::fs::read_to_string(path).map_err(|e| NetError::Io {
        what: format!("read {}", path.display()),
        source: e,
    })
}

/// `tessera certs init`: writes `ca.pem` and `ca.key` (reusing them if
/// `dir` already has them) and `<node>.pem` / `<node>.key` for each node;
/// the coordinator's also names `hosts` (see
/// [`ClusterCa::issue_for_hosts`]). Returns the files written.
pub fn init_dir(
    dir: &Path,
    cluster: &str,
    nodes: &[&str],
    hosts: &[&str],
) -> Result<Vec<PathBuf>, NetError> {
    init_dir_with_ca(dir, None, cluster, nodes, hosts)
}

/// As [`init_dir`], with the CA taken from `ca_dir` (its `ca.pem` and
/// `ca.key`) when given: only `ca.pem` is copied into `dir`, so the key
/// stays where it was (a Kubernetes init container signs its pod's
/// certificate from a Secret this way). A `dir` that holds another CA's
/// `ca.pem` is an error.
pub fn init_dir_with_ca(
    dir: &Path,
    ca_dir: Option<&Path>,
    cluster: &str,
    nodes: &[&str],
    hosts: &[&str],
) -> Result<Vec<PathBuf>, NetError> {
    std::fs::create_dir_all(dir).map_err(|e| NetError::Io {
        what: format!("create {}", dir.display()),
        source: e,
    })?;
    let (ca_cert, ca_key) = (dir.join("ca.pem"), dir.join("ca.key"));
    let mut written = Vec::new();
    let ca = match ca_dir {
        Some(from) => {
            let cert_pem = read(&from.join("ca.pem"))?;
            let ca = ClusterCa::from_pem(&cert_pem, &read(&from.join("ca.key"))?)?;
            if !ca_cert.exists() {
                write(&ca_cert, &cert_pem, false)?;
                written.push(ca_cert);
            } else if read(&ca_cert)?.trim() != cert_pem.trim() {
                return Err(NetError::Certificate(format!(
                    "{} is another CA's than {}",
                    ca_cert.display(),
                    from.join("ca.pem").display()
                )));
            }
            ca
        }
        None if ca_cert.exists() && ca_key.exists() => {
            ClusterCa::from_pem(&read(&ca_cert)?, &read(&ca_key)?)?
        }
        None => {
            let ca = ClusterCa::generate(cluster)?;
            write(&ca_cert, &ca.cert_pem, false)?;
            write(&ca_key, &ca.key_pem(), true)?;
            written.extend([ca_cert, ca_key]);
            ca
        }
    };
    for spec in nodes {
        let (node, role) = parse_node(spec)?;
        let id = ca.issue_for_hosts(&node, role, hosts)?;
        let (cert, key) = (
            dir.join(format!("{node}.pem")),
            dir.join(format!("{node}.key")),
        );
        write(&cert, &id.cert_pem, false)?;
        write(&key, &id.key_pem, true)?;
        written.extend([cert, key]);
    }
    Ok(written)
}

/// A node's identity from `<dir>/<name>.pem`, `<dir>/<name>.key` and
/// `<dir>/ca.pem`.
pub fn load_identity(dir: &Path, name: &str) -> Result<NodeIdentity, NetError> {
    Ok(NodeIdentity {
        name: name.to_string(),
        cert_pem: read(&dir.join(format!("{name}.pem")))?,
        key_pem: read(&dir.join(format!("{name}.key")))?,
        ca_pem: read(&dir.join("ca.pem"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The DNS names and IP addresses a PEM certificate names.
    fn names(pem: &str) -> Vec<String> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let cert = pem.parse_x509().unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        san.value
            .general_names
            .iter()
            .map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(d) => d.to_string(),
                x509_parser::extensions::GeneralName::IPAddress(ip) => match ip.len() {
                    4 => std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*ip).unwrap()).to_string(),
                    _ => std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*ip).unwrap()).to_string(),
                },
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_coordinator_certificate_names_the_local_host_and_the_hosts_given() {
        let ca = ClusterCa::generate("lab").unwrap();
        let id = ca
            .issue_for_hosts(
                "coordinator",
                Role::Coordinator,
                &["infer.example.com", "10.0.0.7", "localhost"],
            )
            .unwrap();
        assert_eq!(
            names(&id.cert_pem),
            [
                "tessera.cluster",
                "coordinator",
                "localhost",
                "127.0.0.1",
                "::1",
                "infer.example.com",
                "10.0.0.7"
            ]
        );
        // Workers and clients are dialled by the cluster name only.
        let worker = ca
            .issue_for_hosts("node-a", Role::Worker, &["x.example"])
            .unwrap();
        assert_eq!(names(&worker.cert_pem), ["tessera.cluster", "node-a"]);
    }
}
