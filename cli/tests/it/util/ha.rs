//! An HA cluster for end-to-end tests: a real etcd (Debian's
//! `etcd-server`, `scripts/test.sh` installs it) on loopback ports, two
//! coordinator processes campaigning in it, each with a `state_dir` of its
//! own (no shared volume: what a standby needs is in etcd, its copies of
//! the models, or the model repository; coordinator `b` may be kept from
//! seeing the repository),
//! and worker processes that follow the leader (`--coordinator a,b`).
//! Every process is killed when the cluster is dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cluster::{certs_init, start_worker, worker_args, Proc, CLUSTER};
use super::kserve::free_port;
use super::netns::{Host, Lan};

/// Where an HA cluster's processes run: all on this host's loopback, or
/// each on a host of its own ([`Lan`]: `etcd`, `coordinator-a`,
/// `coordinator-b` and one per worker).
#[derive(Clone)]
pub enum Place {
    Loopback,
    Apart(Vec<(String, Host)>),
}

impl Place {
    /// Each of `hosts` of `lan`.
    pub fn apart(lan: &Lan, hosts: &[&str]) -> Place {
        Place::Apart(hosts.iter().map(|h| (h.to_string(), lan.host(h))).collect())
    }

    fn host(&self, name: &str) -> Option<&Host> {
        match self {
            Place::Loopback => None,
            Place::Apart(hosts) => Some(
                hosts
                    .iter()
                    .find(|(h, _)| h == name)
                    .map(|(_, host)| host)
                    .unwrap_or_else(|| panic!("no host {name} on the lan")),
            ),
        }
    }

    /// `IP:PORT` for `name` to listen on: a free loopback port, or `port`
    /// on its host's address.
    pub fn listen(&self, name: &str, port: u16) -> String {
        match self.host(name) {
            None => format!("127.0.0.1:{}", free_port()),
            Some(host) => format!("{}:{port}", host.addr),
        }
    }

    /// `f`'s result, run where `name` runs.
    pub fn within<T: Send>(&self, name: &str, f: impl FnOnce() -> T + Send) -> T {
        match self.host(name) {
            None => f(),
            Some(host) => host.within(f),
        }
    }
}

/// etcd's election timeout here, ms: its shortest lease is 1.5 × this,
/// rounded up to whole seconds (1 s; etcd's defaults make it 2 s).
const ETCD_ELECTION_MS: u64 = 250;

/// A single-member etcd on loopback, killed on drop.
pub struct Etcd {
    child: Child,
    pub endpoint: String,
    pub log: PathBuf,
    place: Place,
}

impl Etcd {
    /// Starts etcd with its data in `dir/etcd` and waits until it serves.
    pub fn start(dir: &Path) -> Etcd {
        Etcd::start_at(dir, &Place::Loopback)
    }

    /// As [`Etcd::start`], on host `etcd` of `place`.
    pub fn start_at(dir: &Path, place: &Place) -> Etcd {
        let endpoint = format!("http://{}", place.listen("etcd", 2379));
        let peer_url = format!("http://{}", place.listen("etcd", 2380));
        let log = dir.join("etcd.log");
        let heartbeat = (ETCD_ELECTION_MS / 10).to_string();
        let election = ETCD_ELECTION_MS.to_string();
        let args = [
            "--name",
            "test",
            "--data-dir",
            &dir.join("etcd").display().to_string(),
            "--listen-client-urls",
            &endpoint,
            "--advertise-client-urls",
            &endpoint,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &format!("test={peer_url}"),
            "--heartbeat-interval",
            &heartbeat,
            "--election-timeout",
            &election,
        ];
        let child = place.within("etcd", || {
            Command::new("etcd")
                .args(args)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .expect("etcd (Debian's etcd-server; scripts/test.sh installs it)")
        });
        let etcd = Etcd {
            child,
            endpoint,
            log,
            place: place.clone(),
        };
        let started = Instant::now();
        while !etcd.healthy() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "etcd did not start: {}",
                std::fs::read_to_string(&etcd.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        etcd
    }

    /// etcd's `/health` answers `"health":"true"`.
    pub fn healthy(&self) -> bool {
        self.place.within("etcd", || self.asked_healthy())
    }

    fn asked_healthy(&self) -> bool {
        use std::io::{Read, Write};
        let addr = self.endpoint.trim_start_matches("http://");
        let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let asked = write!(stream, "GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        let mut answer = String::new();
        asked.is_ok()
            && stream.read_to_string(&mut answer).is_ok()
            && answer.contains("\"health\":\"true\"")
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// etcd, two coordinators (`a` leads first) and workers.
pub struct HaCluster {
    pub certs: PathBuf,
    /// The coordinators' addresses: `a`, `b`.
    pub addrs: Vec<SocketAddr>,
    pub coordinators: Vec<Proc>,
    pub workers: Vec<Proc>,
    pub etcd: Etcd,
    pub dir: super::Scratch,
    pub place: Place,
    /// A folder coordinator `b` does not see (an empty one mounted over it
    /// in a mount namespace of its own): a host without the model files.
    pub hidden_from_b: Option<PathBuf>,
}

impl HaCluster {
    /// etcd, coordinator `a` (leading), coordinator `b` (standing by), then
    /// each worker (name, extra arguments). `extra`: more cluster.toml,
    /// top-level keys and tables (named models), for both coordinators.
    pub fn start(test: &str, workers: &[(&str, &[&str])], extra: &str) -> HaCluster {
        HaCluster::start_at(test, workers, extra, Place::Loopback)
    }

    /// As [`HaCluster::start`], each process where `place` puts it.
    pub fn start_at(
        test: &str,
        workers: &[(&str, &[&str])],
        extra: &str,
        place: Place,
    ) -> HaCluster {
        HaCluster::start_hiding(test, workers, extra, place, None)
    }

    /// As [`HaCluster::start_at`], coordinator `b` not seeing `hidden`
    /// (root: a mount namespace of its own).
    pub fn start_hiding(
        test: &str,
        workers: &[(&str, &[&str])],
        extra: &str,
        place: Place,
        hidden: Option<&Path>,
    ) -> HaCluster {
        let dir = super::Scratch::new(&format!("ha-{test}"));
        let certs = dir.join("certs");
        let mut nodes = vec![
            "coordinator-a:coordinator",
            "coordinator-b:coordinator",
            "client",
        ];
        nodes.extend(workers.iter().map(|(w, _)| *w));
        certs_init(&certs, CLUSTER, &nodes);
        let etcd = Etcd::start_at(&dir, &place);
        let addrs: Vec<SocketAddr> = ["coordinator-a", "coordinator-b"]
            .iter()
            .map(|host| place.listen(host, 7400).parse().unwrap())
            .collect();
        let mut cluster = HaCluster {
            certs,
            addrs,
            coordinators: Vec::new(),
            workers: Vec::new(),
            etcd,
            dir,
            place,
            hidden_from_b: hidden.map(Path::to_path_buf),
        };
        for (i, name) in ["a", "b"].into_iter().enumerate() {
            cluster.write_config(name, cluster.addrs[i], extra);
            let coordinator = cluster.start_coordinator(name);
            let wanted = if i == 0 {
                "leading the cluster"
            } else {
                "standing by"
            };
            assert!(
                wait_log(&coordinator, wanted, Duration::from_secs(30)),
                "coordinator-{name} did not log '{wanted}':\n{}",
                coordinator.log_text()
            );
            cluster.coordinators.push(coordinator);
        }
        for (name, more) in workers {
            let mut args = worker_args(&cluster.list(), &cluster.dir, name, &cluster.certs, 1);
            if matches!(cluster.place, Place::Apart(_)) {
                args.extend(["--listen".into(), cluster.place.listen(name, 0)]);
            }
            args.extend(more.iter().map(|a| a.to_string()));
            let (w, _) = cluster
                .place
                .within(name, || start_worker(name, &args, &cluster.dir, "info"));
            cluster.workers.push(w);
        }
        cluster
    }

    fn write_config(&self, name: &str, listen: SocketAddr, extra: &str) {
        // Hosts apart, the leader's one capped link carries the weights it
        // ships (and copies to the standby) beside etcd's keep-alives: a
        // lease of 1 s has run out behind them.
        let lease_ttl_s = match self.place {
            Place::Loopback => 1,
            Place::Apart(_) => 2,
        };
        let text = format!(
            "cluster = \"{CLUSTER}\"\nname = \"coordinator-{name}\"\nlisten = \"{listen}\"\n\
             certs = \"{}\"\nheartbeat_ms = 200\nworker_timeout_ms = 1500\n\
             request_deadline_ms = 60000\nstate_dir = \"{}\"\n{extra}\n\
             [ha]\netcd = [\"{}\"]\nlease_ttl_s = {lease_ttl_s}\n",
            self.certs.display(),
            self.dir.join(format!("state-{name}")).display(),
            self.etcd.endpoint,
        );
        std::fs::write(self.dir.join(format!("coordinator-{name}.toml")), text).unwrap();
    }

    /// Starts coordinator `name` (`a` or `b`) with its configuration.
    pub fn start_coordinator(&self, name: &str) -> Proc {
        let config = self.dir.join(format!("coordinator-{name}.toml"));
        let host = format!("coordinator-{name}");
        let mut bin = env!("CARGO_BIN_EXE_coordinator").to_string();
        let mut args = vec!["--config".into(), config.display().to_string()];
        if let (Some(hidden), "b") = (&self.hidden_from_b, name) {
            let mount = "mount -t tmpfs hidden \"$1\" && shift && exec \"$@\"";
            let mut wrapped: Vec<String> =
                ["-m", "sh", "-c", mount, "sh"].map(String::from).to_vec();
            wrapped.push(hidden.display().to_string());
            wrapped.push(bin);
            wrapped.extend(args);
            (bin, args) = ("unshare".into(), wrapped);
        }
        let (proc, _) = self.place.within(&host, || {
            Proc::start(&host, &bin, &args, &self.dir, "listening on ", "info")
        });
        proc
    }

    /// `a,b`: what workers and clients are given.
    pub fn list(&self) -> String {
        self.addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Arguments that point `tessera` at every coordinator.
    pub fn client_args(&self) -> Vec<String> {
        super::cluster::client_args(&self.list(), &self.certs)
    }

    /// A client of the leader, found among every coordinator.
    pub async fn client(&self) -> tessera_client::Client {
        let id = tessera_net::certs::load_identity(&self.certs, "client").unwrap();
        let role = tessera_common::wire::handshake::Role::Client;
        tessera_client::Client::connect_any(&self.addrs, &id, CLUSTER, role)
            .await
            .unwrap()
    }
}

/// Whether `proc`'s log holds `text` within `within`.
pub fn wait_log(proc: &Proc, text: &str, within: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < within {
        if proc.log_text().contains(text) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
