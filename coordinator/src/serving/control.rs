//! Model control over HTTP and gRPC: the repository extension's load and
//! unload, under `[serving]`'s rules. Off unless `model_control = true`;
//! with it on, a model is (re)loaded by name — a `[models.NAME]` table, a
//! model loaded before, or `NAME` in `model_repository` — and a `config`
//! parameter (the keys of a `[models.NAME]` table, as JSON) may place it
//! differently, its `path` confined to the repository.

use std::sync::Arc;

use crate::config::{valid_model_name, ModelConfig};
use crate::{repository, Shared};

use super::ServingError;

/// Loads (or reloads) model `name`; `config` is the request's `config`
/// parameter, if any.
pub async fn load(
    shared: &Arc<Shared>,
    name: &str,
    config: Option<&str>,
) -> Result<(), ServingError> {
    let serving = &shared.serving;
    if !serving.model_control {
        return Err(ServingError::ControlOff);
    }
    if !valid_model_name(name) {
        return Err(ServingError::BadRequest(format!(
            "'{name}' is not a model name (1-128 of A-Z a-z 0-9 _ . -, not starting with '.')"
        )));
    }
    let config = config.map(parse_config).transpose()?;
    let known = shared.repository.get(name);
    let new = match config {
        None if known.is_some() => None,
        config => {
            let mut config = config.unwrap_or_default();
            // Placed anew, read from where it was (the operator's
            // `[models.NAME]` path, or the repository) unless a path is
            // given.
            let file = known.and_then(|e| e.source_file());
            config.path = match file {
                Some(file) if config.path.as_os_str().is_empty() => file,
                _ => locate(shared, name, &config)?,
            };
            config
                .check(name)
                .map_err(|e| ServingError::BadRequest(format!("model {name}{}: {e}", e.key())))?;
            Some(repository::definition(name, &config))
        }
    };
    repository::load(shared, name, new, repository::progress_log(name)).await?;
    Ok(())
}

/// Unloads model `name`.
pub async fn unload(shared: &Arc<Shared>, name: &str) -> Result<(), ServingError> {
    if !shared.serving.model_control {
        return Err(ServingError::ControlOff);
    }
    repository::unload(shared, name).await?;
    Ok(())
}

/// A `config` parameter: a `[models.NAME]` table as JSON.
fn parse_config(text: &str) -> Result<ModelConfig, ServingError> {
    serde_json::from_str(text).map_err(|e| {
        ServingError::BadRequest(format!(
            "parameters.config: {e} (keys: {})",
            crate::config::MODEL_KEYS.join(", ")
        ))
    })
}

/// The model's file in the repository: its `path` confined, or found by
/// name.
fn locate(
    shared: &Shared,
    name: &str,
    config: &ModelConfig,
) -> Result<std::path::PathBuf, ServingError> {
    let Some(repo) = &shared.serving.repository else {
        return Err(ServingError::NotFound(format!(
            "no model named '{name}' is configured, and no [serving] model_repository is set to load it from"
        )));
    };
    if config.path.as_os_str().is_empty() {
        repo.find(name)
    } else {
        repo.confine(&config.path)
    }
}
