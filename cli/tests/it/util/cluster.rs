//! A real cluster for end-to-end tests: `coordinator` and `worker`
//! processes on loopback ports, certificates from `tessera certs init`.
//! Every process is killed when the cluster is dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub const CLUSTER: &str = "lab";

/// A child process, killed on drop; its stderr goes to a log file.
pub struct Proc {
    pub name: String,
    child: Child,
    pub log: PathBuf,
}

impl Proc {
    /// Starts `bin` with `RUST_LOG=filter` and waits (up to 60 s) for a stdout
    /// line that starts with `ready`; returns the process and that line.
    pub fn start(
        name: &str,
        bin: &str,
        args: &[String],
        dir: &Path,
        ready: &str,
        filter: &str,
    ) -> (Proc, String) {
        let log = dir.join(format!("{name}.log"));
        let mut child = Command::new(bin)
            .args(args)
            .env("RUST_LOG", filter)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("start {bin}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let wanted = ready.to_string();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with(&wanted) {
                    let _ = tx.send(line);
                }
            }
        });
        let mut proc = Proc {
            name: name.into(),
            child,
            log,
        };
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => (proc, line),
            Err(_) => {
                let status = proc.child.try_wait().ok().flatten();
                panic!(
                    "{name} did not print '{ready}' (exit: {status:?}); log:\n{}",
                    proc.log_text()
                )
            }
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL: the process gets no chance to say goodbye.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGSTOP: the process is paused (connections stay open, nothing is
    /// answered) until [`Proc::resume`].
    pub fn pause(&mut self) {
        // SAFETY: kill(2) on our own child's pid; no memory is touched.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGSTOP) };
    }

    /// SIGCONT after [`Proc::pause`].
    pub fn resume(&mut self) {
        // SAFETY: kill(2) on our own child's pid; no memory is touched.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGCONT) };
    }

    /// SIGTERM (what `docker compose stop` sends); waits up to 10 s for the
    /// exit and returns its status.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        // SAFETY: kill(2) on our own child's pid; no memory is touched.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < until {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A coordinator and workers.
pub struct Cluster {
    pub certs: PathBuf,
    pub addr: SocketAddr,
    pub coordinator: Proc,
    pub workers: Vec<Proc>,
    /// Every process's `RUST_LOG`.
    pub log: String,
    /// The cluster's folder (certificates, logs, the workers' compile
    /// caches: hundreds of MB for a language model). Last: fields drop in
    /// order, so the processes are killed before it goes (unless the test
    /// failed: then it is kept for its logs).
    pub dir: super::Scratch,
}

/// Runs `tessera certs init` for `nodes` into `dir`.
pub fn certs_init(dir: &Path, cluster: &str, nodes: &[&str]) {
    let (ok, _, err) = super::tessera(&[
        "certs",
        "init",
        "--dir",
        dir.to_str().unwrap(),
        "--cluster",
        cluster,
        "--nodes",
        &nodes.join(","),
    ]);
    assert!(ok, "certs init: {err}");
}

impl Cluster {
    /// A coordinator (heartbeats every 200 ms, workers dropped after 1.5 s
    /// of silence) and one worker per name, each serving CPU with
    /// `threads` threads per subgraph.
    pub fn start(test: &str, workers: &[&str], threads: usize) -> Cluster {
        let with: Vec<(&str, &str)> = workers.iter().map(|w| (*w, "CPU")).collect();
        Cluster::start_with(test, &with, threads)
    }

    /// As [`Cluster::start`], each worker serving its own devices
    /// (`("node-a", "GPU")`).
    pub fn start_with(test: &str, workers: &[(&str, &str)], threads: usize) -> Cluster {
        Cluster::start_configured(test, workers, threads, "")
    }

    /// As [`Cluster::start_with`], with `extra` appended to the
    /// coordinator's cluster.toml (e.g. `http_listen`, `[models.NAME]`).
    pub fn start_configured(
        test: &str,
        workers: &[(&str, &str)],
        threads: usize,
        extra: &str,
    ) -> Cluster {
        Cluster::start_logged(test, workers, threads, extra, "info")
    }

    /// As [`Cluster::start_configured`], every process with `RUST_LOG=log`.
    pub fn start_logged(
        test: &str,
        workers: &[(&str, &str)],
        threads: usize,
        extra: &str,
        log: &str,
    ) -> Cluster {
        let workers: Vec<(&str, &str, &[&str])> =
            workers.iter().map(|&(w, d)| (w, d, &[][..])).collect();
        Cluster::start_full(test, &workers, threads, extra, log)
    }

    /// As [`Cluster::start`], each worker (name, devices, extra arguments
    /// such as `--memory-limit 64MiB`).
    pub fn start_with_args(
        test: &str,
        workers: &[(&str, &str, &[&str])],
        threads: usize,
    ) -> Cluster {
        Cluster::start_full(test, workers, threads, "", "info")
    }

    /// As [`Cluster::start_configured`], each worker with extra arguments
    /// (`--http-listen ADDR`: its own front door).
    pub fn start_configured_with_args(
        test: &str,
        workers: &[(&str, &str, &[&str])],
        threads: usize,
        extra: &str,
    ) -> Cluster {
        Cluster::start_full(test, workers, threads, extra, "info")
    }

    fn start_full(
        test: &str,
        workers: &[(&str, &str, &[&str])],
        threads: usize,
        extra: &str,
        log: &str,
    ) -> Cluster {
        let dir = super::Scratch::new(&format!("e2e-{test}"));
        let certs = dir.join("certs");
        let mut nodes = vec!["coordinator", "client"];
        nodes.extend(workers.iter().map(|(w, _, _)| *w));
        certs_init(&certs, CLUSTER, &nodes);
        let config = dir.join("cluster.toml");
        // `{dir}` in `extra`: the cluster's folder (e.g. a state_dir in it).
        let extra = extra.replace("{dir}", &dir.display().to_string());
        std::fs::write(
            &config,
            format!(
                "cluster = \"{CLUSTER}\"\nlisten = \"127.0.0.1:0\"\ncerts = \"{}\"\n\
                 heartbeat_ms = 200\nworker_timeout_ms = 1500\nrequest_deadline_ms = 60000\n{extra}",
                certs.display()
            ),
        )
        .unwrap();
        let (coordinator, line) = Proc::start(
            "coordinator",
            env!("CARGO_BIN_EXE_coordinator"),
            &["--config".into(), config.display().to_string()],
            &dir,
            "listening on ",
            log,
        );
        let addr: SocketAddr = line["listening on ".len()..].trim().parse().unwrap();
        let mut cluster = Cluster {
            dir,
            certs,
            addr,
            coordinator,
            workers: Vec::new(),
            log: log.to_string(),
        };
        for (name, devices, more) in workers {
            let mut args = cluster.worker_args(name, &cluster.certs.clone(), threads);
            args[1] = devices.to_string();
            args.extend(more.iter().map(|a| a.to_string()));
            let (w, _) = start_worker(name, &args, &cluster.dir, log);
            cluster.workers.push(w);
        }
        cluster
    }

    /// Kills the coordinator (SIGKILL) and starts it again on the same
    /// address.
    pub fn restart_coordinator(&mut self) {
        self.coordinator.kill();
        self.start_coordinator_again();
    }

    /// Starts the coordinator again on the same address (after
    /// `self.coordinator.kill()`), with the same configuration.
    pub fn start_coordinator_again(&mut self) {
        let config = self.dir.join("cluster.toml");
        let text = std::fs::read_to_string(&config).unwrap().replace(
            "listen = \"127.0.0.1:0\"",
            &format!("listen = \"{}\"", self.addr),
        );
        std::fs::write(&config, text).unwrap();
        let (coordinator, _) = Proc::start(
            "coordinator-restarted",
            env!("CARGO_BIN_EXE_coordinator"),
            &["--config".into(), config.display().to_string()],
            &self.dir,
            "listening on ",
            &self.log,
        );
        self.coordinator = coordinator;
    }

    /// Starts worker `name` with certificates from `certs`; returns it and
    /// its announcement line.
    pub fn worker(&self, name: &str, certs: &Path, threads: usize) -> (Proc, String) {
        let args = self.worker_args(name, certs, threads);
        start_worker(name, &args, &self.dir, &self.log)
    }

    pub fn worker_args(&self, name: &str, certs: &Path, threads: usize) -> Vec<String> {
        worker_args(&self.addr.to_string(), &self.dir, name, certs, threads)
    }

    /// Arguments that point `tessera` at this cluster.
    pub fn client_args(&self) -> Vec<String> {
        client_args(&self.addr.to_string(), &self.certs)
    }

    /// A client with the cluster's `client` certificate.
    pub async fn client(&self) -> tessera_client::Client {
        let id = tessera_net::certs::load_identity(&self.certs, "client").unwrap();
        tessera_client::Client::connect(self.addr, &id, CLUSTER)
            .await
            .unwrap()
    }
}

/// A worker's arguments: `--coordinator coordinators` (one address, or
/// several comma-separated), its compile cache in `dir`.
pub fn worker_args(
    coordinators: &str,
    dir: &Path,
    name: &str,
    certs: &Path,
    threads: usize,
) -> Vec<String> {
    [
        "--devices",
        "CPU",
        "--name",
        name,
        "--coordinator",
        coordinators,
        "--certs",
        certs.to_str().unwrap(),
        "--cluster",
        CLUSTER,
        "--threads",
        &threads.to_string(),
        "--cache-dir",
        &dir.join(format!("cache-{name}")).display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Arguments that point `tessera` at `coordinators` (one, or several
/// comma-separated) with the `client` certificate of `certs`.
pub fn client_args(coordinators: &str, certs: &Path) -> Vec<String> {
    vec![
        "--coordinator".into(),
        coordinators.into(),
        "--certs".into(),
        certs.display().to_string(),
        "--cluster".into(),
        CLUSTER.into(),
    ]
}

/// Starts the `worker` binary with `args` (logs in `dir`, `RUST_LOG=log`)
/// and waits until it has registered; returns it and that line.
pub fn start_worker(name: &str, args: &[String], dir: &Path, log: &str) -> (Proc, String) {
    Proc::start(
        name,
        env!("CARGO_BIN_EXE_worker"),
        args,
        dir,
        "registered as ",
        log,
    )
}
