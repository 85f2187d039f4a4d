//! Keeping named models loaded: a pure decision per model ([`decide`]:
//! what [`keep_loaded`] sees of it, in; whether to load it and when to
//! look again, out), driven by wake-ups (a worker registered or lost, a
//! load ended: [`super::Repository::changed`]) and by the one deadline the
//! decisions ask for, not by polling.
//!
//! The rules: a model not wanted (unloaded) or being loaded is left alone.
//! A wanted model without a network is loaded once every worker its
//! request names is registered; after `worker_timeout_ms` from start it is
//! loaded without the absent ones (then it is *degraded*). A failed load
//! is not tried again with the same workers for [`RETRY_AFTER`]. A
//! degraded model whose workers are all back is planned again over all of
//! them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::load::{load_entry, progress_log, Keep};
use super::status::{absent_workers, worker_names};
use super::RETRY_AFTER;
use crate::Shared;

/// What [`keep_loaded`] knows of one named model at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Facts {
    pub wanted: bool,
    pub loading: bool,
    /// It has a network serving it.
    pub loaded: bool,
    /// Loaded without some workers its request names.
    pub degraded: bool,
    /// Some workers its request names are not registered.
    pub absent: bool,
    /// Its last load failed, with the workers registered now, this long
    /// ago.
    pub failed_ago: Option<Duration>,
    /// Time since the coordinator started.
    pub uptime: Duration,
}

/// The timings the rules use.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    /// How long after start absent workers are waited for.
    pub grace: Duration,
    /// How long a failed load waits before it is tried again with the
    /// same workers.
    pub retry_after: Duration,
}

/// What to do about one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decision {
    /// Load it now, so.
    pub load: Option<Keep>,
    /// If nothing changes, decide again after this long.
    pub recheck: Option<Duration>,
}

const NOTHING: Decision = Decision {
    load: None,
    recheck: None,
};

fn load(without_absent: bool, replace: bool) -> Decision {
    Decision {
        load: Some(Keep::Yes {
            without_absent,
            replace,
        }),
        recheck: None,
    }
}

fn later(after: Duration) -> Decision {
    Decision {
        load: None,
        recheck: Some(after),
    }
}

/// The rules (see the module's notes).
pub(crate) fn decide(f: Facts, t: Timing) -> Decision {
    if !f.wanted || f.loading {
        return NOTHING;
    }
    if f.loaded {
        return if f.degraded && !f.absent {
            load(false, true)
        } else {
            NOTHING
        };
    }
    if let Some(ago) = f.failed_ago.filter(|&ago| ago < t.retry_after) {
        return later(t.retry_after - ago);
    }
    if !f.absent {
        load(false, false)
    } else if f.uptime >= t.grace {
        load(true, false)
    } else {
        later(t.grace - f.uptime)
    }
}

/// When nothing is due, the decisions are made again at least this often
/// anyway (a safety net: every change also wakes the loop).
const AT_LEAST_EVERY: Duration = RETRY_AFTER;

/// Loads every wanted model that has no network, whenever workers are
/// registered, by `decide`'s rules. Runs until the coordinator shuts
/// down.
pub async fn keep_loaded(shared: Arc<Shared>) {
    let timing = Timing {
        grace: Duration::from_millis(shared.config.worker_timeout_ms),
        retry_after: RETRY_AFTER,
    };
    loop {
        let mut wait = AT_LEAST_EVERY;
        if !shared.workers.is_empty() {
            let workers = worker_names(&shared);
            for name in shared.repository.names() {
                let Some(entry) = shared.repository.get(&name) else {
                    continue;
                };
                let decision = decide(facts(&shared, &workers, &entry), timing);
                if let Some(after) = decision.recheck {
                    wait = wait.min(after);
                }
                if let Some(keep) = decision.load {
                    tokio::spawn(load_kept(shared.clone(), entry, keep));
                }
            }
        }
        tokio::select! {
            () = shared.repository.changed.notified() => {}
            () = tokio::time::sleep(wait) => {}
            () = shared.closed() => return,
        }
    }
}

/// What the rules need of `entry` now (`workers`: those registered).
fn facts(shared: &Shared, workers: &[String], entry: &super::Entry) -> Facts {
    let s = entry.lock();
    Facts {
        wanted: s.wanted,
        loading: s.loading,
        loaded: s.network.is_some(),
        degraded: s.degraded,
        absent: !absent_workers(shared, &s.request).is_empty(),
        failed_ago: s
            .failure
            .as_ref()
            .filter(|(_, then, _)| then.as_slice() == workers)
            .map(|(_, _, at): &(String, Vec<String>, Instant)| at.elapsed()),
        uptime: shared.started.elapsed(),
    }
}

async fn load_kept(shared: Arc<Shared>, entry: Arc<super::Entry>, keep: Keep) {
    let tx = progress_log(&entry.name);
    match load_entry(&shared, &entry.name, None, keep, tx).await {
        Ok(l) => tracing::info!(model = %entry.name, network = l.id, "named model ready"),
        Err(e) => tracing::warn!(model = %entry.name, "named model not loaded: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timing = Timing {
        grace: Duration::from_secs(2),
        retry_after: Duration::from_secs(30),
    };

    fn wanted() -> Facts {
        Facts {
            wanted: true,
            uptime: Duration::from_secs(10),
            ..Facts::default()
        }
    }

    fn secs(s: u64) -> Option<Duration> {
        Some(Duration::from_secs(s))
    }

    #[test]
    fn unwanted_or_loading_models_are_left_alone() {
        for f in [
            Facts {
                wanted: false,
                ..wanted()
            },
            Facts {
                loading: true,
                ..wanted()
            },
            Facts {
                loading: true,
                degraded: true,
                loaded: true,
                ..wanted()
            },
        ] {
            assert_eq!(decide(f, T), NOTHING, "{f:?}");
        }
    }

    #[test]
    fn a_wanted_model_without_a_network_loads_when_its_workers_are_there() {
        assert_eq!(decide(wanted(), T), load(false, false));
    }

    #[test]
    fn absent_workers_are_waited_for_until_the_grace_ends_then_left_out() {
        let early = Facts {
            absent: true,
            uptime: Duration::from_millis(500),
            ..wanted()
        };
        assert_eq!(decide(early, T), later(Duration::from_millis(1500)));
        let late = Facts {
            absent: true,
            uptime: secs(2).unwrap(),
            ..wanted()
        };
        assert_eq!(decide(late, T), load(true, false));
    }

    #[test]
    fn a_failed_load_waits_before_trying_the_same_workers_again() {
        let failed = Facts {
            failed_ago: secs(10),
            ..wanted()
        };
        assert_eq!(decide(failed, T), later(Duration::from_secs(20)));
        let long_ago = Facts {
            failed_ago: secs(30),
            ..wanted()
        };
        assert_eq!(decide(long_ago, T), load(false, false));
        // With other workers now (no `failed_ago`): at once.
        assert_eq!(decide(wanted(), T), load(false, false));
    }

    #[test]
    fn a_degraded_model_is_planned_again_once_its_workers_are_back() {
        let degraded = Facts {
            loaded: true,
            degraded: true,
            ..wanted()
        };
        assert_eq!(decide(degraded, T), load(false, true));
        let still_absent = Facts {
            absent: true,
            ..degraded
        };
        assert_eq!(decide(still_absent, T), NOTHING);
        let healthy = Facts {
            loaded: true,
            ..wanted()
        };
        assert_eq!(decide(healthy, T), NOTHING);
    }
}
