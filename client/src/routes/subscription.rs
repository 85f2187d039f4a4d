//! Keeping a routing-table subscription as pure decisions, with the clock
//! passed in: what each frame of a `Routes` stream means ([`Heard::of`]:
//! a new table to publish, the network gone, the coordinator standing by,
//! the stream broken), and when a stream that ended is opened again
//! ([`Resubscribe`]: with back-off, which starts over after a stream that
//! lasted) or given up (the network is gone, or nobody listens any more).
//! The async code in `routes.rs` only reads frames, publishes, sleeps and
//! dials.

use std::time::{Duration, Instant};

use tessera_common::backoff::Backoff;
use tessera_common::wire::client::ClientReply;
use tessera_common::wire::control::ErrorKind;
use tessera_common::wire::routes::RoutingTable;
use tessera_common::wire::Frame;

use crate::ClientError;

/// The waits between two tries to subscribe again: 100 ms to 2 s, from
/// the first again after a stream that lasted 10 s.
const REOPEN: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2))
    .healthy_after(Duration::from_secs(10));

/// What one frame of a `Routes` stream (`None`: its end) means.
#[derive(Debug)]
pub(crate) enum Heard {
    /// A new table: publish it, and read on.
    Table(Box<RoutingTable>),
    /// The network is gone (why, and what kind of failure that is):
    /// publish it; the stream is over.
    Gone(String, ErrorKind),
    /// The coordinator stands by: drop its connection (the next try asks
    /// the leader); the stream is over.
    NotLeader,
    /// The stream broke: why.
    Broken(ClientError),
}

impl Heard {
    /// What `frame` means.
    pub fn of(frame: Option<Frame<ClientReply>>) -> Heard {
        match frame {
            Some(Frame::Control(ClientReply::Routes(table), _)) => Heard::Table(table),
            Some(Frame::Control(ClientReply::Unloaded { network }, _)) => Heard::Gone(
                format!("network {network} is not loaded"),
                ErrorKind::NotFound,
            ),
            Some(Frame::Control(ClientReply::NotLeader { .. }, _)) => Heard::NotLeader,
            Some(Frame::Control(ClientReply::Failed(f), _)) => Heard::Gone(f.error, f.kind),
            Some(other) => Heard::Broken(ClientError::Protocol(format!(
                "unexpected {} frame on a routes stream",
                other.kind().name()
            ))),
            None => Heard::Broken(ClientError::Connection("the routes stream ended".into())),
        }
    }
}

/// How a `Routes` stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The network is gone (published).
    Gone,
    /// It broke, could not be opened, or the coordinator stands by.
    Broke,
}

/// What follows a stream's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Subscribe again after this long (the last table stays meanwhile).
    AskAgainAfter(Duration),
    /// Nothing more to keep.
    Stop,
}

/// When to subscribe again.
#[derive(Debug, Clone)]
pub(crate) struct Resubscribe {
    backoff: Backoff,
    /// When the last stream was opened.
    opened: Option<Instant>,
}

impl Resubscribe {
    /// Before the first stream.
    pub fn new() -> Resubscribe {
        Resubscribe {
            backoff: REOPEN,
            opened: None,
        }
    }

    /// A stream is opened at `now`.
    pub fn opened(&mut self, now: Instant) {
        self.opened = Some(now);
    }

    /// The stream ended so at `now`; `listening`: someone still holds the
    /// subscription.
    pub fn ended(&mut self, ended: Ended, listening: bool, now: Instant) -> Next {
        if ended == Ended::Gone || !listening {
            return Next::Stop;
        }
        let ran = self
            .opened
            .map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
        Next::AskAgainAfter(self.backoff.wait_after(ran))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_common::wire::Failure;

    const MS: Duration = Duration::from_millis(1);

    /// Opens a stream at `now` that ends `Broke` after `ran`: the wait.
    fn broke(r: &mut Resubscribe, now: &mut Instant, ran: Duration) -> Duration {
        r.opened(*now);
        *now += ran;
        let Next::AskAgainAfter(wait) = r.ended(Ended::Broke, true, *now) else {
            panic!("gave up on a stream that broke");
        };
        *now += wait;
        wait
    }

    #[test]
    fn a_broken_stream_is_asked_again_with_waits_that_double_up_to_2_s() {
        let mut r = Resubscribe::new();
        let mut now = Instant::now();
        let waits: Vec<u128> = (0..7)
            .map(|_| broke(&mut r, &mut now, 5 * MS).as_millis())
            .collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000, 2000]);
    }

    #[test]
    fn a_stream_that_lasted_starts_the_waits_over() {
        let mut r = Resubscribe::new();
        let mut now = Instant::now();
        for _ in 0..5 {
            broke(&mut r, &mut now, 5 * MS);
        }
        // It then brought tables for an hour before the coordinator went.
        assert_eq!(broke(&mut r, &mut now, Duration::from_secs(3600)), 100 * MS);
        assert_eq!(broke(&mut r, &mut now, 5 * MS), 200 * MS);
    }

    #[test]
    fn it_gives_up_once_the_network_is_gone_or_nobody_listens() {
        let now = Instant::now();
        let mut r = Resubscribe::new();
        r.opened(now);
        assert_eq!(r.ended(Ended::Gone, true, now), Next::Stop);
        let mut r = Resubscribe::new();
        r.opened(now);
        assert_eq!(r.ended(Ended::Broke, false, now), Next::Stop);
    }

    fn control(reply: ClientReply) -> Heard {
        Heard::of(Some(Frame::Control(reply, Default::default())))
    }

    #[test]
    fn each_frame_says_whether_to_publish_read_on_or_ask_again() {
        let table = RoutingTable {
            network: 4,
            name: "rec".into(),
            version: 2,
            signature: Default::default(),
            copies: Vec::new(),
            generation: None,
            embedding: None,
            loss_grace_ms: 1000,
        };
        let heard = control(ClientReply::Routes(Box::new(table.clone())));
        assert!(matches!(heard, Heard::Table(t) if *t == table));
        let heard = control(ClientReply::Unloaded { network: 4 });
        assert!(matches!(
            heard,
            Heard::Gone(why, ErrorKind::NotFound) if why == "network 4 is not loaded"
        ));
        let failure = Failure::of_operation(ErrorKind::BadInput, "no such model");
        let heard = control(ClientReply::Failed(failure));
        assert!(matches!(
            heard,
            Heard::Gone(why, ErrorKind::BadInput) if why == "no such model"
        ));
        let heard = control(ClientReply::NotLeader { leader: None });
        assert!(matches!(heard, Heard::NotLeader));
        let other = ClientReply::Coordinators {
            leading: true,
            leader: None,
            epoch: 0,
            coordinators: Vec::new(),
        };
        assert!(matches!(
            control(other),
            Heard::Broken(ClientError::Protocol(e)) if e.contains("unexpected control frame")
        ));
        assert!(matches!(
            Heard::of(None),
            Heard::Broken(ClientError::Connection(e)) if e == "the routes stream ended"
        ));
    }
}
