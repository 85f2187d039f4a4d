//! `cluster.toml`: the shipped example parses to the defaults, environment
//! variables override keys, unknown keys and bad values are clear errors.

use std::collections::HashMap;
use std::path::Path;

use tessera_coordinator::config::CoordinatorConfig;

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/cluster.toml");

fn no_env(_: &str) -> Option<String> {
    None
}

fn write(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn the_example_is_the_defaults() {
    let cfg = CoordinatorConfig::load(Some(Path::new(EXAMPLE)), no_env).unwrap();
    assert_eq!(cfg, CoordinatorConfig::default());
}

#[test]
fn environment_variables_override_keys() {
    let env: HashMap<&str, &str> = HashMap::from([
        ("TESSERA_LISTEN", "0.0.0.0:9000"),
        ("TESSERA_HEARTBEAT_MS", "250"),
        ("TESSERA_CLUSTER", "prod"),
    ]);
    let cfg = CoordinatorConfig::load(Some(Path::new(EXAMPLE)), |k| {
        env.get(k).map(|v| v.to_string())
    })
    .unwrap();
    assert_eq!(cfg.listen.to_string(), "0.0.0.0:9000");
    assert_eq!(cfg.heartbeat_ms, 250);
    assert_eq!(cfg.cluster, "prod");
}

#[test]
fn unknown_keys_and_bad_values_are_clear_errors() {
    let path = write("typo.toml", "listen = \"127.0.0.1:7400\"\nheartbeat = 5\n");
    let err = CoordinatorConfig::load(Some(&path), no_env)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("heartbeat") && err.contains("known keys"),
        "{err}"
    );

    let path = write("addr.toml", "listen = \"nowhere\"\n");
    let err = CoordinatorConfig::load(Some(&path), no_env)
        .unwrap_err()
        .to_string();
    assert!(err.contains("addr.toml"), "{err}");

    let path = write(
        "timeouts.toml",
        "heartbeat_ms = 1000\nworker_timeout_ms = 500\n",
    );
    let err = CoordinatorConfig::load(Some(&path), no_env)
        .unwrap_err()
        .to_string();
    assert!(err.contains("worker_timeout_ms"), "{err}");

    let err = CoordinatorConfig::load(Some(Path::new("/nonexistent/cluster.toml")), no_env)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no such file"), "{err}");

    let err = CoordinatorConfig::load(None, |k| {
        (k == "TESSERA_HEARTBEAT_MS").then(|| "soon".to_string())
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("heartbeat_ms"), "{err}");
}
