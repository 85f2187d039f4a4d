//! A plugin's configuration, typed: the keys as [`ConfigKey`], each value
//! parsed and checked once, when it is set ([`Config::set`]), so backends
//! read numbers and flags, not strings. The keys and their text forms are
//! OpenVINO's (`NUM_THREADS=2`, `PERF_COUNT=YES`, ...): what workers take
//! on the command line (`--config`) and what a compiled blob's header
//! records.

use crate::plugin::PluginError;

/// A configuration key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConfigKey {
    /// Which device of the plugin's kind (`DEVICE_ID=1`).
    DeviceId,
    /// Collect per-node performance counters (`PERF_COUNT=YES`).
    PerfCount,
    /// Threads per compiled subgraph (`NUM_THREADS=2`).
    NumThreads,
    /// `LATENCY` or `THROUGHPUT`.
    PerformanceHint,
    /// Infer requests a compiled subgraph runs at once.
    NumRequests,
}

impl ConfigKey {
    /// Every key.
    pub const ALL: [ConfigKey; 5] = [
        ConfigKey::DeviceId,
        ConfigKey::PerfCount,
        ConfigKey::NumThreads,
        ConfigKey::PerformanceHint,
        ConfigKey::NumRequests,
    ];

    /// Its name on the command line and in metrics.
    pub fn name(self) -> &'static str {
        match self {
            ConfigKey::DeviceId => "DEVICE_ID",
            ConfigKey::PerfCount => "PERF_COUNT",
            ConfigKey::NumThreads => "NUM_THREADS",
            ConfigKey::PerformanceHint => "PERFORMANCE_HINT",
            ConfigKey::NumRequests => "NUM_REQUESTS",
        }
    }

    /// What it accepts, for errors.
    pub fn allowed(self) -> &'static str {
        match self {
            ConfigKey::DeviceId => "a device index (0, 1, ...)",
            ConfigKey::PerfCount => "YES or NO",
            ConfigKey::NumThreads => "a number of threads >= 1",
            ConfigKey::PerformanceHint => "LATENCY or THROUGHPUT",
            ConfigKey::NumRequests => "a number of requests >= 1",
        }
    }

    /// The key named `name`.
    pub fn parse(name: &str) -> Result<ConfigKey, PluginError> {
        ConfigKey::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| PluginError::UnknownConfigKey {
                key: name.into(),
                supported: ConfigKey::ALL.map(ConfigKey::name).join(", "),
            })
    }
}

/// `PERFORMANCE_HINT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PerformanceHint {
    Latency,
    Throughput,
}

/// A validated configuration: each key set at most once (a later `set`
/// replaces the value).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    device_id: Option<u32>,
    perf_count: Option<bool>,
    num_threads: Option<u32>,
    performance_hint: Option<PerformanceHint>,
    num_requests: Option<u32>,
}

impl Config {
    /// Sets `key` to `value` after checking both.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), PluginError> {
        let key = ConfigKey::parse(key)?;
        let bad = || PluginError::BadConfigValue {
            key: key.name().into(),
            value: value.into(),
            allowed: key.allowed().into(),
        };
        let positive = || {
            value
                .parse::<u32>()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(bad)
        };
        match key {
            ConfigKey::DeviceId => self.device_id = Some(value.parse().map_err(|_| bad())?),
            ConfigKey::PerfCount => {
                self.perf_count = Some(match value {
                    "YES" => true,
                    "NO" => false,
                    _ => return Err(bad()),
                })
            }
            ConfigKey::NumThreads => self.num_threads = Some(positive()?),
            ConfigKey::PerformanceHint => {
                self.performance_hint = Some(match value {
                    "LATENCY" => PerformanceHint::Latency,
                    "THROUGHPUT" => PerformanceHint::Throughput,
                    _ => return Err(bad()),
                })
            }
            ConfigKey::NumRequests => self.num_requests = Some(positive()?),
        }
        Ok(())
    }

    /// The device index (0 unless set).
    pub fn device_id(&self) -> u32 {
        self.device_id.unwrap_or(0)
    }

    /// Whether per-node counters are collected.
    pub fn perf_count(&self) -> bool {
        self.perf_count == Some(true)
    }

    /// Threads per compiled subgraph, if set (≥ 1).
    pub fn num_threads(&self) -> Option<usize> {
        self.num_threads.map(|n| n as usize)
    }

    pub fn performance_hint(&self) -> Option<PerformanceHint> {
        self.performance_hint
    }

    /// Infer requests at once, if set (≥ 1).
    pub fn num_requests(&self) -> Option<u32> {
        self.num_requests
    }

    /// `self` with `overrides` on top (per-compile config wins over the
    /// plugin's).
    pub fn merged(&self, overrides: &Config) -> Config {
        Config {
            device_id: overrides.device_id.or(self.device_id),
            perf_count: overrides.perf_count.or(self.perf_count),
            num_threads: overrides.num_threads.or(self.num_threads),
            performance_hint: overrides.performance_hint.or(self.performance_hint),
            num_requests: overrides.num_requests.or(self.num_requests),
        }
    }

    /// The keys set and their values in text, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, String)> {
        let yes_no = |b: bool| if b { "YES" } else { "NO" };
        let hint = |h: PerformanceHint| match h {
            PerformanceHint::Latency => "LATENCY",
            PerformanceHint::Throughput => "THROUGHPUT",
        };
        let mut set: Vec<(&'static str, String)> = [
            (ConfigKey::DeviceId, self.device_id.map(|v| v.to_string())),
            (
                ConfigKey::PerfCount,
                self.perf_count.map(|b| yes_no(b).into()),
            ),
            (
                ConfigKey::NumThreads,
                self.num_threads.map(|v| v.to_string()),
            ),
            (
                ConfigKey::PerformanceHint,
                self.performance_hint.map(|h| hint(h).into()),
            ),
            (
                ConfigKey::NumRequests,
                self.num_requests.map(|v| v.to_string()),
            ),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k.name(), v?)))
        .collect();
        set.sort();
        set.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_once_and_read_typed() {
        let mut c = Config::default();
        assert!(!c.perf_count() && c.num_threads().is_none() && c.device_id() == 0);
        c.set("PERF_COUNT", "YES").unwrap();
        c.set("NUM_THREADS", "4").unwrap();
        c.set("PERFORMANCE_HINT", "THROUGHPUT").unwrap();
        assert!(c.perf_count());
        assert_eq!(c.num_threads(), Some(4));
        assert_eq!(c.performance_hint(), Some(PerformanceHint::Throughput));
        for (key, value, wanted) in [
            ("NUM_THREADS", "0", "a number of threads >= 1"),
            ("PERF_COUNT", "yes", "YES or NO"),
            ("DEVICE_ID", "-1", "a device index"),
            ("NUM_REQUESTS", "many", "a number of requests"),
        ] {
            let e = c.set(key, value).unwrap_err().to_string();
            assert!(e.contains(wanted) && e.contains(key), "{e}");
        }
        let e = c.set("THREADS", "2").unwrap_err().to_string();
        assert!(e.contains("NUM_THREADS, PERFORMANCE_HINT"), "{e}");
        assert_eq!(c.num_threads(), Some(4), "a refused value changes nothing");
    }

    #[test]
    fn merging_and_text_round_trip() {
        let mut base = Config::default();
        base.set("NUM_THREADS", "2").unwrap();
        base.set("DEVICE_ID", "1").unwrap();
        let mut over = Config::default();
        over.set("NUM_THREADS", "3").unwrap();
        over.set("PERF_COUNT", "NO").unwrap();
        let merged = base.merged(&over);
        let text: Vec<(&str, String)> = merged.iter().collect();
        assert_eq!(
            text,
            [
                ("DEVICE_ID", "1".to_string()),
                ("NUM_THREADS", "3".to_string()),
                ("PERF_COUNT", "NO".to_string())
            ]
        );
        let mut again = Config::default();
        for (k, v) in &text {
            again.set(k, v).unwrap();
        }
        assert_eq!(again, merged);
    }
}
