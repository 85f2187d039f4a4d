//! `tessera certs init`: a cluster CA and a certificate per node.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum CertsCommand {
    /// Create the cluster CA (or reuse the one in --dir or --ca-dir) and
    /// sign a certificate for each node. Keys are written with mode 0600.
    Init(InitArgs),
}

#[derive(Args)]
pub struct InitArgs {
    /// Where to write ca.pem, ca.key and `<node>.pem` / `<node>.key`.
    #[arg(long, default_value = "certs")]
    dir: PathBuf,
    /// Sign with the CA in this folder (ca.pem, ca.key) instead: only
    /// ca.pem is copied into --dir, the key stays here (a Kubernetes init
    /// container signs its pod's certificate from a Secret this way).
    #[arg(long, value_name = "DIR")]
    ca_dir: Option<PathBuf>,
    /// The cluster's name (peers of other clusters are refused).
    #[arg(long, default_value = "tessera")]
    cluster: String,
    /// Nodes, NAME or NAME:ROLE (coordinator, worker or client): the
    /// coordinator, workers (their --name) and clients. Without a role,
    /// `coordinator` is the coordinator, names starting with `client` are
    /// clients and the others workers. The name and role go into the
    /// certificate: a node can only connect as what its certificate says.
    #[arg(long, value_delimiter = ',', default_value = "coordinator,client")]
    nodes: Vec<String>,
    /// Keep the certificates of nodes that have one (naming their role) in
    /// --dir already (the compose file's one-shot `certs` service runs at
    /// every `up`).
    #[arg(long)]
    keep: bool,
    /// Extra DNS names or IP addresses for the coordinator's certificate:
    /// the names HTTPS and gRPC clients dial it by (`[serving] tls`).
    /// `localhost`, 127.0.0.1 and ::1 are always in it.
    #[arg(long, value_delimiter = ',')]
    hosts: Vec<String>,
}

pub fn run(command: CertsCommand) -> anyhow::Result<()> {
    match command {
        CertsCommand::Init(args) => {
            // Kept: a certificate and key that name the node's role (older
            // ones without a role are issued again).
            let has = |spec: &str| {
                let Ok((node, role)) = tessera_net::certs::parse_node(spec) else {
                    return false;
                };
                let pem = args.dir.join(format!("{node}.pem"));
                args.dir.join(format!("{node}.key")).exists()
                    && tessera_net::certs::role_of_file(&pem) == Some(role)
            };
            let nodes: Vec<&str> = args
                .nodes
                .iter()
                .map(String::as_str)
                .filter(|n| !(args.keep && has(n)))
                .collect();
            let hosts: Vec<&str> = args.hosts.iter().map(String::as_str).collect();
            let written = tessera_net::certs::init_dir_with_ca(
                &args.dir,
                args.ca_dir.as_deref(),
                &args.cluster,
                &nodes,
                &hosts,
            )
            .with_context(|| format!("creating certificates in {}", args.dir.display()))?;
            let mut out = String::new();
            for path in written {
                out.push_str(&format!("wrote {}\n", path.display()));
            }
            out.push_str(&format!(
                "cluster '{}': {} node certificate(s) signed by {}\n",
                args.cluster,
                nodes.len(),
                args.dir.join("ca.pem").display()
            ));
            crate::print_stdout(&out);
            Ok(())
        }
    }
}
