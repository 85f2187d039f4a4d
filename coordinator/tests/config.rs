//! `cluster.toml`: the shipped example parses to the defaults, environment
//! variables override keys, unknown keys and bad values are clear errors.

// A test crate: its helpers fail the test by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::Path;

use tessera_common::affinity::Policy;
use tessera_common::schedule::Replicas;
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

#[test]
fn named_models_and_the_http_listener_are_configured() {
    let path = write(
        "models.toml",
        "http_listen = \"127.0.0.1:8000\"\nhttp_max_body_bytes = 1024\n\
         [models.rec]\npath = \"models/rec.onnx\"\ndevices = \"HETERO:node-a/CPU,node-b/CPU\"\n\
         shapes = { x = [1, 3, 48, 320] }\naffinity = { \"conv_1\" = \"node-b/CPU\" }\n\
         replicas = 2\nmax_batch = 8\n\
         [models.MiniLM-L3]\npath = \"minilm.onnx\"\npolicy = \"cost\"\nreplicas = \"auto\"\n",
    );
    let cfg = CoordinatorConfig::load(Some(&path), no_env).unwrap();
    assert_eq!(
        cfg.front_door.http_addr().unwrap(),
        Some("127.0.0.1:8000".parse().unwrap())
    );
    assert_eq!(cfg.front_door.http_max_body_bytes, 1024);
    let rec = &cfg.models["rec"];
    assert_eq!(rec.path, Path::new("models/rec.onnx"));
    assert_eq!(rec.policy, Policy::Priority);
    assert_eq!(rec.shapes["x"], vec![1, 3, 48, 320]);
    assert_eq!(rec.affinity["conv_1"], "node-b/CPU");
    assert_eq!(rec.replicas, Replicas::Count(2));
    assert_eq!((rec.max_batch, rec.max_queue_delay_us), (8, 500));
    // Names keep their case.
    assert_eq!(cfg.models["MiniLM-L3"].policy, Policy::Cost);
    assert_eq!(cfg.models["MiniLM-L3"].replicas, Replicas::Auto);
    assert_eq!(cfg.models["MiniLM-L3"].max_batch, 0);
    let env = |k: &str| match k {
        "TESSERA_HTTP_LISTEN" => Some("0.0.0.0:9100".to_string()),
        "TESSERA_HTTP_MAX_BODY_BYTES" => Some("2048".to_string()),
        "TESSERA_REQUEST_DEADLINE_MS" => Some("5000".to_string()),
        _ => None,
    };
    let cfg = CoordinatorConfig::load(Some(&path), env).unwrap();
    assert_eq!(
        cfg.front_door.http_addr().unwrap(),
        Some("0.0.0.0:9100".parse().unwrap())
    );
    let door = &cfg.front_door;
    assert_eq!(
        (door.http_max_body_bytes, door.request_deadline_ms),
        (2048, 5000)
    );
}

#[test]
fn bad_model_tables_and_http_keys_are_clear_errors() {
    let cases = [
        ("http_listen = \"port 80\"\n", "http_listen"),
        ("http_max_body_bytes = 0\n", "http_max_body_bytes"),
        ("[models.rec]\ndevices = \"CPU\"\n", "path"),
        (
            "[models.rec]\npath = \"a.onnx\"\npolicy = \"fastest\"\n",
            "expected priority or cost",
        ),
        ("[models.rec]\npath = \"a.onnx\"\nbatch = 4\n", "batch"),
        (
            "[models.rec]\npath = \"a.onnx\"\nreplicas = 0\n",
            "at least 1",
        ),
        (
            "[models.rec]\npath = \"a.onnx\"\nreplicas = \"many\"\n",
            "'many'",
        ),
        ("[models.\"a/b\"]\npath = \"a.onnx\"\n", "model name"),
    ];
    for (i, (text, wanted)) in cases.iter().enumerate() {
        let path = write(&format!("bad-{i}.toml"), text);
        let err = CoordinatorConfig::load(Some(&path), no_env)
            .unwrap_err()
            .to_string();
        assert!(err.contains(wanted), "{text:?}: {err}");
    }
}

#[test]
fn the_serving_table_and_the_grpc_listener_are_configured() {
    let path = write(
        "serving.toml",
        "grpc_listen = \"127.0.0.1:8001\"\n\
         [serving]\nmodel_control = true\nmodel_repository = \"models\"\ntls = true\n\
         tokens_file = \"tokens.txt\"\nheader_timeout_ms = 3000\n",
    );
    let cfg = CoordinatorConfig::load(Some(&path), no_env).unwrap();
    assert_eq!(
        cfg.front_door.grpc_addr().unwrap(),
        Some("127.0.0.1:8001".parse().unwrap())
    );
    let s = &cfg.front_door.serving;
    assert!(s.model_control && s.tls);
    assert_eq!(s.model_repository, Path::new("models"));
    assert_eq!(s.tokens_file, Path::new("tokens.txt"));
    assert_eq!(s.header_timeout_ms, 3000);
    // Off by default, and switched by the environment.
    let cfg = CoordinatorConfig::load(None, no_env).unwrap();
    assert!(!cfg.front_door.serving.model_control && !cfg.front_door.serving.tls);
    let env = |k: &str| match k {
        "TESSERA_SERVING_MODEL_CONTROL" => Some("true".to_string()),
        "TESSERA_GRPC_LISTEN" => Some("0.0.0.0:8001".to_string()),
        _ => None,
    };
    let cfg = CoordinatorConfig::load(None, env).unwrap();
    assert!(cfg.front_door.serving.model_control);
    assert_eq!(
        cfg.front_door.grpc_addr().unwrap(),
        Some("0.0.0.0:8001".parse().unwrap())
    );
}

#[test]
fn bad_serving_keys_are_clear_errors() {
    let cases = [
        ("grpc_listen = \"port 81\"\n", "grpc_listen"),
        ("[serving]\ntoken_file = \"t.txt\"\n", "token_file"),
        ("[serving]\nmodel_control = \"maybe\"\n", "model_control"),
        (
            "[serving]\ntls_cert = \"a.pem\"\n",
            "tls_cert and serving.tls_key",
        ),
        ("[serving]\nheader_timeout_ms = 0\n", "header_timeout_ms"),
    ];
    for (i, (text, wanted)) in cases.iter().enumerate() {
        let path = write(&format!("bad-serving-{i}.toml"), text);
        let err = CoordinatorConfig::load(Some(&path), no_env)
            .unwrap_err()
            .to_string();
        assert!(err.contains(wanted), "{text:?}: {err}");
    }
}

#[test]
fn unknown_tessera_variables_are_named_and_an_empty_etcd_is_no_ha() {
    let names = [
        "TESSERA_LISTEN",
        "TESSERA_HA_ETDC",
        "TESSERA_SERVING_TOKENS_FILE",
        "TESSERA_SERVING_TOKEN_FILE",
        "TESSERA_HA_LEASE_TTL_S",
        "PATH",
        "TESSERA_NAMES",
    ];
    assert_eq!(
        CoordinatorConfig::unknown_env(names),
        [
            "TESSERA_HA_ETDC",
            "TESSERA_NAMES",
            "TESSERA_SERVING_TOKEN_FILE"
        ]
    );
    // A Kubernetes ConfigMap's empty `etcd` (one coordinator, no HA).
    let cfg =
        CoordinatorConfig::load(None, |k| (k == "TESSERA_HA_ETCD").then(String::new)).unwrap();
    assert!(!cfg.ha.enabled());
    let env: HashMap<&str, &str> = HashMap::from([
        ("TESSERA_HA_ETCD", "http://a:2379,http://b:2379"),
        ("TESSERA_STATE_DIR", "/var/lib/tessera"),
    ]);
    let cfg = CoordinatorConfig::load(None, |k| env.get(k).map(|v| v.to_string())).unwrap();
    assert_eq!(cfg.ha.etcd, ["http://a:2379", "http://b:2379"]);
}
