//! `tessera certs init`.

use crate::util;

use tessera_common::wire::handshake::Role;
use util::tessera;

#[test]
fn certs_init_writes_a_ca_and_node_certificates() {
    let dir = std::env::temp_dir().join(format!("tessera-certs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_string_lossy().to_string();
    let (ok, stdout, stderr) = tessera(&[
        "certs",
        "init",
        "--dir",
        &d,
        "--cluster",
        "lab",
        "--nodes",
        "coordinator,node-a",
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("cluster 'lab': 2 node certificate(s)"),
        "{stdout}"
    );
    for f in [
        "ca.pem",
        "ca.key",
        "coordinator.pem",
        "coordinator.key",
        "node-a.pem",
        "node-a.key",
    ] {
        assert!(dir.join(f).exists(), "{f}");
    }
    let ca = std::fs::read_to_string(dir.join("ca.pem")).unwrap();
    // A second run keeps the CA and adds the node.
    let (ok, stdout, _) = tessera(&["certs", "init", "--dir", &d, "--nodes", "node-b"]);
    assert!(ok);
    let rewrote_ca = stdout
        .lines()
        .any(|l| l.starts_with("wrote") && l.ends_with("ca.pem"));
    assert!(!rewrote_ca && stdout.contains("node-b.pem"), "{stdout}");
    assert_eq!(std::fs::read_to_string(dir.join("ca.pem")).unwrap(), ca);
    assert!(dir.join("node-b.pem").exists());
    let (ok, _, stderr) = tessera(&["certs", "init", "--dir", &d, "--nodes", "bad name"]);
    assert!(!ok);
    assert!(stderr.contains("node name 'bad name'"), "{stderr}");

    // Each certificate names its role: from the name, or NAME:ROLE.
    let (ok, _, stderr) = tessera(&["certs", "init", "--dir", &d, "--nodes", "client,ops:client"]);
    assert!(ok, "{stderr}");
    let role = |f: &str| tessera_net::certs::role_of_file(&dir.join(f));
    assert_eq!(role("coordinator.pem"), Some(Role::Coordinator));
    assert_eq!(role("node-a.pem"), Some(Role::Worker));
    assert_eq!(role("client.pem"), Some(Role::Client));
    assert_eq!(role("ops.pem"), Some(Role::Client));
    let (ok, _, stderr) = tessera(&["certs", "init", "--dir", &d, "--nodes", "x:admin"]);
    assert!(
        !ok && stderr.contains("coordinator, worker or client"),
        "{stderr}"
    );
    // --keep keeps certificates with a role and issues again those without.
    std::fs::copy(dir.join("ca.pem"), dir.join("node-a.pem")).unwrap(); // no role
    let (ok, stdout, _) = tessera(&[
        "certs",
        "init",
        "--dir",
        &d,
        "--nodes",
        "node-a,node-b",
        "--keep",
    ]);
    assert!(
        ok && stdout.contains("node-a.pem") && !stdout.contains("node-b.pem"),
        "{stdout}"
    );
    assert_eq!(role("node-a.pem"), Some(Role::Worker));
    let _ = std::fs::remove_dir_all(&dir);
}
