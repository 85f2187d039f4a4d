//! The leader's own view of its etcd lease, with the clock passed in: it
//! leads only while the lease etcd last confirmed is surely alive, counted
//! from when that renewal was *sent* (etcd counts from when it got it, a
//! little later), so this side always gives up first.

use std::time::{Duration, Instant};

/// What a renewal's answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Alive until the returned instant.
    Alive(Instant),
    /// etcd says the lease is gone (time to live 0): the lead is over.
    Expired,
}

/// The lease as the leader counts it.
#[derive(Debug, Clone)]
pub struct LeaseClock {
    ttl: Duration,
    valid_until: Option<Instant>,
}

impl LeaseClock {
    /// A lease of `ttl`, not yet confirmed.
    pub fn new(ttl: Duration) -> LeaseClock {
        LeaseClock {
            ttl,
            valid_until: None,
        }
    }

    /// etcd answered a grant or renewal sent at `sent` with `ttl_left_s`
    /// seconds to live.
    pub fn renewed(&mut self, sent: Instant, ttl_left_s: i64) -> Renewal {
        if ttl_left_s <= 0 {
            self.valid_until = None;
            return Renewal::Expired;
        }
        let left = Duration::from_secs(ttl_left_s as u64).min(self.ttl);
        let until = sent + left;
        // Answers may come out of order: never move the end back.
        let until = self.valid_until.map_or(until, |u| u.max(until));
        self.valid_until = Some(until);
        Renewal::Alive(until)
    }

    /// Whether the lease is surely alive at `now`.
    pub fn alive(&self, now: Instant) -> bool {
        self.valid_until.is_some_and(|u| now < u)
    }

    /// How often to renew: three times per time to live.
    pub fn renew_every(&self) -> Duration {
        (self.ttl / 3).max(Duration::from_millis(100))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leader_gives_up_its_lease_before_etcd_does() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(2);
        let mut lease = LeaseClock::new(ttl);
        // Not confirmed yet: not alive.
        assert!(!lease.alive(t0));
        assert_eq!(lease.renewed(t0, 2), Renewal::Alive(t0 + ttl));
        assert!(lease.alive(t0 + Duration::from_millis(1999)));
        assert!(!lease.alive(t0 + ttl));
        // A renewal sent later moves the end; an older answer arriving
        // after it does not move it back.
        let t1 = t0 + Duration::from_millis(700);
        lease.renewed(t1, 2);
        lease.renewed(t0 + Duration::from_millis(100), 2);
        assert!(lease.alive(t1 + Duration::from_millis(1999)));
        // etcd's time to live is never trusted past the configured one.
        lease.renewed(t1, 30);
        assert!(!lease.alive(t1 + ttl + Duration::from_millis(1)));
        // A paused process wakes up past its lease: it does not lead.
        assert!(!lease.alive(t1 + Duration::from_secs(60)));
        // etcd says it is gone.
        assert_eq!(lease.renewed(t1, 0), Renewal::Expired);
        assert!(!lease.alive(t1));
        assert_eq!(lease.renew_every(), ttl / 3);
    }
}
