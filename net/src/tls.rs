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

fn tls(e: impl std::error::Error + Send + Sync + 'static) -> NetError {
    NetError::Tls(Box::new(e))
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

/// What kind of path a connection runs over; it picks the datagram
/// sizes (see [`Path::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// A network interface: MTU discovery up to [`MAX_UDP_PAYLOAD`], with
    /// segmentation offload (GSO) batching ten datagrams per send.
    Network,
    /// The loopback interface (peers on the same machine): datagrams up
    /// to [`LOOPBACK_UDP_PAYLOAD`] and no GSO.
    Loopback,
}

impl Path {
    /// The path to a peer at `addr`: loopback addresses (IPv4-mapped
    /// ones too) are [`Path::Loopback`].
    pub fn of(addr: std::net::SocketAddr) -> Path {
        if addr.ip().to_canonical().is_loopback() {
            Path::Loopback
        } else {
            Path::Network
        }
    }

    /// The largest UDP payload MTU discovery may reach on this path.
    pub fn max_udp_payload(self) -> u16 {
        match self {
            Path::Network => MAX_UDP_PAYLOAD,
            Path::Loopback => LOOPBACK_UDP_PAYLOAD,
        }
    }
}

/// The largest UDP payload MTU discovery may reach on a network path. Not
/// above: with GSO quinn sends up to ten datagrams at once and more than
/// 64 KB vanishes (quinn issues #1457, #2189; 0.007 GB/s measured at an
/// MTU of 8000).
pub const MAX_UDP_PAYLOAD: u16 = 6000;

/// The largest UDP payload on loopback, whose MTU is 64 KiB. Each datagram
/// costs the same bookkeeping, header protection and send call whatever
/// its size, so ten times fewer datagrams roughly halve the time a 1 MB
/// tensor takes from one process to another (measured:
/// `cargo bench -p tessera-cli --bench cluster -- hop`). GSO is off on this
/// path, as ten such datagrams would exceed 64 KB.
pub const LOOPBACK_UDP_PAYLOAD: u16 = 60000;

/// A stream's receive window on loopback.
const LOOPBACK_STREAM_WINDOW: u32 = 8 << 20;

/// Timeouts, keep-alives and datagram sizes shared by both ends of a
/// connection over `path`.
fn transport(path: Path) -> Arc<quinn::TransportConfig> {
    let mut t = quinn::TransportConfig::default();
    t.keep_alive_interval(Some(Duration::from_secs(1)));
    // A dead peer is noticed within 5 s (idle timeout).
    if let Ok(idle) = quinn::IdleTimeout::try_from(Duration::from_secs(5)) {
        t.max_idle_timeout(Some(idle));
    }
    t.max_concurrent_bidi_streams(1024u32.into());
    t.max_concurrent_uni_streams(1024u32.into());
    // Larger datagrams where the path allows: MTU discovery from 1200
    // bytes up to the path's bound. Never raise `min_mtu` past 16 KB, even
    // on loopback: quinn pads Initial packets to it, and a long-header
    // packet over 16 KB panics in quinn-proto (`packet.rs`); a 60,000-byte
    // `initial_mtu` alone measured no faster (docs/performance.md).
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(path.max_udp_payload());
    t.mtu_discovery_config(Some(mtu));
    t.enable_segmentation_offload(path == Path::Network);
    if path == Path::Loopback {
        // With large datagrams quinn's default 1.25 MB stream window, not
        // the CPU, bounds a stream to ~2 GB/s; 8 MB (the UDP socket
        // buffers' size, so a window's worth never overflows them) lets
        // 1 MB tensors stream at TCP's speed (measured).
        t.stream_receive_window(LOOPBACK_STREAM_WINDOW.into());
        t.send_window(u64::from(LOOPBACK_STREAM_WINDOW) * 2);
    }
    // Ten datagrams in the first flight (IW10), at the size discovery
    // reaches: quinn's default 14,720 bytes holds two 6000-byte datagrams,
    // and a fresh link then stalled ~25 ms on its first 32 KB tensor.
    let mut cc = quinn::congestion::CubicConfig::default();
    cc.initial_window(10 * u64::from(path.max_udp_payload()));
    t.congestion_controller_factory(Arc::new(cc));
    Arc::new(t)
}

/// The server side for connections over `path`: a certificate from the
/// cluster CA is required of every client.
pub fn server_config(id: &NodeIdentity, path: Path) -> Result<quinn::ServerConfig, NetError> {
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
    server.transport_config(transport(path));
    Ok(server)
}

/// A TLS server for the coordinator's HTTP and gRPC listeners (HTTPS,
/// gRPC over TLS): the certificate chain and key given (PEM), no client
/// certificate asked (callers prove themselves with tokens), TLS 1.2 and
/// 1.3, and ALPN `h2` then `http/1.1` (gRPC clients need `h2`).
pub fn web_server_config(cert_pem: &str, key_pem: &str) -> Result<rustls::ServerConfig, NetError> {
    // aws-lc-rs's default suites (TLS 1.2 ones too): web clients vary.
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls)?
        .with_no_client_auth()
        .with_single_cert(certificates(cert_pem)?, private_key(key_pem)?)
        .map_err(tls)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The client side for connections over `path`: the server must show a
/// certificate from the cluster CA (for [`crate::certs::CLUSTER_SAN`]);
/// ours is shown in turn.
pub fn client_config(id: &NodeIdentity, path: Path) -> Result<quinn::ClientConfig, NetError> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .with_root_certificates(roots(&id.ca_pem)?)
        .with_client_auth_cert(certificates(&id.cert_pem)?, private_key(&id.key_pem)?)
        .map_err(tls)?;
    finish_client(config, path)
}

/// A client that shows no certificate: every Tessera node refuses it. For
/// tests and diagnostics.
pub fn client_config_without_certificate(ca_pem: &str) -> Result<quinn::ClientConfig, NetError> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?
        .with_root_certificates(roots(ca_pem)?)
        .with_no_client_auth();
    finish_client(config, Path::Network)
}

fn finish_client(
    mut config: rustls::ClientConfig,
    path: Path,
) -> Result<quinn::ClientConfig, NetError> {
    config.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = QuicClientConfig::try_from(config).map_err(tls)?;
    let mut client = quinn::ClientConfig::new(Arc::new(crypto));
    client.transport_config(transport(path));
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::Path;

    #[test]
    fn loopback_peers_get_the_loopback_path() {
        for (addr, path) in [
            ("127.0.0.1:7000", Path::Loopback),
            ("127.0.0.2:7000", Path::Loopback),
            ("[::1]:7000", Path::Loopback),
            ("[::ffff:127.0.0.1]:7000", Path::Loopback),
            ("10.0.0.7:7000", Path::Network),
            ("[fd00::7]:7000", Path::Network),
        ] {
            assert_eq!(Path::of(addr.parse().unwrap()), path, "{addr}");
        }
        assert!(Path::Loopback.max_udp_payload() > Path::Network.max_udp_payload());
    }
}
