//! deploy/kubernetes, as CI checks it without a cluster: a copy gets a
//! fresh CA and tokens (the Secrets its README has users make), then
//! `tests/python/k8s_check.py` renders base and every overlay with
//! `kubectl kustomize`, validates every resource against Kubernetes 1.30's
//! schemas (kubernetes-validate, strict) and each LeaderWorkerSet against
//! LWS's vendored CRD schema, and checks each pod template against these
//! binaries: the init containers' `tessera certs init` runs, and
//! `coordinator --check-config` / `worker --check-config` accept every
//! container's flags, environment, config files, certificates and tokens;
//! ports, Secrets, ConfigMaps and memory limits agree.

use std::path::Path;
use std::process::Command;

/// Whether `kubectl` runs here; CI (scripts/test.sh sets
/// TESSERA_K8S_TESTS=required where it does) fails without it.
fn kubectl_available() -> bool {
    let found = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found && std::env::var("TESSERA_K8S_TESTS").as_deref() == Ok("required") {
        panic!("kubectl is needed (TESSERA_K8S_TESTS=required)");
    }
    found
}

fn run(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{command:?} failed:\n{text}");
    text
}

#[test]
fn every_overlay_renders_validates_and_agrees_with_the_binaries() {
    if !kubectl_available() {
        eprintln!("skipped: no kubectl");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let deploy = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kubernetes-check");
    let _ = std::fs::remove_dir_all(&deploy);
    run(Command::new("cp")
        .arg("-r")
        .arg(root.join("deploy/kubernetes"))
        .arg(&deploy));
    // The Secrets' files, as deploy/kubernetes/README.md has users make
    // them (whatever a developer's own copy holds is replaced).
    let secrets = deploy.join("components/secrets");
    for name in ["ca.pem", "ca.key", "tokens.txt", "client.pem", "client.key"] {
        let _ = std::fs::remove_file(secrets.join(name));
    }
    run(Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "certs",
            "init",
            "--cluster",
            "tessera",
            "--nodes",
            "client",
            "--dir",
        ])
        .arg(&secrets));
    std::fs::write(secrets.join("tokens.txt"), "k8s-check-token-0123456789\n").unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_tessera")).parent().unwrap();
    let report = run(Command::new("python3")
        .arg(root.join("tests/python/k8s_check.py"))
        .arg(&deploy)
        .arg(bin_dir));
    println!("{report}");
    for overlay in ["base", "single", "external-etcd", "gpu", "lws"] {
        assert!(
            report
                .lines()
                .any(|l| l.contains(overlay) && l.contains("agrees with the binaries")),
            "{overlay} was not checked:\n{report}"
        );
    }
}
