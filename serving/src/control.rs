//! Model control over HTTP and gRPC: the repository extension's load and
//! unload, under `[serving]`'s rules. Off unless `model_control = true`;
//! with it on, a model is (re)loaded by name — one the coordinator knows
//! (a `[models.NAME]` table, a model loaded before), or `NAME` in this
//! front door's `model_repository` — and a `config` parameter (the keys of
//! a `[models.NAME]` table, as JSON) may place it differently, its `path`
//! confined to the repository. The front door reads the model's files and
//! ships them to the coordinator; without a path, a model the coordinator
//! knows is placed anew from the bytes it has.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use tessera_client::generate::ModelFolder;
use tessera_client::LoadRequest;
use tessera_common::models::{valid_model_name, ModelConfig, MODEL_KEYS};

use crate::{Door, ServeError};

/// Loads (or reloads) model `name`; `config` is the request's `config`
/// parameter, if any.
pub async fn load(door: &Door, name: &str, config: Option<&str>) -> Result<(), ServeError> {
    if !door.rules.model_control {
        return Err(ServeError::ControlOff);
    }
    if !valid_model_name(name) {
        return Err(ServeError::BadRequest(format!(
            "'{name}' is not a model name (1-128 of A-Z a-z 0-9 _ . -, not starting with '.')"
        )));
    }
    let config = config.map(parse_config).transpose()?;
    let known = door.index().await?.iter().any(|m| m.name == name);
    let (request, payload) = match config {
        // The model as the coordinator has it.
        None if known => (None, None),
        // Placed anew from the bytes the coordinator has.
        Some(config) if known && config.path.as_os_str().is_empty() => {
            (Some(config.load_request(name, false)), None)
        }
        config => {
            let mut config = config.unwrap_or_default();
            config.path = locate(door, name, &config)?;
            if let Some(e) = config.embedding.as_mut() {
                e.tokenizer = confined(door, &e.tokenizer)?;
            }
            let (request, payload) = read(name, config).await?;
            (Some(request), Some(payload))
        }
    };
    door.client.load_model_with(name, request, payload).await?;
    door.forget(name);
    Ok(())
}

/// Unloads model `name`.
pub async fn unload(door: &Door, name: &str) -> Result<(), ServeError> {
    if !door.rules.model_control {
        return Err(ServeError::ControlOff);
    }
    door.client.unload_model(name).await?;
    door.forget(name);
    Ok(())
}

/// A `config` parameter: a `[models.NAME]` table as JSON.
fn parse_config(text: &str) -> Result<ModelConfig, ServeError> {
    serde_json::from_str(text).map_err(|e| {
        ServeError::BadRequest(format!(
            "parameters.config: {e} (keys: {})",
            MODEL_KEYS.join(", ")
        ))
    })
}

/// The model's file in the repository: its `path` confined, or found by
/// name.
fn locate(door: &Door, name: &str, config: &ModelConfig) -> Result<PathBuf, ServeError> {
    let Some(repo) = &door.rules.repository else {
        return Err(ServeError::NotFound(format!(
            "no model named '{name}' is configured, and no [serving] model_repository is set to load it from"
        )));
    };
    if config.path.as_os_str().is_empty() {
        repo.find(name)
    } else {
        repo.confine(&config.path)
    }
}

/// A file the config names, confined to the repository.
fn confined(door: &Door, path: &Path) -> Result<PathBuf, ServeError> {
    match &door.rules.repository {
        Some(repo) => repo.confine(path),
        None => Err(ServeError::NotFound(
            "no [serving] model_repository is set to read files from".into(),
        )),
    }
}

/// The load of `config`'s file (or generative folder), read off the async
/// threads: its request and payload (an embedding model's tokenizer after
/// the model).
async fn read(name: &str, config: ModelConfig) -> Result<(LoadRequest, Bytes), ServeError> {
    let name = name.to_string();
    tokio::task::spawn_blocking(move || {
        let path: &Path = &config.path;
        if tessera_gguf::generative::is_generative(path) {
            let folder = ModelFolder::read(path, config.max_sequences)?;
            let mut request = config.load_request(&name, true);
            if let Some(g) = request.generation.as_mut() {
                *g = folder.generation.limited_by(g);
                let payload = g.join_payload(&folder.model);
                return Ok((request, payload));
            }
            Ok((request, folder.model))
        } else {
            let bytes = std::fs::read(path).map_err(|e| {
                ServeError::NotFound(format!("model {name}: cannot read its file: {e}"))
            })?;
            let mut request = config.load_request(&name, false);
            if let Some(e) = request.embedding.take() {
                let json = std::fs::read_to_string(&e.tokenizer_path).map_err(|err| {
                    ServeError::NotFound(format!(
                        "model {name}: cannot read its tokenizer {}: {err}",
                        e.tokenizer_path
                    ))
                })?;
                let mut e = e.with_tokenizer(json);
                let payload = e.join_payload(&bytes);
                request.embedding = Some(e);
                return Ok((request, payload));
            }
            Ok((request, Bytes::from(bytes)))
        }
    })
    .await
    .map_err(|e| ServeError::Unavailable(format!("reading the model: {e}")))?
}
