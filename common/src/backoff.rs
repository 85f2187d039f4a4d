//! Exponential back-off, pure: how long a loop that tries again (a worker
//! dialling its coordinator, a requester reopening a routing-table stream,
//! a front door waiting for its coordinator, an embedded worker joining
//! again) waits before each try. The caller sleeps; the clock it read
//! (how long the last try ran) is passed in.

use std::time::Duration;

/// Waits that double from `first` up to `max`; a try that ran at least
/// `healthy` (it worked for a while before it failed) starts them over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    healthy: Option<Duration>,
    next: Duration,
}

impl Backoff {
    /// Waits of `first`, doubling, at most `max`.
    pub const fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            healthy: None,
            next: first,
        }
    }

    /// The same, started over after a try that ran at least `healthy`.
    pub const fn healthy_after(mut self, healthy: Duration) -> Backoff {
        self.healthy = Some(healthy);
        self
    }

    /// The wait before the next try, after one that failed once it had
    /// run for `ran`.
    pub fn wait_after(&mut self, ran: Duration) -> Duration {
        if self.healthy.is_some_and(|h| ran >= h) {
            self.reset();
        }
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// The wait before the next try.
    pub fn wait(&mut self) -> Duration {
        self.wait_after(Duration::ZERO)
    }

    /// The next wait is the first again (news made waiting pointless).
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_double_up_to_the_cap() {
        let mut b = Backoff::new(100 * MS, 1000 * MS);
        let waits: Vec<u128> = (0..6).map(|_| b.wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
        b.reset();
        assert_eq!(b.wait(), 100 * MS);
    }

    #[test]
    fn a_try_that_ran_long_enough_starts_the_waits_over() {
        let mut b = Backoff::new(100 * MS, 2000 * MS).healthy_after(10_000 * MS);
        assert_eq!(b.wait_after(5 * MS), 100 * MS);
        assert_eq!(b.wait_after(5 * MS), 200 * MS);
        assert_eq!(b.wait_after(9_999 * MS), 400 * MS);
        assert_eq!(b.wait_after(10_000 * MS), 100 * MS);
        assert_eq!(b.wait_after(Duration::ZERO), 200 * MS);
        // Without a healthy length, how long a try ran changes nothing.
        let mut plain = Backoff::new(100 * MS, 2000 * MS);
        plain.wait();
        assert_eq!(plain.wait_after(Duration::from_secs(3600)), 200 * MS);
    }
}
