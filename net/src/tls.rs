//! rustls and quinn configurations: TLS 1.3 on aws-lc-rs, mutual
//! authentication against the cluster CA, ALPN `tessera/1`.

use std::sync::Arc;
use std::time::Duration;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;

use crate::certs::NodeIdentity;
use crate::NetError;

/// The ALPN protocol every Tessera connection negotiates.
pub const ALPN: &[u8] = b"tessera/1";

fn tls(e: impl std::fmt::Display) -> NetError {
    NetError::Tls(e.to_string())
}

/// aws-lc-rs, TLS 1.3 suites only, AES-128-GCM first: the data plane
/// encrypts every tensor byte, and AES-128 is the fastest of the three
/// with AES-NI while as strong as the cluster needs.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::aws_lc_rs::cipher_suite;
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.cipher_suites = vec![
        cipher_suite::TLS13_AES_128_GCM_SHA256,
        cipher_suite::TLS13_AES_256_GCM_SHA384,
        cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
    ];
    Arc::new(provider)
}

fn certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>, NetError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| NetError::Certificate(format!("bad PEM certificate: {e}")))?;
    if certs.is_empty() {
        return Err(NetError::Certificate(
            "no certificate in the PEM data".into(),
        ));
    }
    Ok(certs)
}

fn private_key(pem: &str) -> Result<PrivateKeyDer<'static>, NetError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| NetError::Certificate(format!("bad PEM private key: {e}")))
}

fn roots(ca_pem: &str) -> Result<Arc<RootCertStore>, NetError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(ca_pem)? {
        roots
            .add(cert)
            .map_err(|e| NetError::Certificate(format!("bad CA certificate: {e}")))?;
    }
    Ok(Arc::new(roots))
}

/// The largest UDP payload MTU discovery may reach.
pub const MAX_UDP_PAYLOAD: u16 = 6000;

/// Timeouts, keep-alives and MTU discovery shared by both ends.
fn transport() -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(Duration::from_secs(1)));
    // A dead peer is noticed within 5 s (idle timeout).
    if let Ok(idle) = quinn::IdleTimeout::try_from(Duration::from_secs(5)) {
        t.max_idle_timeout(Some(idle));
    }
    t.max_concurrent_bidi_streams(1024u32.into());
    t.max_concurrent_uni_streams(1024u32.into());
    // Larger datagrams where the path allows (loopback, jumbo frames):
    // MTU discovery up to 6000 bytes. Not above: with GSO quinn sends up to
    // ten packets at once and more than 64 KB vanishes (findings.md).
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(MAX_UDP_PAYLOAD);
    t.mtu_discovery_config(Some(mtu));
    // Ten datagrams in the first flight (IW10), at the size discovery
    // reaches: quinn's default 14,720 bytes holds two 6000-byte datagrams,
    // and a fresh link then stalled ~25 ms on its first 32 KB tensor.
    let mut cc = quinn::congestion::CubicConfig::default();
    cc.initial_window(10 * u64::from(MAX_UDP_PAYLOAD));
    t.congestion_controller_factory(Arc::new(cc));
    Arc::new(t)
}

/// The server side: a certificate from the cluster CA is required of every
/// client.
pub fn server_config(id: &NodeIdentity) -> Result<quinn::ServerConfig, NetError> {
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots(&id.ca_pem)?, provider())
            .build()
            .map_err(tls)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certificates(&id.cert_pem)?, private_key(&id.key_pem)?)
        .map_err(tls)?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = QuicServerConfig::try_from(config).map_err(tls)?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    server.transport_config(transport());
    Ok(server)
}

/// The client side: the server must show a certificate from the cluster CA
/// (for [`crate::certs::CLUSTER_SAN`]); ours is shown in turn.
pub fn client_config(id: &NodeIdentity) -> Result<quinn::ClientConfig, NetError> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .with_root_certificates(roots(&id.ca_pem)?)
        .with_client_auth_cert(certificates(&id.cert_pem)?, private_key(&id.key_pem)?)
        .map_err(tls)?;
    finish_client(config)
}

/// A client that shows no certificate: every Tessera node refuses it. For
/// tests and diagnostics.
pub fn client_config_without_certificate(ca_pem: &str) -> Result<quinn::ClientConfig, NetError> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .with_root_certificates(roots(ca_pem)?)
        .with_no_client_auth();
    finish_client(config)
}

fn finish_client(mut config: rustls::ClientConfig) -> Result<quinn::ClientConfig, NetError> {
    config.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = QuicClientConfig::try_from(config).map_err(tls)?;
    let mut client = quinn::ClientConfig::new(Arc::new(crypto));
    client.transport_config(transport());
    Ok(client)
}
