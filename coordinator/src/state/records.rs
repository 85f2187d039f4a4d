//! What the state store keeps, as JSON values: a loaded network with its
//! copies' deployments, and a named model's entry.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tessera_common::dump::PlanReport;
use tessera_common::graph::Graph;
use tessera_common::onnx::bones::Bones;
use tessera_common::plan::ReportedType;
use tessera_common::schedule::Considered;
use tessera_common::wire::control::LoadRequest;
use tessera_common::wire::pieces::PieceRef;

use crate::network::{Deployed, Loaded, Origin, Placement, SubgraphModel};
use crate::repository::Source;

/// Where a model's bytes are kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ModelRef {
    /// In the store's `blobs/`, by sha-256 (bytes a client sent).
    Blob { sha256: String },
    /// A named model's file or folder, read again (and checked against
    /// the hash, when it has one) at a restore.
    File {
        path: PathBuf,
        #[serde(default)]
        sha256: String,
    },
}

impl ModelRef {
    /// The blob it names, if it is one.
    pub fn blob(&self) -> Option<&str> {
        match self {
            ModelRef::Blob { sha256 } => Some(sha256),
            ModelRef::File { .. } => None,
        }
    }

    /// The blob a copy of its bytes is kept as: a sent model's, or (HA:
    /// a standby's copy, for a host without the file) a file's by its
    /// hash.
    pub fn kept_as(&self) -> Option<&str> {
        match self {
            ModelRef::Blob { sha256 } => Some(sha256),
            ModelRef::File { sha256, .. } => Some(sha256.as_str()).filter(|s| !s.is_empty()),
        }
    }
}

/// A loaded network.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NetworkRecord {
    pub id: u64,
    /// Its request; a generative network's `tokenizer.json`, which the
    /// wire form of the request leaves out, is `tokenizer_json`.
    pub request: LoadRequest,
    #[serde(default)]
    pub tokenizer_json: Option<String>,
    pub model: ModelRef,
    /// The tensors' types the workers reported when it was planned.
    pub types: BTreeMap<String, ReportedType>,
    pub considered: Vec<Considered>,
    pub replicas: Vec<ReplicaRecord>,
    /// Its model's bones: a coordinator without the model's bytes serves
    /// its deployments from them and takes the weights back from the
    /// workers ([`super::lacking`]). None: a model of many small weights,
    /// or a record kept before bones were.
    #[serde(default)]
    pub bones: Option<KeptBones>,
}

/// A model's [`Bones`], as a record keeps them (the frames in base64).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KeptBones {
    pub pieces: Vec<PieceRef>,
    pub frames: String,
}

impl KeptBones {
    pub fn of(bones: &Bones) -> KeptBones {
        KeptBones {
            pieces: bones.pieces.clone(),
            frames: BASE64.encode(&bones.frames),
        }
    }

    /// The bones again (checked).
    pub fn bones(&self) -> Result<Bones, String> {
        let frames = BASE64
            .decode(&self.frames)
            .map_err(|e| format!("its bones' frames: {e}"))?;
        let bones = Bones {
            pieces: self.pieces.clone(),
            frames: frames.into(),
        };
        bones.check().map_err(|e| e.to_string())?;
        Ok(bones)
    }
}

/// One copy of a network.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplicaRecord {
    pub index: usize,
    pub hosts: Option<Vec<String>>,
    /// Its deployment (none: it had none, being re-planned or broken).
    pub deployed: Option<DeployedRecord>,
    /// Where its nodes ran last (node → `host/DEVICE`).
    pub placement: BTreeMap<String, String>,
}

/// A deployment: [`Deployed`] without its graph (the network's).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeployedRecord {
    pub id: u64,
    pub network: u64,
    pub name: String,
    pub outputs: Vec<String>,
    pub state_outputs: Vec<String>,
    pub input_routes: Vec<(String, Vec<String>)>,
    pub output_makers: Vec<(String, String)>,
    pub addrs: Vec<(String, String)>,
    pub trigger_hosts: Vec<String>,
    pub state_trigger_hosts: Vec<String>,
    pub hosts: Vec<String>,
    pub placements: Vec<Placement>,
    pub plan: PlanReport,
    pub predicted_latency_us: f64,
    pub predicted_rps: f64,
    pub models: Vec<SubgraphModel>,
}

impl DeployedRecord {
    /// `d` as kept. Both conversions name every field (no `..`): a field
    /// added to [`Deployed`] or to the record does not compile until both
    /// carry it.
    pub fn of(d: &Deployed) -> DeployedRecord {
        let Deployed {
            id,
            network,
            name,
            graph: _,
            outputs,
            state_outputs,
            input_routes,
            output_makers,
            addrs,
            trigger_hosts,
            state_trigger_hosts,
            hosts,
            placements,
            plan,
            predicted_latency_us,
            predicted_rps,
            models,
        } = d;
        DeployedRecord {
            id: *id,
            network: *network,
            name: name.clone(),
            outputs: outputs.clone(),
            state_outputs: state_outputs.clone(),
            input_routes: input_routes.clone(),
            output_makers: output_makers.clone(),
            addrs: addrs.clone(),
            trigger_hosts: trigger_hosts.clone(),
            state_trigger_hosts: state_trigger_hosts.clone(),
            hosts: hosts.clone(),
            placements: placements.clone(),
            plan: plan.clone(),
            predicted_latency_us: finite(*predicted_latency_us),
            predicted_rps: finite(*predicted_rps),
            models: models.clone(),
        }
    }

    /// The deployment again, on the network's `graph`.
    pub fn into_deployed(self, graph: Arc<Graph>) -> Deployed {
        let DeployedRecord {
            id,
            network,
            name,
            outputs,
            state_outputs,
            input_routes,
            output_makers,
            addrs,
            trigger_hosts,
            state_trigger_hosts,
            hosts,
            placements,
            plan,
            predicted_latency_us,
            predicted_rps,
            models,
        } = self;
        Deployed {
            id,
            network,
            name,
            graph,
            outputs,
            state_outputs,
            input_routes,
            output_makers,
            addrs,
            trigger_hosts,
            state_trigger_hosts,
            hosts,
            placements,
            plan,
            predicted_latency_us,
            predicted_rps,
            models,
        }
    }
}

/// JSON has no NaN or infinity: a prediction that is not finite is kept as
/// 0 (not predicted).
fn finite(v: f64) -> f64 {
    if v.is_finite() {
        v
    } else {
        0.0
    }
}

impl NetworkRecord {
    /// `loaded` as it is now. Blocking: hashes its model the first time.
    pub fn of(loaded: &Loaded) -> NetworkRecord {
        let sha256 = loaded.model_sha();
        let model = match &loaded.origin {
            Origin::Sent => ModelRef::Blob { sha256 },
            Origin::File(path) => ModelRef::File {
                path: path.clone(),
                sha256,
            },
        };
        NetworkRecord {
            id: loaded.id,
            request: loaded.request.clone(),
            tokenizer_json: tokenizer_of(&loaded.request),
            model,
            types: loaded.types.clone(),
            considered: loaded.considered.clone(),
            replicas: loaded
                .replicas
                .iter()
                .map(|r| ReplicaRecord {
                    index: r.index,
                    hosts: r.hosts.clone(),
                    deployed: r.deployed().map(|d| DeployedRecord::of(&d)),
                    placement: r.placement(),
                })
                .collect(),
            // Computed off the load's path ([`super::lacking::keep_bones`]).
            bones: loaded
                .bones
                .get()
                .cloned()
                .flatten()
                .map(|b| KeptBones::of(&b)),
        }
    }
}

/// A generative or embedding request's `tokenizer.json` (kept beside the
/// request: its wire form leaves it out).
fn tokenizer_of(request: &LoadRequest) -> Option<String> {
    let generation = request.generation.as_ref().map(|g| &g.tokenizer_json);
    let embedding = request.embedding.as_ref().map(|e| &e.tokenizer_json);
    generation.or(embedding).filter(|t| !t.is_empty()).cloned()
}

/// `request` with its kept `tokenizer.json` back in.
pub fn with_tokenizer(mut request: LoadRequest, tokenizer_json: Option<String>) -> LoadRequest {
    let Some(t) = tokenizer_json else {
        return request;
    };
    if let Some(g) = request.generation.as_mut() {
        g.tokenizer_json = t;
    } else if let Some(e) = request.embedding.as_mut() {
        e.tokenizer_json = t;
    }
    request
}

/// A named model's entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelRecord {
    pub name: String,
    pub source: ModelRef,
    /// Its request, the tokenizer kept beside it (see [`NetworkRecord`]).
    pub request: LoadRequest,
    #[serde(default)]
    pub tokenizer_json: Option<String>,
    pub wanted: bool,
    /// The network serving it, if loaded.
    pub network: Option<u64>,
}

impl ModelRecord {
    /// An entry as it is now. Blocking: hashes sent bytes.
    pub fn of(
        name: String,
        source: &Source,
        request: LoadRequest,
        wanted: bool,
        network: Option<u64>,
    ) -> (ModelRecord, Option<Bytes>) {
        let (source, bytes) = match source {
            Source::File(path) => (
                ModelRef::File {
                    path: path.clone(),
                    sha256: String::new(),
                },
                None,
            ),
            Source::Bytes(sent) => (
                ModelRef::Blob {
                    sha256: sent.sha256(),
                },
                (!sent.lacking).then(|| sent.bytes.clone()),
            ),
        };
        let record = ModelRecord {
            name,
            source,
            tokenizer_json: tokenizer_of(&request),
            request,
            wanted,
            network,
        };
        (record, bytes)
    }
}
