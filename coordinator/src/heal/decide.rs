//! The heal of one copy as a pure state machine, with the clock passed
//! in: each pass looks at the copy ([`Seen`]) and leaves it or re-plans it
//! ([`Heal::look`]); a re-plan that placed it says how long the heal took
//! ([`Heal::placed`]); one that failed is tried again a heartbeat later, at
//! most [`HEAL_TRIES`] times in all, or at once given up when waiting
//! cannot help ([`Heal::failed`]). A copy given up is broken until a worker
//! (re)joins, which starts a new heal. The async code in `heal.rs` only
//! undeploys, deploys, sleeps and publishes what this decides.

use std::time::{Duration, Instant};

use crate::network::Current;

/// Re-plans tried after a loss before a network is declared broken.
pub(super) const HEAL_TRIES: usize = 3;

/// What a heal pass sees of its copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    /// It has a ready deployment...
    pub ready: bool,
    /// ... on workers all connected.
    pub whole: bool,
}

impl Seen {
    /// What `current` is, its workers being all connected (`healthy`) or
    /// not.
    pub fn of(current: &Current, healthy: bool) -> Seen {
        Seen {
            ready: matches!(current, Current::Ready(_)),
            whole: healthy,
        }
    }
}

/// A heal pass's first step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Its deployment is ready and whole (another pass healed it, or the
    /// worker that joined changes nothing): nothing to do.
    Leave,
    /// Undeploy what it had and plan it again.
    Replan,
}

/// What follows a failed re-plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterFailure {
    /// Pause until then (a heartbeat: workers may be registering), then
    /// look again.
    TryAgainAt(Instant),
    /// The copy is broken until a worker joins.
    GiveUp,
}

/// One heal of one copy, from its first look to its end.
#[derive(Debug, Clone)]
pub(super) struct Heal {
    started: Instant,
    /// Its failed re-plans so far.
    failed: usize,
    /// The pause before trying again.
    retry_after: Duration,
}

impl Heal {
    /// A heal starting at `now` that pauses `retry_after` (a heartbeat)
    /// after a failed re-plan.
    pub fn new(now: Instant, retry_after: Duration) -> Heal {
        Heal {
            started: now,
            failed: 0,
            retry_after,
        }
    }

    /// A pass looks at its copy: leave it or re-plan it.
    pub fn look(&self, seen: Seen) -> Step {
        if seen.ready && seen.whole {
            Step::Leave
        } else {
            Step::Replan
        }
    }

    /// A re-plan placed the copy at `now`: how long the heal took.
    pub fn placed(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.started)
    }

    /// A re-plan failed at `now`; `fixed`: for a reason waiting cannot
    /// change (its devices or the plan itself).
    pub fn failed(&mut self, fixed: bool, now: Instant) -> AfterFailure {
        self.failed += 1;
        if fixed || self.failed >= HEAL_TRIES {
            AfterFailure::GiveUp
        } else {
            AfterFailure::TryAgainAt(now + self.retry_after)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEAT: Duration = Duration::from_millis(500);

    fn seen(ready: bool, whole: bool) -> Seen {
        Seen { ready, whole }
    }

    #[test]
    fn a_ready_whole_copy_is_left_alone() {
        let heal = Heal::new(Instant::now(), BEAT);
        assert_eq!(heal.look(seen(true, true)), Step::Leave);
        // Ready on a worker that is gone, healing or broken: re-planned.
        assert_eq!(heal.look(seen(true, false)), Step::Replan);
        assert_eq!(heal.look(seen(false, false)), Step::Replan);
    }

    #[test]
    fn failed_replans_are_tried_again_a_heartbeat_later_then_given_up() {
        let t0 = Instant::now();
        let mut heal = Heal::new(t0, BEAT);
        let mut now = t0;
        for _ in 1..HEAL_TRIES {
            assert_eq!(heal.look(seen(false, false)), Step::Replan);
            now += Duration::from_millis(30);
            let AfterFailure::TryAgainAt(at) = heal.failed(false, now) else {
                panic!("gave up before {HEAL_TRIES} tries");
            };
            assert_eq!(at, now + BEAT);
            now = at;
        }
        assert_eq!(heal.failed(false, now), AfterFailure::GiveUp);
    }

    #[test]
    fn a_replan_that_waiting_cannot_fix_gives_up_at_once() {
        let now = Instant::now();
        assert_eq!(Heal::new(now, BEAT).failed(true, now), AfterFailure::GiveUp);
    }

    #[test]
    fn a_lost_worker_coming_back_is_used_by_the_next_try() {
        let t0 = Instant::now();
        let mut heal = Heal::new(t0, BEAT);
        // Its worker is lost: the copy heals, and the first re-plan finds
        // too few workers.
        assert_eq!(heal.look(seen(false, false)), Step::Replan);
        let t1 = t0 + Duration::from_millis(20);
        assert_eq!(heal.failed(false, t1), AfterFailure::TryAgainAt(t1 + BEAT));
        // The worker registered meanwhile: the next try places the copy.
        assert_eq!(heal.look(seen(false, false)), Step::Replan);
        let t2 = t1 + BEAT + Duration::from_millis(80);
        assert_eq!(heal.placed(t2), Duration::from_millis(600));
    }

    #[test]
    fn a_worker_joining_heals_a_copy_given_up_unless_it_is_whole_again() {
        let t0 = Instant::now();
        let mut given_up = Heal::new(t0, BEAT);
        assert_eq!(given_up.failed(true, t0), AfterFailure::GiveUp);
        // Broken until a worker joins: that starts a new heal, which
        // re-plans it with its own count of tries.
        let joined = t0 + Duration::from_secs(60);
        let mut again = Heal::new(joined, BEAT);
        assert_eq!(again.look(seen(false, false)), Step::Replan);
        assert!(matches!(
            again.failed(false, joined),
            AfterFailure::TryAgainAt(_)
        ));
        // Another pass healed it first: left alone.
        assert_eq!(Heal::new(joined, BEAT).look(seen(true, true)), Step::Leave);
    }
}
