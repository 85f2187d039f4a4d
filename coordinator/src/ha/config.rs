//! The `[ha]` table of cluster.toml: two or more coordinators, one leading
//! by an etcd lease, their state in etcd.
//!
//! ```toml
//! [ha]
//! etcd = ["http://10.0.0.5:2379"]   # or "http://a:2379,http://b:2379"
//! advertise = "10.0.0.1:7400"       # how workers and clients reach this one
//! lease_ttl_s = 2
//! prefix = "/tessera"
//! ```

use serde::{Deserialize, Deserializer};

/// The `[ha]` keys (each overridable by `TESSERA_HA_<KEY>`).
pub const HA_KEYS: [&str; 4] = ["etcd", "advertise", "lease_ttl_s", "prefix"];

/// The lease's default time to live, s: a dead leader's lead ends at most
/// this long after its last renewal (etcd rounds a shorter one up to its
/// own minimum, 1.5 × its election timeout: 2 s with etcd's defaults).
pub const DEFAULT_LEASE_TTL_S: u64 = 2;

/// HA: empty `etcd`, one coordinator and no HA.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HaConfig {
    /// etcd's client endpoints, `http://HOST:PORT`.
    #[serde(deserialize_with = "list_or_commas")]
    pub etcd: Vec<String>,
    /// `HOST:PORT` workers and clients dial for this coordinator (default:
    /// `listen`, when it names one interface).
    pub advertise: String,
    /// The leader's lease, s.
    pub lease_ttl_s: u64,
    /// The etcd keys' prefix (one per cluster sharing an etcd).
    pub prefix: String,
}

impl Default for HaConfig {
    fn default() -> Self {
        HaConfig {
            etcd: Vec::new(),
            advertise: String::new(),
            lease_ttl_s: DEFAULT_LEASE_TTL_S,
            prefix: "/tessera".into(),
        }
    }
}

impl HaConfig {
    pub fn enabled(&self) -> bool {
        !self.etcd.is_empty()
    }

    /// Checks the table against `listen` (the coordinator's own address);
    /// the reason when it is wrong.
    pub fn check(&self, listen: std::net::SocketAddr) -> Result<(), String> {
        if !self.enabled() {
            return Ok(());
        }
        for endpoint in &self.etcd {
            check_endpoint(endpoint)?;
        }
        if self.lease_ttl_s == 0 {
            return Err("ha.lease_ttl_s must be at least 1".into());
        }
        if !self.prefix.starts_with('/') || self.prefix.len() < 2 {
            return Err(format!(
                "ha.prefix '{}' must be a key path such as /tessera",
                self.prefix
            ));
        }
        if self.advertise.trim().is_empty() && listen.ip().is_unspecified() {
            return Err(format!(
                "ha.advertise must name this coordinator's address: listen ({listen}) does not"
            ));
        }
        Ok(())
    }

    /// The address workers and clients dial for this coordinator.
    pub fn advertised(&self, listen: std::net::SocketAddr) -> String {
        match self.advertise.trim() {
            "" => listen.to_string(),
            a => a.to_string(),
        }
    }
}

/// `http://HOST:PORT` (or `HOST:PORT`) with a port.
fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "ha.etcd endpoint '{endpoint}' {why} (expected http://HOST:PORT, e.g. http://127.0.0.1:2379)"
        ))
    };
    let rest = match endpoint.split_once("://") {
        Some(("http", rest)) => rest,
        Some((scheme, _)) => return bad(&format!("has scheme '{scheme}'")),
        None => endpoint,
    };
    let Some((host, port)) = rest.rsplit_once(':') else {
        return bad("has no port");
    };
    if host.is_empty() || host.contains('/') {
        return bad("has no host");
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => bad("has no valid port"),
    }
}

/// A list of strings, or one string of comma-separated items (what an
/// environment variable gives).
fn list_or_commas<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrText {
        List(Vec<String>),
        Text(String),
    }
    let items = match ListOrText::deserialize(d)? {
        ListOrText::List(l) => l,
        ListOrText::Text(t) => t.split(',').map(str::to_string).collect(),
    };
    Ok(items
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ha(etcd: &[&str]) -> HaConfig {
        HaConfig {
            etcd: etcd.iter().map(|s| s.to_string()).collect(),
            ..HaConfig::default()
        }
    }

    #[test]
    fn etcd_endpoints_are_checked_with_the_reason() {
        let listen = "127.0.0.1:7400".parse().unwrap();
        assert!(ha(&[]).check(listen).is_ok());
        assert!(ha(&["http://127.0.0.1:2379", "etcd:2379"])
            .check(listen)
            .is_ok());
        for (bad, why) in [
            ("https//x:1", "no host"),
            ("ftp://x:2379", "scheme 'ftp'"),
            ("http://127.0.0.1", "no port"),
            ("http://:2379", "no host"),
            ("http://x:0", "no valid port"),
        ] {
            let e = ha(&[bad]).check(listen).unwrap_err();
            assert!(e.contains(why) && e.contains(bad), "{bad}: {e}");
        }
        let any = "0.0.0.0:7400".parse().unwrap();
        let e = ha(&["http://etcd:2379"]).check(any).unwrap_err();
        assert!(e.contains("ha.advertise"), "{e}");
        let zero = HaConfig {
            lease_ttl_s: 0,
            ..ha(&["http://etcd:2379"])
        };
        assert!(zero.check(listen).unwrap_err().contains("lease_ttl_s"));
    }
}
