//! The kept state in a real etcd (Debian's etcd-server, started here on
//! loopback ports): records written by the leader read back whole (a big
//! one through a blob), ids reserved there, and a write after the lead is
//! lost (its lease revoked) refused and reported as fenced.

// A test crate: its helpers fail the test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::Client;
use tessera_common::wire::control::LoadRequest;
use tessera_coordinator::state::{Fence, Keeper, ModelRecord, ModelRef};

/// etcd, and its data folder (removed after it).
struct Etcd(Child, #[allow(dead_code)] tempfile::TempDir);

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// etcd on loopback; its client endpoint.
fn etcd() -> (Etcd, String) {
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port(), free_port());
    let endpoint = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = Command::new("etcd")
        .args(["--data-dir", &dir.path().join("etcd").display().to_string()])
        .args([
            "--listen-client-urls",
            &endpoint,
            "--advertise-client-urls",
            &endpoint,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("default={peer_url}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd (Debian's etcd-server; scripts/test.sh installs it)");
    (Etcd(child, dir), endpoint)
}

fn model(name: &str, tokenizer: Option<String>) -> ModelRecord {
    ModelRecord {
        name: name.into(),
        source: ModelRef::File {
            path: format!("/models/{name}.onnx").into(),
            sha256: String::new(),
        },
        request: LoadRequest {
            name: name.into(),
            ..Default::default()
        },
        tokenizer_json: tokenizer,
        wanted: true,
        network: Some(7),
    }
}

#[test]
fn the_leaders_records_read_back_and_a_lost_lead_writes_nothing() {
    let (_etcd, endpoint) = etcd();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let started = Instant::now();
        let mut client = loop {
            if let Ok(mut c) = Client::connect([endpoint.as_str()], None).await {
                if c.status().await.is_ok() {
                    break c;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "etcd did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let dir = tempfile::tempdir().unwrap();
        let keeper = Keeper::etcd(client.clone(), "/test", dir.path()).unwrap();
        let lease = client.lease_grant(5, None).await.unwrap().id();
        let mut won = client
            .campaign("/test/leader", "127.0.0.1:7400", lease)
            .await
            .unwrap();
        let key = won.take_leader().unwrap();
        let epoch = key.rev() as u64;
        keeper
            .lead(Fence {
                key: key.key().to_vec(),
                epoch,
            })
            .await
            .unwrap();
        assert_eq!(keeper.epoch(), epoch);
        let first = keeper.next_id().await;
        assert_eq!(first, 1);
        // 2 MiB of tokenizer: over etcd's request limit, kept as chunks in
        // etcd, not as a file.
        let big = "x".repeat(2 << 20);
        let records = vec![
            (model("rec", None), None),
            (model("smollm", Some(big.clone())), None),
        ];
        keeper.save_models(records).await;
        let (networks, models) = keeper.load().await.unwrap();
        assert!(networks.is_empty());
        assert_eq!(models.len(), 2);
        let smollm = models.iter().find(|m| m.name == "smollm").unwrap();
        assert_eq!(smollm.tokenizer_json.as_deref(), Some(big.as_str()));
        assert_eq!(
            std::fs::read_dir(dir.path().join("blobs")).unwrap().count(),
            0
        );

        // A second leader later, with a state_dir of its own (no shared
        // volume): it reads every record; ids go on past the reserved
        // block.
        let other = tempfile::tempdir().unwrap();
        let again = Keeper::etcd(client.clone(), "/test", other.path()).unwrap();
        let (_, models) = again.load().await.unwrap();
        let smollm = models.iter().find(|m| m.name == "smollm").unwrap();
        assert_eq!(smollm.tokenizer_json.as_deref(), Some(big.as_str()));
        again
            .lead(Fence {
                key: key.key().to_vec(),
                epoch,
            })
            .await
            .unwrap();
        assert!(again.next_id().await >= 1000, "ids never repeat");

        // The lead is lost: the write is refused and reported.
        client.lease_revoke(lease).await.unwrap();
        let mut fenced = keeper.fenced();
        keeper.save_models(vec![(model("rec", None), None)]).await;
        assert!(*fenced.borrow_and_update(), "the write was not fenced");
        let (_, models) = keeper.load().await.unwrap();
        assert_eq!(models.len(), 2, "nothing changed");
    });
}
