//! High availability: two or more coordinators share one etcd
//! (`[ha] etcd = [...]`). Each campaigns in etcd's election API under
//! `PREFIX/leader` with a lease of `lease_ttl_s`; the one elected leads,
//! with the creation revision of its candidacy key as its epoch (etcd
//! revisions only grow, so a newer leader's epoch is always larger). The
//! others are standbys: they answer workers and clients with the leader's
//! address ([`LeaderView`]) and take over when its key goes, that is when
//! its lease is not renewed for `lease_ttl_s` (it died, or is paused, or
//! lost etcd).
//!
//! Fencing, three ways: the leader counts its own lease from when each
//! renewal was sent ([`lease::LeaseClock`]) and serves no operation past
//! it; every state write is an etcd transaction that holds only while its
//! candidacy key has its epoch's revision ([`crate::state::EtcdStore`]);
//! and every operation on a worker carries the epoch, which workers refuse
//! once they know a newer one. A coordinator whose lead or candidacy ends
//! (its lease expired, etcd refused a write or cannot be reached) steps
//! down: it logs why once and stops ([`Shared::stepped_down`]); its
//! supervisor starts it again as a standby. Those decisions are
//! [`leadership::Leadership`]'s, pure; the loops here only talk to etcd,
//! sleep and act on them.

pub mod config;
pub mod leadership;
pub mod lease;
pub mod model_copies;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions, SortOrder, SortTarget};
use tessera_common::wire::control::CoordinatorInfo;

use crate::Shared;
use config::HaConfig;
use leadership::{Action, Campaign, Event, Leadership};

/// How long reaching etcd at start may take before it is an error.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// An etcd request with a limit: its answer, or why not (its error, or
/// none within `limit`).
pub(crate) async fn within<T>(
    limit: Duration,
    request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, EtcdError> {
    match tokio::time::timeout(limit, request).await {
        Ok(answer) => Ok(answer?),
        Err(_) => Err(EtcdError::NoAnswer(limit)),
    }
}

/// Why an etcd request failed: etcd's client said why, or no answer came
/// in time.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error(transparent)]
    Client(#[from] etcd_client::Error),
    #[error("no answer in {0:?}")]
    NoAnswer(Duration),
}

/// Who leads, as this coordinator knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderView {
    /// This coordinator leads.
    pub leading: bool,
    /// The leader's address, when one leads.
    pub leader: Option<String>,
    /// The leader's epoch (0: none known).
    pub epoch: u64,
}

impl LeaderView {
    /// What a worker is told of it: `Leading` when this coordinator
    /// leads, else `Standby` with the leader's address.
    pub fn answer(&self) -> tessera_common::wire::cluster::CoordinatorAnswer {
        use tessera_common::wire::cluster::CoordinatorAnswer;
        if self.leading {
            CoordinatorAnswer::Leading { epoch: self.epoch }
        } else {
            CoordinatorAnswer::Standby {
                leader: self.leader.clone(),
                epoch: self.epoch,
            }
        }
    }
}

/// Why HA cannot start.
#[derive(Debug, thiserror::Error)]
pub enum HaError {
    #[error("etcd at {endpoints} cannot be reached: {source}")]
    Unreachable {
        endpoints: String,
        #[source]
        source: EtcdError,
    },
    /// A coordinator with `[ha]` was started as one without.
    #[error("[ha] coordinators start with Coordinator::open")]
    NeedsOpen,
}

/// This coordinator's place in the election.
pub struct Ha {
    /// The address workers and clients dial for this coordinator.
    pub advertise: String,
    client: Client,
    /// The election's name (`PREFIX/leader`).
    election: String,
    ttl: Duration,
    leadership: Mutex<Leadership>,
}

impl Ha {
    /// Connects to etcd (an error within `CONNECT_TIMEOUT` if no
    /// endpoint answers).
    pub async fn connect(config: &HaConfig, advertise: String) -> Result<Ha, HaError> {
        let endpoints = config.etcd.join(",");
        let unreachable = |source: EtcdError| HaError::Unreachable {
            endpoints: endpoints.clone(),
            source,
        };
        // No timeout per request: a campaign waits as long as another
        // leads (the store times its own requests out).
        let options = ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT);
        let connect = Client::connect(config.etcd.clone(), Some(options));
        let client = within(CONNECT_TIMEOUT, connect)
            .await
            .map_err(unreachable)?;
        // The client connects lazily: ask something to know.
        let status = within(CONNECT_TIMEOUT, client.clone().status()).await;
        status.map_err(unreachable)?;
        let ttl = Duration::from_secs(config.lease_ttl_s);
        Ok(Ha {
            client,
            election: format!("{}/leader", config.prefix.trim_end_matches('/')),
            ttl,
            leadership: Mutex::new(Leadership::new(advertise.clone(), ttl)),
            advertise,
        })
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Whether the lease is surely alive now.
    pub fn lease_alive(&self, now: Instant) -> bool {
        self.leadership.lock().is_ok_and(|l| l.lease_alive(now))
    }

    /// What `event` at `now` calls for.
    fn on(&self, event: Event, now: Instant) -> Action {
        let mut leadership = self.leadership.lock().unwrap_or_else(|p| p.into_inner());
        leadership.on(event, now)
    }

    fn renew_every(&self) -> Duration {
        self.leadership
            .lock()
            .map(|l| l.renew_every())
            .unwrap_or(Duration::from_millis(500))
    }
}

/// Feeds `event` to the leadership now: steps down (and `None`) when that
/// is what it decides, else what to do.
fn decide(shared: &Arc<Shared>, ha: &Ha, event: Event) -> Option<Action> {
    match ha.on(event, Instant::now()) {
        Action::StepDown(why) => {
            step_down(shared, why);
            None
        }
        action => Some(action),
    }
}

/// Campaigns; once elected, leads (`crate::lead`). Steps down when the
/// lease or etcd is lost.
pub async fn run(shared: Arc<Shared>, ha: Arc<Ha>) {
    let mut client = ha.client();
    let sent = Instant::now();
    let grant = client.lease_grant(ha.ttl.as_secs() as i64, None);
    let (lease, granted) = match within(CONNECT_TIMEOUT, grant).await {
        Ok(grant) => (
            grant.id(),
            Event::Renewed {
                sent,
                ttl_left_s: grant.ttl(),
            },
        ),
        Err(e) => (0, Event::NotGranted(e.to_string())),
    };
    if decide(&shared, &ha, granted).is_none() {
        return;
    }
    tokio::spawn(keep_lease(shared.clone(), ha.clone(), lease));
    tokio::spawn(observe_leader(shared.clone(), ha.clone()));
    tokio::spawn(crate::state::restore::keep_warm(shared.clone()));
    tracing::info!(advertise = %ha.advertise, "standing by: campaigning for the lead in etcd");
    let campaign = client.campaign(ha.election.clone(), ha.advertise.clone(), lease);
    let elected = tokio::select! {
        elected = campaign => elected,
        _ = shared.closed() => return,
    };
    let (key, campaigned) = match elected.map(|mut answer| answer.take_leader()) {
        Ok(Some(key)) => {
            let epoch = key.rev() as u64;
            (Some(key), Campaign::Elected(epoch))
        }
        Ok(None) => (None, Campaign::NoKey),
        Err(e) => (None, Campaign::Failed(e.to_string())),
    };
    let restore = decide(&shared, &ha, Event::Campaigned(campaigned));
    let (Some(Action::Restore(epoch)), Some(key)) = (restore, key) else {
        return;
    };
    tracing::info!(epoch, "elected: restoring the kept state from etcd");
    let fence = crate::state::Fence {
        key: key.key().to_vec(),
        epoch,
    };
    let restored = match shared.state.lead(fence).await {
        Ok(()) => {
            // Restored before it says it leads: the workers that register
            // then find their deployments to be adopted.
            crate::lead(&shared).await;
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    };
    let Some(Action::Lead(epoch)) = decide(&shared, &ha, Event::Restored(restored)) else {
        return;
    };
    shared.leader.send_replace(LeaderView {
        leading: true,
        leader: Some(ha.advertise.clone()),
        epoch,
    });
    tracing::info!(epoch, advertise = %ha.advertise, "leading the cluster");
    let mut fenced = shared.state.fenced();
    tokio::spawn(async move {
        if fenced.wait_for(|f| *f).await.is_ok() {
            decide(&shared, &ha, Event::WriteRefused);
        }
    });
}

/// Renews the lease every third of its time to live, as long as
/// [`Leadership`] says it is alive; steps down when etcd says it expired,
/// or when it could not be renewed in time.
async fn keep_lease(shared: Arc<Shared>, ha: Arc<Ha>, lease: i64) {
    let mut client = ha.client();
    let mut channel = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(ha.renew_every()) => {}
            _ = shared.closed() => return,
        }
        if decide(&shared, &ha, Event::RenewDue) != Some(Action::Renew) {
            return;
        }
        if channel.is_none() {
            let open = client.lease_keep_alive(lease);
            channel = within(ha.renew_every(), open).await.ok();
        }
        let Some((keeper, stream)) = channel.as_mut() else {
            continue;
        };
        let sent = Instant::now();
        let renew = async {
            keeper.keep_alive().await?;
            stream.message().await
        };
        match tokio::time::timeout(ha.renew_every(), renew).await {
            Ok(Ok(Some(answer))) => {
                let ttl_left_s = answer.ttl();
                if decide(&shared, &ha, Event::Renewed { sent, ttl_left_s }).is_none() {
                    return;
                }
            }
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => channel = None,
        }
    }
}

/// Who leads, from etcd's election (a watch): followed while standing
/// by; a newer leader seen once elected steps this one down.
async fn observe_leader(shared: Arc<Shared>, ha: Arc<Ha>) {
    let mut client = ha.client();
    loop {
        if let Ok(mut stream) = client.observe(ha.election.clone()).await {
            while let Ok(Some(answer)) = stream.message().await {
                let Some(kv) = answer.kv() else { continue };
                let leader = String::from_utf8_lossy(kv.value()).into_owned();
                let epoch = kv.create_revision() as u64;
                match decide(&shared, &ha, Event::LeaderSeen { leader, epoch }) {
                    Some(Action::Follow { leader, epoch }) => {
                        tracing::info!(%leader, epoch, "the cluster's leader");
                        shared.leader.send_modify(|view| {
                            view.leader = Some(leader);
                            view.epoch = epoch;
                        });
                    }
                    Some(_) => {}
                    None => return,
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = shared.closed() => return,
        }
    }
}

/// Ends this coordinator's lead (or candidacy): logs why once, and stops
/// it.
pub fn step_down(shared: &Arc<Shared>, why: String) {
    let first = shared.stepped_down.send_if_modified(|s| {
        let first = s.is_none();
        if first {
            *s = Some(why.clone());
        }
        first
    });
    if !first {
        return;
    }
    tracing::error!("{why}: stepping down (the workers go on serving; start this coordinator again to stand by)");
    shared.leader.send_modify(|v| v.leading = false);
    let shared = shared.clone();
    tokio::spawn(async move {
        shared.closing.send_replace(true);
        shared.node.shutdown().await;
    });
}

/// The coordinators: the leader first, then the standbys in the order
/// they would take over.
pub async fn coordinators(shared: &Shared) -> Vec<CoordinatorInfo> {
    let Some(ha) = &shared.ha else {
        return vec![CoordinatorInfo {
            addr: shared.advertised(),
            epoch: shared.state.epoch(),
            leading: true,
        }];
    };
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let prefix = format!("{}/", ha.election);
    let mut client = ha.client();
    let get = client.get(prefix, Some(options));
    let Ok(got) = within(CONNECT_TIMEOUT, get).await else {
        return Vec::new();
    };
    got.kvs()
        .iter()
        .enumerate()
        .map(|(i, kv)| CoordinatorInfo {
            addr: String::from_utf8_lossy(kv.value()).into_owned(),
            epoch: kv.create_revision() as u64,
            leading: i == 0,
        })
        .collect()
}

/// The answer to a client's `Leader`.
pub async fn leader_answer(shared: &Shared) -> tessera_common::wire::client::ClientReply {
    let view = shared.leader.borrow().clone();
    tessera_common::wire::client::ClientReply::Coordinators {
        leading: shared.leads(),
        leader: view.leader,
        epoch: view.epoch,
        coordinators: coordinators(shared).await,
    }
}

/// A worker's `WatchLeader` stream: who leads now, and again at every
/// change (`Leading` when this coordinator does), until the worker goes.
pub async fn watch_leader(
    shared: Arc<Shared>,
    connection: quinn::Connection,
    mut send: quinn::SendStream,
) {
    let limits = *shared.node.limits();
    let mut views = shared.leader.subscribe();
    loop {
        let answer = views.borrow_and_update().answer();
        let sent = tessera_net::exchange::send_message(&mut send, &answer, None, &limits);
        if sent.await.is_err() {
            return;
        }
        tokio::select! {
            changed = views.changed() => if changed.is_err() { return },
            _ = connection.closed() => return,
            _ = shared.closed() => return,
        }
    }
}
