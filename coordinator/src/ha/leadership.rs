//! A coordinator's place in the election as a pure state machine, with
//! the clock passed in: fed with what etcd answered ([`Event`]: the lease
//! granted or renewed, the campaign's end, the kept state restored, a
//! write refused, the leader observed) and `now`, it says what to do
//! ([`Action`]): renew the lease, restore and lead, follow another leader,
//! or step down and why. The async loops in `ha/mod.rs` only talk to etcd,
//! sleep and act on what it returns.
//!
//! It steps down when its lease is past ([`LeaseClock`]: etcd unreachable
//! for as long as the lease lives, or etcd says it expired), when etcd
//! grants no lease, fails the campaign or refuses a write, when the kept
//! state cannot be read, and when, elected, it sees another coordinator
//! lead with a newer epoch (its own key is gone). Once down, nothing more.

use std::time::{Duration, Instant};

use super::lease::{LeaseClock, Renewal};

/// Where this coordinator stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Campaigning: another leads, or none yet.
    Standby,
    /// Elected with this epoch, restoring the kept state.
    Elected(u64),
    /// Leading with this epoch.
    Leading(u64),
    /// Its lead or candidacy is over.
    Down,
}

/// How a campaign ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Campaign {
    /// Elected: its candidacy key's creation revision.
    Elected(u64),
    /// etcd answered without a key.
    NoKey,
    /// etcd's error.
    Failed(String),
}

/// What etcd answered, or what is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A grant or renewal sent at `sent` answered with `ttl_left_s`
    /// seconds to live.
    Renewed { sent: Instant, ttl_left_s: i64 },
    /// etcd granted no lease: why.
    NotGranted(String),
    /// It is time to renew the lease.
    RenewDue,
    /// The campaign ended.
    Campaigned(Campaign),
    /// The kept state was read from etcd and restored, or why not.
    Restored(Result<(), String>),
    /// etcd refused a state write (the candidacy key's revision changed).
    WriteRefused,
    /// etcd's election names `leader` (an advertised address) with
    /// `epoch`.
    LeaderSeen { leader: String, epoch: u64 },
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing (go on waiting).
    Nothing,
    /// Send a renewal.
    Renew,
    /// Restore the kept state, fenced by `epoch`, then report
    /// [`Event::Restored`].
    Restore(u64),
    /// Say it leads with this epoch.
    Lead(u64),
    /// Tell workers and clients that `leader` leads with `epoch`.
    Follow { leader: String, epoch: u64 },
    /// Stop: the lead or candidacy is over, why.
    StepDown(String),
}

/// The decisions (see the module's notes).
#[derive(Debug, Clone)]
pub struct Leadership {
    /// This coordinator's advertised address.
    advertise: String,
    lease: LeaseClock,
    role: Role,
    /// The other coordinator last followed.
    following: Option<String>,
}

impl Leadership {
    /// A standby advertising `advertise`, with a lease of `ttl` not yet
    /// granted.
    pub fn new(advertise: String, ttl: Duration) -> Leadership {
        Leadership {
            advertise,
            lease: LeaseClock::new(ttl),
            role: Role::Standby,
            following: None,
        }
    }

    /// Where it stands.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Whether the lease is surely alive at `now`.
    pub fn lease_alive(&self, now: Instant) -> bool {
        self.lease.alive(now)
    }

    /// How often to renew the lease (and how long one renewal may take).
    pub fn renew_every(&self) -> Duration {
        self.lease.renew_every()
    }

    /// What `event`, at `now`, calls for.
    pub fn on(&mut self, event: Event, now: Instant) -> Action {
        if self.role == Role::Down {
            return Action::Nothing;
        }
        let action = self.decide(event, now);
        if matches!(action, Action::StepDown(_)) {
            self.role = Role::Down;
        }
        action
    }

    fn decide(&mut self, event: Event, now: Instant) -> Action {
        match event {
            Event::Renewed { sent, ttl_left_s } => match self.lease.renewed(sent, ttl_left_s) {
                Renewal::Alive(_) => Action::Nothing,
                Renewal::Expired => down("etcd says the lease expired"),
            },
            Event::NotGranted(e) => down(format!("etcd granted no lease: {e}")),
            Event::RenewDue if self.lease.alive(now) => Action::Renew,
            Event::RenewDue => down("the etcd lease ran out before it was renewed"),
            Event::Campaigned(campaign) => self.campaigned(campaign),
            Event::Restored(Err(e)) => down(format!("the kept state cannot be read: {e}")),
            Event::Restored(Ok(())) => match self.role {
                Role::Elected(epoch) => {
                    self.role = Role::Leading(epoch);
                    Action::Lead(epoch)
                }
                _ => Action::Nothing,
            },
            Event::WriteRefused => down("etcd refused a write: another coordinator leads"),
            Event::LeaderSeen { leader, epoch } => self.leader_seen(leader, epoch),
        }
    }

    fn campaigned(&mut self, campaign: Campaign) -> Action {
        match campaign {
            Campaign::Elected(epoch) => {
                self.role = Role::Elected(epoch);
                Action::Restore(epoch)
            }
            Campaign::NoKey => down("etcd answered the campaign without a key"),
            Campaign::Failed(e) => down(format!("etcd: the campaign failed: {e}")),
        }
    }

    fn leader_seen(&mut self, leader: String, epoch: u64) -> Action {
        if leader == self.advertise {
            // Elected: it says so itself once it has restored.
            return Action::Nothing;
        }
        let own = match self.role {
            Role::Elected(own) | Role::Leading(own) => Some(own),
            Role::Standby | Role::Down => None,
        };
        if own.is_some_and(|own| epoch > own) {
            return down(format!(
                "etcd names another leader, {leader} (epoch {epoch})"
            ));
        }
        let leading = matches!(self.role, Role::Leading(_));
        if leading || self.following.as_deref() == Some(leader.as_str()) {
            return Action::Nothing;
        }
        self.following = Some(leader.clone());
        Action::Follow { leader, epoch }
    }
}

fn down(why: impl Into<String>) -> Action {
    Action::StepDown(why.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(2);
    const MS: Duration = Duration::from_millis(1);

    fn granted(t0: Instant) -> Leadership {
        let mut l = Leadership::new("me:1".into(), TTL);
        let renewed = Event::Renewed {
            sent: t0,
            ttl_left_s: 2,
        };
        assert_eq!(l.on(renewed, t0 + 5 * MS), Action::Nothing);
        l
    }

    fn seen(leader: &str, epoch: u64) -> Event {
        Event::LeaderSeen {
            leader: leader.into(),
            epoch,
        }
    }

    fn is_down(action: &Action, why: &str) -> bool {
        matches!(action, Action::StepDown(w) if w.contains(why))
    }

    /// Elected with `epoch` and restored.
    fn leading(t0: Instant, epoch: u64) -> Leadership {
        let mut l = granted(t0);
        let elected = Event::Campaigned(Campaign::Elected(epoch));
        assert_eq!(l.on(elected, t0), Action::Restore(epoch));
        assert_eq!(l.on(Event::Restored(Ok(())), t0), Action::Lead(epoch));
        assert_eq!(l.role(), Role::Leading(epoch));
        l
    }

    #[test]
    fn the_lease_is_renewed_while_alive_and_its_end_steps_down() {
        let t0 = Instant::now();
        let mut l = granted(t0);
        assert_eq!(l.renew_every(), TTL / 3);
        assert_eq!(l.on(Event::RenewDue, t0 + 700 * MS), Action::Renew);
        // etcd cannot be reached: no renewal answers. It goes on trying
        // for as long as the lease it counts lives...
        assert_eq!(l.on(Event::RenewDue, t0 + 1999 * MS), Action::Renew);
        // ... and steps down once it is past.
        let past = l.on(Event::RenewDue, t0 + TTL);
        assert!(is_down(&past, "ran out before it was renewed"), "{past:?}");
        assert_eq!(l.role(), Role::Down);
        // Down is final: no more renewals, no second step-down.
        assert_eq!(l.on(Event::RenewDue, t0 + TTL), Action::Nothing);
        assert_eq!(l.on(Event::WriteRefused, t0 + TTL), Action::Nothing);
    }

    #[test]
    fn a_renewal_moves_the_end_and_an_expired_lease_steps_down() {
        let t0 = Instant::now();
        let mut l = granted(t0);
        let t1 = t0 + 700 * MS;
        let renewed = Event::Renewed {
            sent: t1,
            ttl_left_s: 2,
        };
        assert_eq!(l.on(renewed, t1 + 3 * MS), Action::Nothing);
        assert_eq!(l.on(Event::RenewDue, t0 + TTL), Action::Renew);
        let expired = Event::Renewed {
            sent: t1,
            ttl_left_s: 0,
        };
        let action = l.on(expired, t1);
        assert!(
            is_down(&action, "etcd says the lease expired"),
            "{action:?}"
        );
    }

    #[test]
    fn etcd_refusing_a_lease_a_campaign_or_the_state_steps_down() {
        let t0 = Instant::now();
        let mut l = Leadership::new("me:1".into(), TTL);
        let action = l.on(Event::NotGranted("no answer in 3s".into()), t0);
        assert!(is_down(&action, "etcd granted no lease: no answer"));
        for (campaign, why) in [
            (
                Campaign::Failed("lost".into()),
                "etcd: the campaign failed: lost",
            ),
            (Campaign::NoKey, "without a key"),
        ] {
            let mut l = granted(t0);
            let action = l.on(Event::Campaigned(campaign), t0);
            assert!(is_down(&action, why), "{action:?}");
        }
        let mut l = granted(t0);
        l.on(Event::Campaigned(Campaign::Elected(7)), t0);
        let action = l.on(Event::Restored(Err("bad record".into())), t0);
        assert!(is_down(
            &action,
            "the kept state cannot be read: bad record"
        ));
    }

    #[test]
    fn a_refused_write_steps_the_leader_down() {
        let t0 = Instant::now();
        let mut l = leading(t0, 7);
        let action = l.on(Event::WriteRefused, t0 + 300 * MS);
        assert!(is_down(&action, "another coordinator leads"), "{action:?}");
    }

    #[test]
    fn a_standby_follows_each_new_leader_once() {
        let t0 = Instant::now();
        let mut l = granted(t0);
        let a = Action::Follow {
            leader: "a:1".into(),
            epoch: 5,
        };
        assert_eq!(l.on(seen("a:1", 5), t0), a);
        assert_eq!(l.on(seen("a:1", 5), t0), Action::Nothing);
        // The leader's key is gone and another standby took over.
        let b = Action::Follow {
            leader: "b:1".into(),
            epoch: 9,
        };
        assert_eq!(l.on(seen("b:1", 9), t0), b);
        // Its own key leads: it was elected, and says so once restored.
        assert_eq!(l.on(seen("me:1", 12), t0), Action::Nothing);
        assert_eq!(l.role(), Role::Standby);
    }

    #[test]
    fn elected_it_takes_over_and_steps_down_when_a_newer_epoch_leads() {
        let t0 = Instant::now();
        let mut l = granted(t0);
        l.on(seen("a:1", 5), t0);
        // The old leader's key went: the campaign ends, elected.
        let elected = Event::Campaigned(Campaign::Elected(8));
        assert_eq!(l.on(elected, t0), Action::Restore(8));
        // While it restores, an old view of the old leader changes
        // nothing that matters.
        assert_eq!(l.on(seen("a:1", 5), t0), Action::Nothing);
        assert_eq!(l.on(Event::Restored(Ok(())), t0), Action::Lead(8));
        // Leading: older leaders seen late are ignored ...
        assert_eq!(l.on(seen("c:1", 6), t0), Action::Nothing);
        // ... a newer epoch means its own key is gone.
        let action = l.on(seen("c:1", 11), t0);
        assert!(
            is_down(&action, "another leader, c:1 (epoch 11)"),
            "{action:?}"
        );
    }

    #[test]
    fn stepped_down_while_restoring_it_never_says_it_leads() {
        let t0 = Instant::now();
        let mut l = granted(t0);
        l.on(Event::Campaigned(Campaign::Elected(8)), t0);
        assert!(matches!(l.on(seen("c:1", 11), t0), Action::StepDown(_)));
        assert_eq!(l.on(Event::Restored(Ok(())), t0), Action::Nothing);
        assert_eq!(l.role(), Role::Down);
    }
}
