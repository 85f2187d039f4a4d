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
//! supervisor starts it again as a standby.

pub mod config;
pub mod lease;
pub mod model_copies;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions, SortOrder, SortTarget};
use tessera_common::wire::control::CoordinatorInfo;

use crate::Shared;
use config::HaConfig;
use lease::{LeaseClock, Renewal};

/// How long reaching etcd at start may take before it is an error.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// An etcd request with a limit: its answer, or why not (its error, or
/// none within `limit`).
pub(crate) async fn within<T>(
    limit: Duration,
    request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, request).await {
        Ok(answer) => answer.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer in {limit:?}")),
    }
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
    #[error("etcd at {endpoints} cannot be reached: {reason}")]
    Unreachable { endpoints: String, reason: String },
}

/// This coordinator's place in the election.
pub struct Ha {
    /// The address workers and clients dial for this coordinator.
    pub advertise: String,
    client: Client,
    /// The election's name (`PREFIX/leader`).
    election: String,
    ttl: Duration,
    lease: Mutex<LeaseClock>,
}

impl Ha {
    /// Connects to etcd (an error within [`CONNECT_TIMEOUT`] if no
    /// endpoint answers).
    pub async fn connect(config: &HaConfig, advertise: String) -> Result<Ha, HaError> {
        let endpoints = config.etcd.join(",");
        let unreachable = |reason: String| HaError::Unreachable {
            endpoints: endpoints.clone(),
            reason,
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
            advertise,
            client,
            election: format!("{}/leader", config.prefix.trim_end_matches('/')),
            ttl,
            lease: Mutex::new(LeaseClock::new(ttl)),
        })
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Whether the lease is surely alive now.
    pub fn lease_alive(&self, now: Instant) -> bool {
        self.lease.lock().is_ok_and(|l| l.alive(now))
    }

    fn renewed(&self, sent: Instant, ttl_left_s: i64) -> Renewal {
        match self.lease.lock() {
            Ok(mut l) => l.renewed(sent, ttl_left_s),
            Err(_) => Renewal::Expired,
        }
    }

    fn renew_every(&self) -> Duration {
        self.lease
            .lock()
            .map(|l| l.renew_every())
            .unwrap_or(Duration::from_millis(500))
    }
}

/// Campaigns; once elected, leads ([`crate::lead`]). Steps down when the
/// lease or etcd is lost.
pub async fn run(shared: Arc<Shared>, ha: Arc<Ha>) {
    let mut client = ha.client();
    let sent = Instant::now();
    let grant = client.lease_grant(ha.ttl.as_secs() as i64, None);
    let lease = match within(CONNECT_TIMEOUT, grant).await {
        Ok(grant) => {
            ha.renewed(sent, grant.ttl());
            grant.id()
        }
        Err(e) => return step_down(&shared, format!("etcd granted no lease: {e}")),
    };
    tokio::spawn(keep_lease(shared.clone(), ha.clone(), lease));
    tokio::spawn(observe_leader(shared.clone(), ha.clone()));
    tokio::spawn(crate::state::restore::keep_warm(shared.clone()));
    tracing::info!(advertise = %ha.advertise, "standing by: campaigning for the lead in etcd");
    let campaign = client.campaign(ha.election.clone(), ha.advertise.clone(), lease);
    let elected = tokio::select! {
        elected = campaign => elected,
        _ = shared.closed() => return,
    };
    let key = match elected {
        Ok(mut answer) => answer.take_leader(),
        Err(e) => return step_down(&shared, format!("etcd: the campaign failed: {e}")),
    };
    let Some(key) = key else {
        return step_down(&shared, "etcd answered the campaign without a key".into());
    };
    let epoch = key.rev() as u64;
    tracing::info!(epoch, "elected: restoring the kept state from etcd");
    let fence = crate::state::Fence {
        key: key.key().to_vec(),
        epoch,
    };
    if let Err(e) = shared.state.lead(fence).await {
        return step_down(&shared, format!("the kept state cannot be read: {e}"));
    }
    // Restored before it says it leads: the workers that register then
    // find their deployments to be adopted.
    crate::lead(&shared).await;
    shared.leader.send_replace(LeaderView {
        leading: true,
        leader: Some(ha.advertise.clone()),
        epoch,
    });
    tracing::info!(epoch, advertise = %ha.advertise, "leading the cluster");
    let mut fenced = shared.state.fenced();
    tokio::spawn({
        let shared = shared.clone();
        async move {
            if fenced.wait_for(|f| *f).await.is_ok() {
                step_down(
                    &shared,
                    "etcd refused a write: another coordinator leads".into(),
                );
            }
        }
    });
}

/// Renews the lease every third of its time to live; steps down when etcd
/// says it expired, or when it could not be renewed in time.
async fn keep_lease(shared: Arc<Shared>, ha: Arc<Ha>, lease: i64) {
    let mut client = ha.client();
    let mut channel = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(ha.renew_every()) => {}
            _ = shared.closed() => return,
        }
        if !ha.lease_alive(Instant::now()) {
            return step_down(
                &shared,
                "the etcd lease ran out before it was renewed".into(),
            );
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
                if ha.renewed(sent, answer.ttl()) == Renewal::Expired {
                    return step_down(&shared, "etcd says the lease expired".into());
                }
            }
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => channel = None,
        }
    }
}

/// While standing by: who leads, from etcd's election (a watch).
async fn observe_leader(shared: Arc<Shared>, ha: Arc<Ha>) {
    let mut client = ha.client();
    loop {
        if let Ok(mut stream) = client.observe(ha.election.clone()).await {
            while let Ok(Some(answer)) = stream.message().await {
                let Some(kv) = answer.kv() else { continue };
                let leader = String::from_utf8_lossy(kv.value()).into_owned();
                let epoch = kv.create_revision() as u64;
                if leader == ha.advertise {
                    // Elected: it says so itself once it has restored.
                    continue;
                }
                shared.leader.send_if_modified(|view| {
                    let changed = !view.leading && view.leader.as_deref() != Some(&leader);
                    if changed {
                        tracing::info!(%leader, epoch, "the cluster's leader");
                        view.leader = Some(leader.clone());
                        view.epoch = epoch;
                    }
                    changed
                });
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
