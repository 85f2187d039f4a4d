//! `worker.toml`: the shipped example parses; unknown keys are an error;
//! unknown devices are an error that lists what this machine has.

use std::path::Path;

use tessera_worker::daemon::config::WorkerConfig;
use tessera_worker::daemon::{self, WorkerOptions};

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/worker.toml");

#[test]
fn the_example_parses() {
    let cfg = WorkerConfig::load(Path::new(EXAMPLE)).unwrap();
    assert_eq!(cfg.devices, Some(vec!["CPU".to_string()]));
    assert_eq!(cfg.coordinator.as_deref(), Some("127.0.0.1:7400"));
    assert_eq!(cfg.mailbox, Some(64));
    assert_eq!(cfg.adopt_grace_s, Some(300.0));
    assert_eq!(cfg.drain_timeout_s, Some(20.0));
    assert_eq!(cfg.models_dirs, Some(vec!["models".into()]));
}

#[test]
fn the_front_door_keys_parse_and_a_mistyped_serving_key_is_an_error() {
    let path = std::env::temp_dir().join(format!("tessera-worker-fd-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "name = \"node-a\"\nhttp_listen = \"127.0.0.1:8010\"\ngrpc_listen = \"127.0.0.1:8011\"\n\
         http_max_body_bytes = 1024\nrequest_deadline_ms = 500\n\
         [serving]\ntokens_file = \"tokens.txt\"\nmodel_control = false\n",
    )
    .unwrap();
    let cfg = WorkerConfig::load(&path).unwrap();
    let door = &cfg.front_door;
    assert_eq!(
        door.http_addr().unwrap(),
        Some(([127, 0, 0, 1], 8010).into())
    );
    assert_eq!(
        door.grpc_addr().unwrap(),
        Some(([127, 0, 0, 1], 8011).into())
    );
    assert_eq!(
        (door.http_max_body_bytes, door.request_deadline_ms),
        (1024, 500)
    );
    assert_eq!(door.serving.tokens_file, Path::new("tokens.txt"));
    assert_eq!(cfg.name.as_deref(), Some("node-a"));
    // The one check of a front door's values, as the coordinator's.
    std::fs::write(
        &path,
        "http_max_body_bytes = 0
",
    )
    .unwrap();
    let err = WorkerConfig::load(&path).unwrap_err().to_string();
    assert!(
        err.contains("http_max_body_bytes must be positive"),
        "{err}"
    );
    std::fs::write(&path, "[serving]\ntoken_file = \"t\"\n").unwrap();
    let err = WorkerConfig::load(&path).unwrap_err().to_string();
    let _ = std::fs::remove_file(&path);
    assert!(err.contains("token_file"), "{err}");
}

#[test]
fn unknown_keys_are_an_error() {
    let path = std::env::temp_dir().join(format!("tessera-worker-{}.toml", std::process::id()));
    std::fs::write(&path, "name = \"node-a\"\ndevice = [\"CPU\"]\n").unwrap();
    let err = WorkerConfig::load(&path).unwrap_err();
    assert!(
        matches!(
            &err,
            tessera_worker::daemon::config::WorkerConfigError::UnknownKeys { keys, .. }
                if keys == &["device"]
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("known keys: name, devices"),
        "{err}"
    );
}

#[test]
fn unknown_devices_list_what_this_machine_has() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ids = tessera_net::certs::ephemeral("lab", &["node-a"]).unwrap();
    let options = WorkerOptions {
        name: "node-a".into(),
        devices: vec!["TPU".into()],
        listen: "127.0.0.1:0".parse().unwrap(),
        advertise: None,
        coordinator: "127.0.0.1:9".into(),
        reconnect: true,
        cluster: "lab".into(),
        mailbox: 4,
        cache_dir: None,
        cache_limit: 0,
        models_dirs: Vec::new(),
        config: Vec::new(),
        memory_limit: Default::default(),
        adopt_grace: tessera_worker::daemon::ADOPT_GRACE,
        drain_timeout: tessera_worker::daemon::DRAIN_TIMEOUT,
    };
    let err = rt
        .block_on(daemon::run(options, &ids[0], |_| {}))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("TPU") && err.contains("devices this machine has: CPU"),
        "{err}"
    );
}
