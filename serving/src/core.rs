//! The KServe core, protocol-neutral: what the HTTP and gRPC codecs (and
//! the OpenAI endpoints) share. Named models are reached through their
//! routing tables (a subscription per model, kept while it serves);
//! metadata, readiness and the repository index come from the tables and
//! the coordinator (the last answer kept while the coordinator is away);
//! inference runs through the requester, straight on the workers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_client::embed::{Batch, EmbedInput, Embeddings, Truncate};
use tessera_client::generate::{GenerateParams, Generation, Prompt};
use tessera_client::{Network, Outputs};
use tessera_common::tensor::Tensor;
use tessera_common::wire::control::{ModelState, ModelStatus};
use tessera_common::wire::routes::{CopyState, RoutingTable};

use crate::rules::NotReady;
use crate::{Door, ServeError};

/// The one version of every model.
pub const VERSION: &str = "1";
/// The platform models report (an ONNX model, as Triton names it).
pub const PLATFORM: &str = "onnx_onnxv1";

/// What a model served through the OpenAI endpoints does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    Generate,
    Embed,
}

impl Task {
    pub fn as_str(self) -> &'static str {
        match self {
            Task::Generate => "generate",
            Task::Embed => "embed",
        }
    }
}

/// A model as `GET /v1/models` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenAiModel {
    pub name: String,
    pub task: Task,
    /// Positions (tokens) one request may hold.
    pub max_model_len: u32,
}

/// The cluster as the front door last saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub workers: usize,
    pub models: Vec<ModelStatus>,
}

/// How often the front door looks at the cluster (for readiness).
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How long a control call to the coordinator may take before the front
/// door answers from what it saw last.
const CONTROL_WAIT: Duration = Duration::from_secs(2);

/// Keeps `Door::seen` fresh until the front door closes.
pub async fn watch_cluster(door: Arc<Door>) {
    loop {
        if let Ok(seen) = door.look().await {
            door.sample_live(&seen.models).await;
        }
        tokio::select! {
            () = tokio::time::sleep(LOOK_EVERY) => {}
            () = door.closed() => return,
        }
    }
}

/// Requests (and answers) bigger than this are decoded (encoded) on a
/// blocking thread: JSON or typed contents of a few MB take tens of
/// milliseconds. The same for HTTP and gRPC.
pub const OFF_ASYNC_BYTES: usize = 64 << 10;

/// A load request's parameter, as either codec reads it.
pub enum LoadParam<'a> {
    Text(&'a str),
    /// Anything but a string.
    Other,
}

/// The `config` parameter of a load request, if any: the model's
/// settings as JSON text. Model files sent in the request (`file:...`)
/// are refused.
pub fn load_config<'a>(
    params: impl IntoIterator<Item = (&'a str, LoadParam<'a>)>,
) -> Result<Option<String>, ServeError> {
    let mut config = None;
    for (key, value) in params {
        if key.starts_with("file:") {
            return Err(ServeError::BadRequest(format!(
                "'{key}': model files in the request are not supported; put the model in the server's model repository"
            )));
        }
        if key == "config" {
            config = match value {
                LoadParam::Text(text) => Some(text.to_string()),
                LoadParam::Other => {
                    return Err(ServeError::BadRequest(
                        "parameters.config must be a string (the model's settings as JSON)".into(),
                    ))
                }
            };
        }
    }
    Ok(config)
}

/// An asked output's parameters: extensions not served (classification)
/// are refused.
pub fn check_output<'a>(
    output: &str,
    parameters: impl IntoIterator<Item = &'a str>,
) -> Result<(), ServeError> {
    match parameters.into_iter().any(|k| k == "classification") {
        true => Err(ServeError::BadRequest(format!(
            "output '{output}': the classification extension is not supported"
        ))),
        false => Ok(()),
    }
}

/// Only version `1` (or none) exists.
pub fn check_version(name: &str, version: Option<&str>) -> Result<(), ServeError> {
    match version {
        None | Some("") | Some(VERSION) => Ok(()),
        Some(v) => Err(ServeError::NotFound(format!(
            "model {name} has no version '{v}' (its one version is {VERSION})"
        ))),
    }
}

impl Door {
    /// Asks the coordinator for the cluster now (workers, models).
    async fn look(&self) -> Result<Seen, ServeError> {
        let asked = async {
            let cluster = self.client.cluster().await?;
            let models = self.client.models().await?;
            Ok::<_, ServeError>((cluster.workers.len(), models))
        };
        let (workers, models) = tokio::time::timeout(CONTROL_WAIT, asked)
            .await
            .map_err(|_| ServeError::Unavailable("the coordinator does not answer".into()))??;
        let seen = Seen {
            at: Instant::now(),
            workers,
            models,
        };
        if let Ok(mut last) = self.seen.lock() {
            *last = Some(seen.clone());
        }
        Ok(seen)
    }

    /// The cluster now, else as last seen.
    async fn seen(&self) -> Result<Seen, ServeError> {
        match self.look().await {
            Ok(seen) => Ok(seen),
            Err(e) => self.seen.lock().ok().and_then(|s| s.clone()).ok_or(e),
        }
    }

    /// The network serving named model `name`, following its routing
    /// table (kept while it serves).
    pub async fn network(&self, name: &str) -> Result<Network, ServeError> {
        if let Some(n) = self.networks.get(name).map(|n| n.clone()) {
            if n.gone().is_none() {
                return Ok(n);
            }
            self.networks.remove(name);
        }
        let network = self.client.serving(name).await?;
        self.networks.insert(name.to_string(), network.clone());
        Ok(network)
    }

    /// Model `name`'s routing table: its signature, copies and, for a
    /// generative model, its limits.
    pub async fn table(&self, name: &str) -> Result<Arc<RoutingTable>, ServeError> {
        self.network(name)
            .await?
            .routes()
            .ok_or_else(|| ServeError::Unavailable(format!("model {name} has no routes")))
    }

    /// Whether the server is ready: a worker registered and every wanted
    /// model deployed (as last seen while the coordinator is away).
    pub async fn ready(&self) -> Result<(), NotReady> {
        let seen = self
            .seen()
            .await
            .map_err(|e| NotReady::NoCoordinator(e.to_string()))?;
        if seen.workers == 0 {
            return Err(NotReady::NoWorker);
        }
        let waiting: Vec<(String, ModelState)> = seen
            .models
            .into_iter()
            .filter(|s| !matches!(s.state, ModelState::Ready | ModelState::Unloaded))
            .map(|s| (s.name, s.state))
            .collect();
        match waiting.is_empty() {
            true => Ok(()),
            false => Err(NotReady::Deploying(waiting)),
        }
    }

    /// Whether model `name` serves: a copy of it is ready.
    pub async fn model_ready(&self, name: &str) -> Result<(), ServeError> {
        let status = self
            .index()
            .await?
            .into_iter()
            .find(|s| s.name == name)
            .ok_or_else(|| {
                ServeError::NotFound(format!("no model named '{name}' in the repository"))
            })?;
        if status.state == ModelState::Ready {
            return Ok(());
        }
        let mut why = format!("model {name} is {}", status.state.as_str().to_lowercase());
        if !status.reason.is_empty() {
            why = format!("{why}: {}", status.reason);
        }
        Err(ServeError::Unavailable(why))
    }

    /// Every named model and its state.
    pub async fn index(&self) -> Result<Vec<ModelStatus>, ServeError> {
        Ok(self.seen().await?.models)
    }

    /// Runs `inputs` on model `name`, within `deadline` (the front door's
    /// unless given); answers the outputs `wanted` (every output when
    /// none is named), in the order asked, each once.
    pub async fn infer(
        &self,
        name: &str,
        inputs: HashMap<String, Tensor>,
        wanted: &[String],
        deadline: Option<Duration>,
    ) -> Result<Vec<(String, Tensor)>, ServeError> {
        let started = Instant::now();
        let network = self.network(name).await?;
        let result = self
            .infer_named(name, &network, inputs, wanted, deadline)
            .await;
        match &result {
            Ok(_) => self.live_served(name, started.elapsed()),
            Err(_) => self.live_failed(name),
        }
        result
    }

    async fn infer_named(
        &self,
        name: &str,
        network: &Network,
        inputs: HashMap<String, Tensor>,
        wanted: &[String],
        deadline: Option<Duration>,
    ) -> Result<Vec<(String, Tensor)>, ServeError> {
        let table = network.routes();
        if let Some(unknown) = wanted.iter().find(|w| {
            table
                .as_ref()
                .is_some_and(|t| !t.signature.outputs.iter().any(|o| o.name == **w))
        }) {
            self.metrics.failed(name, "bad_input");
            return Err(ServeError::BadRequest(format!(
                "model {name} has no output '{unknown}'"
            )));
        }
        if let Some(twice) = wanted
            .iter()
            .enumerate()
            .find(|(i, w)| wanted[..*i].contains(w))
        {
            self.metrics.failed(name, "bad_input");
            return Err(ServeError::BadRequest(format!(
                "output '{}' is asked for twice",
                twice.1
            )));
        }
        let _in_flight = self.metrics.started(name);
        let started = Instant::now();
        let network = network
            .clone()
            .with_deadline(deadline.unwrap_or(self.limits.request_deadline));
        let outputs: Outputs = match network.infer(inputs.into_iter().collect()).await {
            Ok(o) => o,
            Err(e) => {
                let e = ServeError::from(e);
                self.metrics.failed(name, e.kind().as_str());
                return Err(e);
            }
        };
        self.metrics
            .succeeded(name, started.elapsed(), &outputs.counters);
        let mut all: HashMap<String, Tensor> = outputs.tensors.into_iter().collect();
        let order: Vec<String> = match wanted.is_empty() {
            true => table.map_or_else(Vec::new, |t| {
                t.signature.outputs.iter().map(|o| o.name.clone()).collect()
            }),
            false => wanted.to_vec(),
        };
        Ok(order
            .into_iter()
            .filter_map(|n| all.remove(&n).map(|t| (n, t)))
            .collect())
    }

    /// Starts a generation on model `name`.
    pub async fn generate(
        &self,
        name: &str,
        prompt: Prompt,
        params: GenerateParams,
    ) -> Result<Generation, ServeError> {
        let network = self.network(name).await?;
        Ok(network.generate(prompt, params).await?)
    }

    /// The named models that serve now (ready, with a ready copy), each
    /// with its routing table.
    async fn serving_tables(&self) -> Result<Vec<(String, Arc<RoutingTable>)>, ServeError> {
        let mut serving = Vec::new();
        for m in self.index().await? {
            if m.state != ModelState::Ready {
                continue;
            }
            if let Ok(table) = self.table(&m.name).await {
                if table.copies.iter().any(|c| c.state == CopyState::Ready) {
                    serving.push((m.name, table));
                }
            }
        }
        Ok(serving)
    }

    /// The named models the OpenAI endpoints serve now: those that
    /// generate (with their context in positions) and those that embed
    /// (with the tokens an input may have).
    pub async fn openai_models(&self) -> Vec<OpenAiModel> {
        let Ok(tables) = self.serving_tables().await else {
            return Vec::new();
        };
        tables
            .into_iter()
            .filter_map(|(name, table)| {
                let (task, max_model_len) = match (&table.generation, &table.embedding) {
                    (Some(g), _) => (Task::Generate, g.context_length),
                    (None, Some(e)) => (Task::Embed, e.max_length),
                    (None, None) => return None,
                };
                Some(OpenAiModel {
                    name,
                    task,
                    max_model_len,
                })
            })
            .collect()
    }

    /// The inputs' vectors from embedding model `name`, run like any
    /// request (its metrics, batching and retries).
    pub async fn embed(
        &self,
        name: &str,
        inputs: &[EmbedInput],
        truncate: Truncate,
    ) -> Result<Embeddings, ServeError> {
        let network = self.network(name).await?;
        let embedder = network.embedder().await?;
        let table = self.table(name).await?;
        let Batch {
            inputs,
            mask,
            tokens,
        } = embedder.batch(inputs, truncate, &table.signature)?;
        let wanted = [embedder.spec.output.clone()];
        let outputs = self
            .infer(name, inputs.into_iter().collect(), &wanted, None)
            .await?;
        let (_, hidden) = outputs
            .into_iter()
            .next()
            .ok_or_else(|| ServeError::Unavailable("no token vectors came back".into()))?;
        Ok(Embeddings {
            vectors: embedder.pooled(&mask, &hidden)?,
            tokens,
        })
    }

    /// Whether this front door can serve: how many models it can, else
    /// why none.
    pub async fn health(&self) -> Result<usize, String> {
        let tables = self.serving_tables().await.map_err(|e| e.to_string())?;
        if !tables.is_empty() {
            return Ok(tables.len());
        }
        let index = self.index().await.map_err(|e| e.to_string())?;
        let why: Vec<String> = index
            .iter()
            .filter(|m| m.state != ModelState::Unloaded)
            .map(|m| {
                let mut why = format!("{} is {}", m.name, m.state.as_str().to_lowercase());
                if !m.reason.is_empty() {
                    why = format!("{why} ({})", m.reason);
                }
                why
            })
            .collect();
        Err(match why.is_empty() {
            true => "no model is loaded".to_string(),
            false => format!("no model serves: {}", why.join("; ")),
        })
    }

    /// The token ids generative model `name` is fed for `prompt` (special
    /// tokens as `special` says; `None`: as when it generates), and its
    /// context in positions.
    pub async fn tokenize(
        &self,
        name: &str,
        prompt: &Prompt,
        special: Option<bool>,
    ) -> Result<(Vec<u32>, u32), ServeError> {
        let network = self.network(name).await?;
        Ok(network.tokenize(prompt, special).await?)
    }

    /// The text of token ids of generative model `name`.
    pub async fn detokenize(&self, name: &str, ids: &[u32]) -> Result<String, ServeError> {
        let network = self.network(name).await?;
        Ok(network.detokenize(ids).await?)
    }

    /// Forgets model `name`'s network (it was loaded again or unloaded).
    pub fn forget(&self, name: &str) {
        self.networks.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_load_config_rule_for_both_codecs() {
        let none: [(&str, LoadParam); 0] = [];
        assert_eq!(load_config(none).unwrap(), None);
        let given = [("config", LoadParam::Text("{\"devices\": \"CPU\"}"))];
        assert_eq!(
            load_config(given).unwrap().as_deref(),
            Some("{\"devices\": \"CPU\"}")
        );
        let e = load_config([("config", LoadParam::Other)]).unwrap_err();
        assert!(e.to_string().contains("must be a string"), "{e}");
        let e = load_config([("file:1/model.onnx", LoadParam::Other)]).unwrap_err();
        assert!(e.to_string().contains("model files in the request"), "{e}");
        assert_eq!(e.kind(), tessera_common::wire::control::ErrorKind::BadInput);
    }

    #[test]
    fn the_classification_extension_is_refused_by_name() {
        assert!(check_output("y", ["binary_data"]).is_ok());
        let e = check_output("y", ["binary_data", "classification"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "output 'y': the classification extension is not supported"
        );
    }
}
