//! Hosts apart on one machine: each host a network namespace whose one
//! interface (`eth0`, a veth pair) joins a bridge in a namespace of its
//! own, every link capped with `tbf` both ways (this kernel has no
//! `netem`). Processes started in a host's namespace talk over real
//! interfaces, never loopback, so no shared memory passes between them.
//! Needs root, `ip` and `tc`; everything is removed on drop.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;

/// Why namespaces cannot be made here (not root, no `ip`/`tc`), if so.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid(2) reads the process's credentials; nothing else.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    for tool in ["ip", "tc"] {
        let found = Command::new(tool).arg("-V").output();
        if !found.is_ok_and(|o| o.status.success()) {
            return Some(format!("no `{tool}` (iproute2)"));
        }
    }
    None
}

/// Whether the tests on separate network stacks must run
/// (`TESSERA_NETNS_TESTS=required`, as `scripts/test.sh` sets as root) or
/// may be skipped with a note.
pub fn skip(test: &str) -> bool {
    let Some(why) = unavailable() else {
        return false;
    };
    let required = std::env::var("TESSERA_NETNS_TESTS").is_ok_and(|v| v == "required");
    assert!(!required, "{test}: hosts apart are required but {why}");
    eprintln!("skipped {test}: {why}");
    true
}

/// Hosts on one bridge, each link at `mbit` Mbit/s.
pub struct Lan {
    prefix: String,
    hosts: Vec<String>,
}

fn run(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", args.join(" ")));
    assert!(
        out.status.success(),
        "{}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Lan {
    /// `hosts` (at most 200) joined by a bridge, each link capped at
    /// `mbit` Mbit/s each way.
    pub fn new(hosts: &[&str], mbit: u32) -> Lan {
        let prefix = format!("tsr{}", std::process::id() % 100_000);
        let lan = Lan {
            prefix,
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
        };
        let bridge = lan.bridge();
        lan.remove_stale();
        run(&["ip", "netns", "add", &bridge]);
        run(&["ip", "-n", &bridge, "link", "add", "br0", "type", "bridge"]);
        run(&["ip", "-n", &bridge, "link", "set", "br0", "up"]);
        for (i, host) in hosts.iter().enumerate() {
            let ns = lan.ns(host);
            let port = format!("{}p{i}", lan.prefix);
            run(&["ip", "netns", "add", &ns]);
            run(&[
                "ip", "-n", &ns, "link", "add", "eth0", "type", "veth", "peer", "name", &port,
                "netns", &bridge,
            ]);
            run(&["ip", "-n", &bridge, "link", "set", &port, "master", "br0"]);
            run(&["ip", "-n", &bridge, "link", "set", &port, "up"]);
            let addr = format!("{}/24", lan.addr(host));
            run(&["ip", "-n", &ns, "addr", "add", &addr, "dev", "eth0"]);
            run(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        }
        lan.cap("add", mbit);
        lan
    }

    /// Every link's cap, both ways, now `mbit` Mbit/s.
    pub fn set_rate(&self, mbit: u32) {
        self.cap("change", mbit);
    }

    /// `tbf` at `mbit` Mbit/s on both ends of every host's link (the
    /// host's sending, and the bridge's sending to it); `action` is tc's
    /// `add` or `change`.
    fn cap(&self, action: &str, mbit: u32) {
        let bridge = self.bridge();
        let rate = format!("{mbit}mbit");
        for (i, host) in self.hosts.iter().enumerate() {
            let ns = self.ns(host);
            let port = format!("{}p{i}", self.prefix);
            for (space, dev) in [(&ns, "eth0"), (&bridge, port.as_str())] {
                run(&[
                    "tc", "-n", space, "qdisc", action, "dev", dev, "root", "tbf", "rate", &rate,
                    "burst", "256kb", "latency", "50ms",
                ]);
            }
        }
    }

    fn bridge(&self) -> String {
        format!("{}-br", self.prefix)
    }

    /// Namespaces of an earlier run of this pid that was killed.
    fn remove_stale(&self) {
        let mut all = vec![self.bridge()];
        all.extend(self.hosts.iter().map(|h| self.ns(h)));
        for ns in all {
            let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        }
    }

    /// The namespace of `host`.
    pub fn ns(&self, host: &str) -> String {
        format!("{}-{host}", self.prefix)
    }

    /// The address of `host` on the bridge.
    pub fn addr(&self, host: &str) -> String {
        let i = self
            .hosts
            .iter()
            .position(|h| h == host)
            .expect("a host of the lan");
        format!("10.231.0.{}", i + 1)
    }

    /// `bin` with `args`, to run in `host`'s namespace.
    pub fn command(&self, host: &str, bin: impl AsRef<Path>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns(host)])
            .arg(bin.as_ref());
        cmd
    }

    /// `host`: its namespace and address, to run code in.
    pub fn host(&self, host: &str) -> Host {
        Host {
            ns: self.ns(host),
            addr: self.addr(host),
        }
    }

    /// Bytes `host`'s interface has received.
    pub fn rx_bytes(&self, host: &str) -> u64 {
        self.counter(host, "rx_bytes")
    }

    /// Bytes `host`'s interface has sent.
    pub fn tx_bytes(&self, host: &str) -> u64 {
        self.counter(host, "tx_bytes")
    }

    /// One of the statistics of `host`'s interface (`rx_bytes`, ...).
    fn counter(&self, host: &str, name: &str) -> u64 {
        let out = self
            .command(host, "cat")
            .arg(format!("/sys/class/net/eth0/statistics/{name}"))
            .output()
            .expect("cat runs");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("a byte count")
    }
}

/// One host of a [`Lan`]: code run [`Host::within`] it (on a thread that
/// joined its namespace) talks from its address, and the processes that
/// code starts live there too (a child keeps its parent thread's network
/// namespace).
#[derive(Debug, Clone)]
pub struct Host {
    ns: String,
    /// Its address on the bridge.
    pub addr: String,
}

impl Host {
    /// `f`'s result, run on a thread in this host's namespace.
    pub fn within<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/var/run/netns/{}", self.ns);
        std::thread::scope(|scope| {
            let joined = scope.spawn(|| {
                let file =
                    std::fs::File::open(&path).unwrap_or_else(|e| panic!("namespace {path}: {e}"));
                // SAFETY: setns(2) on a namespace file this thread opened;
                // it moves only this thread into the network namespace.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
                f()
            });
            joined
                .join()
                .unwrap_or_else(|panicked| std::panic::resume_unwind(panicked))
        })
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        self.remove_stale();
    }
}
