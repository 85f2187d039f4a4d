//! `tessera soak`: a steady load of concurrent requests against a cluster
//! while its machines fail, every answer checked against expected outputs
//! (onnxruntime's, on the same inputs). It counts requests sent, succeeded
//! (and numerically right), failed with an error, wrong, and lost (no
//! answer at all within the deadline and a grace period). Requests never
//! pass through the coordinator, so they go on while it is away; when it
//! comes back without the network (a restarted coordinator forgets what
//! clients loaded), the soak connects again and reloads it, as a client
//! of a restarted coordinator must.
//!
//! ```text
//! tessera soak rec.onnx --spread node-a,node-b,node-c --make-cases 4 --cases cases
//! python3 tests/python/ort_run.py rec.onnx cases/expected x=cases/case0_x.npy -- x=cases/case1_x.npy ...
//! tessera soak rec.onnx --spread node-a,node-b,node-c --cases cases --seconds 60 --events events.jsonl
//! ```

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Args;
use tessera_client::{ClientError, LoadOptions, Network};
use tessera_common::graph::Graph;
use tessera_common::onnx;
use tessera_common::tensor::Tensor;
use tessera_common::tensor::{read_npy, write_npy};
use tokio::sync::{watch, Mutex};

use crate::cluster_cmds::ModelArgs;
use crate::remote::{connect, with_client, RemoteArgs};

#[derive(Args)]
pub struct SoakArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Pin the model's nodes to these workers in contiguous chunks of its
    /// topological order (e.g. node-a,node-b,node-c), so that every worker
    /// holds a stage.
    #[arg(long, value_delimiter = ',')]
    spread: Vec<String>,
    /// Cases: inputs `case<K>_<input>.npy`, expected outputs
    /// `expected/out<I>.npy` (case 0) and `expected/run<K>_out<I>.npy`, as
    /// `tests/python/ort_run.py` writes them.
    #[arg(long)]
    cases: PathBuf,
    /// Write this many seeded input cases to --cases and exit.
    #[arg(long)]
    make_cases: Option<usize>,
    /// Requests in flight.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// How long to keep the load up.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Largest allowed absolute difference from the expected outputs.
    #[arg(long, default_value_t = 1e-4)]
    tolerance: f32,
    /// Each request's outcome as a JSON line (unix time in ms, case,
    /// generation (reloads so far), outcome, deployment, attempts, latency,
    /// error).
    #[arg(long)]
    events: Option<PathBuf>,
    /// How long to keep trying to reconnect and reload after the
    /// coordinator went away.
    #[arg(long, default_value_t = 60)]
    reconnect_seconds: u64,
}

/// One input case and what onnxruntime answered.
struct Case {
    inputs: Vec<(String, Tensor)>,
    expected: Vec<Tensor>,
}

#[derive(Default)]
struct Tally {
    sent: u64,
    succeeded: u64,
    failed: u64,
    wrong: u64,
    lost: u64,
    retried: u64,
    reloads: u64,
    first_errors: Vec<String>,
}

/// Everything the load lanes share.
struct Soak {
    /// The network in use with its generation (bumped at each reload);
    /// `None` while reloading.
    current: watch::Sender<Option<(u64, Network)>>,
    tally: Mutex<Tally>,
    events: Option<std::sync::Mutex<std::fs::File>>,
    cases: Vec<Case>,
    remote: RemoteArgs,
    bytes: bytes::Bytes,
    options: LoadOptions,
    deadline: Duration,
    reconnect: Duration,
    tolerance: f32,
    reloading: Mutex<()>,
}

pub fn soak(args: SoakArgs) -> Result<()> {
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    let (bytes, mut options) = args.model.read_to_load()?;
    let graph = Graph::from_model(onnx::decode_model(&bytes)?)?;
    if let Some(n) = args.make_cases {
        return make_cases(&graph, &args.cases, n);
    }
    let cases = read_cases(&graph, &args.cases)?;
    if !args.spread.is_empty() {
        options.affinity = spread(&graph, &args.spread);
    }
    let events = match &args.events {
        Some(path) => Some(std::sync::Mutex::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot write {}", path.display()))?,
        )),
        None => None,
    };
    let remote = args.model.remote.clone();
    tessera_cli::cluster::run_system(async move {
        with_client(&remote.clone(), async |client| {
            let deadline = Duration::from_millis(remote.deadline_ms.unwrap_or(30_000));
            let network = client
                .load_network(bytes.clone(), options.clone())
                .await?
                .with_deadline(deadline);
            crate::print_stdout(&format!(
                "soak: {} subgraphs on {}; {} requests in flight for {} s\n",
                network.plan().subgraphs.len(),
                network.plan().hosts.join(", "),
                args.concurrency,
                args.seconds
            ));
            let soak = Arc::new(Soak {
                current: watch::Sender::new(Some((0, network))),
                tally: Mutex::new(Tally::default()),
                events,
                cases,
                remote,
                bytes,
                options,
                deadline,
                reconnect: Duration::from_secs(args.reconnect_seconds),
                tolerance: args.tolerance,
                reloading: Mutex::new(()),
            });
            let end = Instant::now() + Duration::from_secs(args.seconds);
            let lanes: Vec<_> = (0..args.concurrency)
                .map(|lane| tokio::spawn(soak.clone().lane(lane, args.concurrency, end)))
                .collect();
            for lane in lanes {
                lane.await.context("a load lane panicked")?;
            }
            let t = soak.tally.lock().await;
            crate::print_stdout(&format!(
                "requests sent {} / succeeded {} / failed with a clear error {} / lost {} / wrong {} \
                 (retried after a worker loss: {}; reloads after losing the coordinator: {})\n",
                t.sent, t.succeeded, t.failed, t.lost, t.wrong, t.retried, t.reloads
            ));
            for e in &t.first_errors {
                crate::print_stdout(&format!("  error: {e}\n"));
            }
            if t.lost > 0 || t.wrong > 0 || t.succeeded == 0 {
                bail!(
                    "{} lost and {} wrong of {} requests sent ({} succeeded)",
                    t.lost,
                    t.wrong,
                    t.sent,
                    t.succeeded
                );
            }
            Ok(())
        })
        .await
    })
}

impl Soak {
    /// One request after another until `end`; lane `lane` of `lanes` takes
    /// cases `lane, lane + lanes, ...`.
    async fn lane(self: Arc<Self>, lane: usize, lanes: usize, end: Instant) {
        let mut k = lane;
        while Instant::now() < end {
            let mut rx = self.current.subscribe();
            let current = rx.borrow_and_update().clone();
            let Some((generation, network)) = current else {
                // Reloading: wait for the new network (or give up).
                if tokio::time::timeout(self.reconnect, rx.changed())
                    .await
                    .is_err()
                {
                    return;
                }
                continue;
            };
            let case = k % self.cases.len();
            k += lanes;
            self.tally.lock().await.sent += 1;
            let started = Instant::now();
            // The coordinator answers by the deadline; beyond it plus a
            // grace period the request counts as lost.
            let answer = tokio::time::timeout(
                self.deadline + Duration::from_secs(10),
                network.infer(self.cases[case].inputs.clone()),
            )
            .await;
            let latency = started.elapsed();
            let (outcome, deployment, attempts, error) = match answer {
                Err(_) => {
                    self.tally.lock().await.lost += 1;
                    ("lost", 0, 0, "no answer".to_string())
                }
                Ok(Ok(out)) => {
                    let want = &self.cases[case].expected;
                    let diff = out
                        .tensors
                        .iter()
                        .zip(want)
                        .map(|((_, got), want)| max_abs_diff(got, want))
                        .fold(0.0f32, f32::max);
                    let mut t = self.tally.lock().await;
                    if out.attempts > 1 {
                        t.retried += 1;
                    }
                    if diff <= self.tolerance && out.tensors.len() == want.len() {
                        t.succeeded += 1;
                        ("ok", out.deployment, out.attempts, String::new())
                    } else {
                        t.wrong += 1;
                        let e = format!("max abs diff {diff}");
                        ("wrong", out.deployment, out.attempts, e)
                    }
                }
                Ok(Err(e)) => {
                    {
                        let mut t = self.tally.lock().await;
                        t.failed += 1;
                        if t.first_errors.len() < 5 {
                            t.first_errors.push(e.to_string());
                        }
                    }
                    // The coordinator went away, or came back without
                    // this network (a restarted one forgets what clients
                    // loaded): load it again.
                    let forgotten = connection_lost(&e) || network.gone().is_some();
                    if forgotten && self.remote.coordinator.is_some() {
                        self.reload(generation).await;
                    }
                    ("failed", 0, 0, e.to_string())
                }
            };
            if let Some(file) = &self.events {
                let line = serde_json::json!({
                    "unix_ms": unix_ms(),
                    "case": case,
                    "generation": generation,
                    "outcome": outcome,
                    "deployment": deployment,
                    "attempts": attempts,
                    "latency_ms": latency.as_secs_f64() * 1e3,
                    "error": error,
                });
                if let Ok(mut f) = file.lock() {
                    let _ = writeln!(f, "{line}");
                }
            }
        }
    }

    /// The coordinator went away under network `generation`: connect
    /// again and reload (once for all lanes), trying until `reconnect`
    /// passes.
    async fn reload(&self, generation: u64) {
        let _one = self.reloading.lock().await;
        if !matches!(&*self.current.borrow(), Some((g, _)) if *g == generation) {
            return; // Another lane reloaded already.
        }
        self.current.send_replace(None);
        let give_up = Instant::now() + self.reconnect;
        let mut last = String::new();
        while Instant::now() < give_up {
            let attempt = async {
                let (client, _) = connect(&self.remote).await?;
                let network = client
                    .load_network(self.bytes.clone(), self.options.clone())
                    .await?;
                anyhow::Ok(network.with_deadline(self.deadline))
            };
            match attempt.await {
                Ok(network) => {
                    tracing::info!("reloaded on the coordinator as network {}", network.id());
                    self.tally.lock().await.reloads += 1;
                    self.current.send_replace(Some((generation + 1, network)));
                    return;
                }
                Err(e) => last = tessera_cli::error_line(&e),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tracing::error!("could not reload within {:?}: {last}", self.reconnect);
    }
}

/// Whether `e` means the coordinator is gone.
fn connection_lost(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Connection(_) | ClientError::Transport(_) | ClientError::Connect(_)
    )
}

/// Pins the graph's op nodes to `hosts` in contiguous chunks of its
/// topological order.
fn spread(graph: &Graph, hosts: &[String]) -> Vec<(String, String)> {
    let ops = graph.topo_ops();
    let per = ops.len().div_ceil(hosts.len()).max(1);
    ops.iter()
        .enumerate()
        .map(|(i, &op)| {
            let host = &hosts[(i / per).min(hosts.len() - 1)];
            (graph.node(op).name.clone(), format!("{host}/CPU"))
        })
        .collect()
}

fn make_cases(graph: &Graph, dir: &Path, n: usize) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for k in 0..n {
        let inputs = tessera_common::synth::random_inputs(graph, 1000 + k as u64)
            .context("an input has an unknown or non-numeric type")?;
        for (name, t) in inputs {
            let path = dir.join(format!("case{k}_{}.npy", file_safe(&name)));
            std::fs::write(&path, write_npy(&t)?)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    crate::print_stdout(&format!("{n} cases in {}\n", dir.display()));
    Ok(())
}

fn read_cases(graph: &Graph, dir: &Path) -> Result<Vec<Case>> {
    let (inputs, outputs) = tessera_common::plan::io_names(graph);
    let read = |path: PathBuf| -> Result<Tensor> {
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        read_npy(&bytes).with_context(|| format!("{}", path.display()))
    };
    let mut cases = Vec::new();
    for k in 0.. {
        let first = dir.join(format!("case{k}_{}.npy", file_safe(&inputs[0])));
        if !first.exists() {
            break;
        }
        let prefix = if k == 0 {
            String::new()
        } else {
            format!("run{k}_")
        };
        cases.push(Case {
            inputs: inputs
                .iter()
                .map(|name| {
                    Ok((
                        name.clone(),
                        read(dir.join(format!("case{k}_{}.npy", file_safe(name))))?,
                    ))
                })
                .collect::<Result<_>>()?,
            expected: (0..outputs.len())
                .map(|i| read(dir.join("expected").join(format!("{prefix}out{i}.npy"))))
                .collect::<Result<_>>()?,
        });
    }
    if cases.is_empty() {
        bail!(
            "no cases in {} (make them with --make-cases N, then expected outputs with tests/python/ort_run.py)",
            dir.display()
        );
    }
    Ok(cases)
}

fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    if a.shape() != b.shape() {
        return f32::INFINITY;
    }
    match (a.to_vec::<f32>(), b.to_vec::<f32>()) {
        (Ok(a), Ok(b)) => a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max),
        _ => f32::INFINITY,
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
