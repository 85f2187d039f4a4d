//! Routing tables: what the coordinator publishes of each loaded network so
//! that requesters (the SDK, front doors) send its requests straight to
//! its workers. A table lists the network's copies, each copy's state and
//! deployment (its workers and their data addresses, which worker reads
//! each input and makes each output), its predicted latency and the load
//! its workers reported in their last heartbeats. Its version grows with
//! every change; each subscriber (a `Routes` stream) gets the table at
//! once and again at every change, until the network goes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tessera_common::wire::client::ClientReply;
use tessera_common::wire::control::ErrorKind;
use tessera_common::wire::routes::{
    CopyLoad, CopyRoute, CopyState, DeploymentRoute, GenerationLimits, HostRoute, RoutingTable,
    Signature,
};
use tessera_net::exchange;
use tokio::sync::watch;

use crate::network::{Current, Deployed, Loaded};
use crate::Shared;

/// How often a subscription looks at the workers' reported load.
const LOAD_EVERY: Duration = Duration::from_millis(500);

/// `loaded`'s table now, its version bumped if it changed since it was
/// last published.
pub fn publish(shared: &Shared, loaded: &Loaded, name: &str) -> Arc<RoutingTable> {
    let table = build(shared, loaded, name);
    let mut last = loaded.published.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(previous) = last.as_ref() {
        let mut same = table.clone();
        same.version = previous.version;
        if same == **previous {
            return previous.clone();
        }
    }
    let version = last.as_ref().map_or(1, |p| p.version + 1);
    let table = Arc::new(RoutingTable { version, ..table });
    *last = Some(table.clone());
    table
}

fn build(shared: &Shared, loaded: &Loaded, name: &str) -> RoutingTable {
    let reported = reported_loads(shared);
    let copies = loaded
        .replicas
        .iter()
        .map(|r| {
            let (state, deployed) = match r.current() {
                Current::Ready(d) => (CopyState::Ready, Some(d)),
                Current::Healing(d) => (CopyState::Healing, d),
                Current::Broken(why) => (CopyState::Broken(why), None),
            };
            let load = deployed
                .as_ref()
                .and_then(|d| reported.get(&d.id).copied())
                .unwrap_or_default();
            CopyRoute {
                index: r.index as u32,
                state,
                deployment: deployed.as_deref().map(route_of),
                load,
                retiring: r.retiring(),
            }
        })
        .collect();
    let generation = loaded.generator.as_ref().map(|g| GenerationLimits {
        state: g.state.clone(),
        max_sequences: g.spec.max_sequences,
        max_queued: g.spec.max_queued,
        queue_timeout_ms: g.spec.queue_timeout_ms,
        context_length: g.spec.context_length,
    });
    RoutingTable {
        network: loaded.id,
        name: name.to_string(),
        version: 0,
        signature: Signature::of(&loaded.graph),
        copies,
        generation,
        embedding: loaded.embedder.as_ref().map(|e| e.limits()),
        loss_grace_ms: shared.config.worker_timeout_ms + shared.config.heartbeat_ms,
    }
}

fn route_of(d: &Deployed) -> DeploymentRoute {
    DeploymentRoute {
        id: d.id,
        hosts: d
            .addrs
            .iter()
            .map(|(name, addr)| HostRoute {
                name: name.clone(),
                data_addr: addr.clone(),
            })
            .collect(),
        inputs: d.input_routes.clone(),
        outputs: d.output_makers.clone(),
        triggers: d.trigger_hosts.clone(),
        state_triggers: d.state_trigger_hosts.clone(),
        state_outputs: d.state_outputs.clone(),
        predicted_latency_us: d.predicted_latency_us.round(),
    }
}

/// Each deployment's load, summed over the workers that reported it.
pub(crate) fn reported_loads(shared: &Shared) -> HashMap<u64, CopyLoad> {
    let mut loads: HashMap<u64, CopyLoad> = HashMap::new();
    for worker in shared.workers.iter() {
        let reported = worker.reported();
        for s in &reported.subgraphs {
            let load = loads.entry(s.network).or_default();
            load.queued = load.queued.max(s.depth);
            let rate = reported.rate(s.network, s.subgraph);
            load.rate = load.rate.max(rate);
        }
        for s in &reported.sequences {
            let load = loads.entry(s.network).or_default();
            load.sequences = load.sequences.max(s.kept);
            load.waiting = load.waiting.max(s.waiting);
        }
    }
    loads
}

/// What a subscription follows: a network, or whichever serves a named
/// model.
enum Followed {
    Loaded(Arc<Loaded>, String),
    Gone(ClientReply),
}

fn follow(shared: &Shared, network: u64, model: Option<&str>) -> Followed {
    let id = match model {
        Some(name) => match shared.repository.get(name) {
            Some(entry) => match entry.network() {
                Some(id) => id,
                None => {
                    let status = crate::repository::status(shared, &entry);
                    let mut why = format!(
                        "model '{name}' is not loaded ({})",
                        status.state.as_str().to_lowercase()
                    );
                    if !status.reason.is_empty() {
                        why = format!("{why}: {}", status.reason);
                    }
                    return Followed::Gone(ClientReply::failure(ErrorKind::Unavailable, why));
                }
            },
            None => {
                return Followed::Gone(ClientReply::failure(
                    ErrorKind::NotFound,
                    format!("no model named '{name}' in the repository"),
                ))
            }
        },
        None => network,
    };
    match shared.networks.get(&id) {
        Some(loaded) => {
            let name = model.map_or_else(|| loaded.name.clone(), str::to_string);
            Followed::Loaded(loaded.clone(), name)
        }
        None => Followed::Gone(ClientReply::Unloaded { network: id }),
    }
}

/// Serves a `Routes` subscription on `send`: the table now, then every
/// change, until the network goes or the subscriber drops the stream.
pub async fn subscription(
    shared: Arc<Shared>,
    network: u64,
    model: Option<String>,
    mut send: quinn::SendStream,
) {
    let limits = *shared.node.limits();
    let stopped = send.stopped();
    tokio::pin!(stopped);
    let mut sent = (0u64, 0u64);
    loop {
        let mut watching: Vec<watch::Receiver<Current>>;
        match follow(&shared, network, model.as_deref()) {
            Followed::Loaded(loaded, name) => {
                let table = publish(&shared, &loaded, &name);
                if (table.network, table.version) != sent {
                    sent = (table.network, table.version);
                    let msg = ClientReply::Routes(Box::new((*table).clone()));
                    if exchange::send_message(&mut send, &msg, None, &limits)
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                watching = loaded
                    .replicas
                    .iter()
                    .map(|r| r.current.subscribe())
                    .collect();
            }
            Followed::Gone(last) => {
                let _ = exchange::send_message(&mut send, &last, None, &limits).await;
                let _ = send.finish();
                return;
            }
        }
        let changed = async {
            if watching.is_empty() {
                return std::future::pending::<()>().await;
            }
            let changes = watching.iter_mut().map(|rx| Box::pin(rx.changed()));
            let _ = futures_util::future::select_all(changes).await;
        };
        tokio::select! {
            () = changed => {}
            () = tokio::time::sleep(LOAD_EVERY) => {}
            () = shared.closed() => return,
            _ = &mut stopped => return,
        }
    }
}
