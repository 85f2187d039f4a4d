//! `tessera load`, `models` and `unload`: the coordinator's named models
//! (its model repository), which HTTP clients reach by name
//! (`/v2/models/NAME/infer`) and which come back by themselves after a
//! worker loss.

use anyhow::{bail, Result};
use clap::Args;

use crate::cluster_cmds::ModelArgs;
use crate::remote::{connect, plan_lines, RemoteArgs};

#[derive(Args)]
pub struct LoadArgs {
    /// The model's name (1-128 of A-Z a-z 0-9 _ . -).
    #[arg(value_name = "NAME")]
    model_name: String,
    #[command(flatten)]
    model: ModelArgs,
}

#[derive(Args)]
pub struct ModelsArgs {
    /// Print the models document (JSON: state, inputs and outputs,
    /// copies, plans as subgraphs), as a front door's `GET /api/models`
    /// answers it.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: RemoteArgs,
}

#[derive(Args)]
pub struct UnloadArgs {
    /// The model's name.
    #[arg(value_name = "NAME")]
    model_name: String,
    #[command(flatten)]
    remote: RemoteArgs,
}

/// Sequences a generative model's copies keep state for (as a
/// `[models.NAME]` table's default).
const DEFAULT_SEQUENCES: u32 = tessera_common::models::DEFAULT_MAX_SEQUENCES;

fn needs_coordinator(remote: &RemoteArgs, what: &str) -> Result<()> {
    if remote.coordinator.is_none() {
        bail!("tessera {what} acts on a running cluster: give --coordinator ADDR");
    }
    Ok(())
}

pub fn load(args: LoadArgs) -> Result<()> {
    needs_coordinator(&args.model.remote, "load")?;
    tessera_cli::cluster::run_system(async move {
        let path = args.model.model.clone();
        let tessera_cli::ModelRead {
            bytes, generation, ..
        } = tokio::task::spawn_blocking(move || tessera_cli::read_model(&path, DEFAULT_SEQUENCES))
            .await??;
        let mut options = args.model.options()?;
        // A generative model, as a `[models.NAME]` table without limits
        // would load it.
        let wanted =
            tessera_common::models::ModelConfig::default().load_request(&args.model_name, true);
        options.generation = generation
            .zip(wanted.generation)
            .map(|(spec, w)| spec.limited_by(&w));
        let (client, _) = connect(&args.model.remote).await?;
        let network = client
            .load_model(&args.model_name, bytes, options, |what, done, total| {
                eprintln!("[{done}/{total}] {what}")
            })
            .await?;
        crate::print_stdout(&format!(
            "model {} loaded as network {}\n{}",
            args.model_name,
            network.id(),
            plan_lines(network.plan())
        ));
        Ok(())
    })
}

pub fn models(args: ModelsArgs) -> Result<()> {
    needs_coordinator(&args.remote, "models")?;
    tessera_cli::cluster::run_system(async move {
        let (client, _) = connect(&args.remote).await?;
        if args.json {
            let doc = tessera_serving::views::models_doc(&client).await?;
            crate::print_stdout(&format!("{}\n", serde_json::to_string_pretty(&doc)?));
            return Ok(());
        }
        let models = client.models().await?;
        let mut out = String::new();
        use std::fmt::Write as _;
        if models.is_empty() {
            out.push_str("no named models\n");
        }
        for m in &models {
            let _ = write!(out, "{}: {}", m.name, m.state);
            if m.network != 0 {
                let _ = write!(out, " (network {})", m.network);
            }
            if !m.reason.is_empty() {
                let _ = write!(out, ": {}", m.reason);
            }
            out.push('\n');
        }
        crate::print_stdout(&out);
        Ok(())
    })
}

pub fn unload(args: UnloadArgs) -> Result<()> {
    needs_coordinator(&args.remote, "unload")?;
    tessera_cli::cluster::run_system(async move {
        let (client, _) = connect(&args.remote).await?;
        client.unload_model(&args.model_name).await?;
        crate::print_stdout(&format!("model {} unloaded\n", args.model_name));
        Ok(())
    })
}
