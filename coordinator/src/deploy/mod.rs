//! Deploying a planned network: every copy (replica), every subgraph of
//! each exported now (its weights slices of the model the coordinator
//! holds once) and streamed to its worker in parallel, with byte progress
//! forwarded to the client, unless the worker's compile cache holds it;
//! routes from each output to its readers; a failed deployment undeploys
//! what was deployed. Also unloading.
//!
//! By job: `load` (a load's copies planned and deployed, planned again
//! without a worker that failed, the placement remembered), `deployment`
//! (one planned copy deployed and its routes), `export` (stages exported
//! and hashed), `specs` (each stage's `DeploySpec`), `ship` (the Deploy
//! exchanges with the workers), `unload` (undeploy, unload).

mod deployment;
mod export;
mod load;
mod ship;
mod specs;
mod unload;

pub(crate) use deployment::deploy;
pub use load::load_network;
pub use unload::{undeploy, unload};
