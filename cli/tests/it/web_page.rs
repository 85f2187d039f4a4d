//! The cluster page at `/` in a real browser (Debian's chromium, driven by
//! selenium: `tests/python/page_test.py`), on real clusters: rec split over
//! two workers drawn as subgraph boxes on both, its live figures moving
//! under load, a killed worker shown lost within 3 s and the picture
//! drawn again after the re-plan; SmolLM2's playground text equal to
//! onnxruntime-genai's greedy text; with tokens on, a token prompt and
//! no data. Screenshots go to `target/page-screenshots/`. The JSON
//! documents behind it are checked against `tessera cluster --json` and
//! `tessera models --json`.
//!
//! Without chromium the browser tests are skipped, unless
//! `TESSERA_BROWSER_TESTS=required` (scripts/test.sh sets it when it
//! installed chromium).

use crate::util;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use util::cluster::Cluster;
use util::kserve::{free_port, second_half_on};

/// One browser test at a time: the lost-worker test times the page's
/// answer, which a sibling's model loading on the same two cores slows.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}

fn shots() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/page-screenshots"
    ))
}

/// Whether the browser tests can run here (else they are skipped, or fail
/// when required).
fn browser_present() -> bool {
    let found = ["/usr/bin/chromium", "/usr/bin/chromedriver"]
        .iter()
        .all(|p| std::path::Path::new(p).exists())
        && Command::new("python3")
            .args(["-c", "import selenium"])
            .status()
            .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var("TESSERA_BROWSER_TESTS").as_deref() != Ok("required"),
            "TESSERA_BROWSER_TESTS=required but chromium, chromedriver or selenium is missing"
        );
        eprintln!("skipped: no chromium, chromedriver or selenium (scripts/test.sh installs them)");
    }
    found
}

/// Runs `page_test.py MODE URL ARGS...`; a failure fails the test with its
/// output.
fn page_test(mode: &str, url: &str, args: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/python/page_test.py");
    let shots = shots().join(mode);
    let out = Command::new("python3")
        .arg(script)
        .args([mode, url, "--shots", shots.to_str().unwrap()])
        .args(args)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "page_test.py {mode} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until `url`'s front door says every model is deployed.
fn wait_ready(url: &str) {
    let started = Instant::now();
    loop {
        let ok = Command::new("curl")
            .args(["-sf", "-o", "/dev/null", &format!("{url}/v2/health/ready")])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "{url} never became ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn curl_json(url: &str) -> serde_json::Value {
    let out = Command::new("curl").args(["-sf", url]).output().unwrap();
    assert!(out.status.success(), "GET {url} failed");
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// rec pinned half to node-a and half to node-b; node-c takes node-b's
/// half when it is lost.
fn rec_config(port: u16) -> String {
    let rec = util::model("ch_PP-OCRv4_rec_infer.onnx");
    let shapes = BTreeMap::from([("x".to_string(), vec![1, 3, 48, 320])]);
    format!(
        "http_listen = \"127.0.0.1:{port}\"\n\
         [models.rec]\npath = {:?}\ndevices = \"HETERO:node-a/CPU,node-b/CPU,node-c/CPU\"\n\
         shapes = {{ x = [1, 3, 48, 320] }}\naffinity = {}\n",
        rec.display().to_string(),
        second_half_on(&rec, &shapes, "node-b"),
    )
}

#[test]
fn the_page_draws_the_split_its_live_figures_and_a_lost_worker() {
    if !browser_present() {
        return;
    }
    let _one = one_at_a_time();
    let port = free_port();
    let cluster = Cluster::start_configured(
        "web-page-split",
        &[("node-a", "CPU"), ("node-b", "CPU"), ("node-c", "CPU")],
        1,
        &rec_config(port),
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&url);
    let node_b = cluster.workers[1].pid().to_string();
    page_test("split", &url, &["--kill-pid", &node_b]);
}

#[test]
fn the_api_documents_equal_the_clis_json() {
    let port = free_port();
    // node-c runs a front door of its own: the same page and documents.
    let worker_door = format!("127.0.0.1:{}", free_port());
    let door: &[&str] = &["--http-listen", &worker_door];
    let cluster = Cluster::start_configured_with_args(
        "web-page-api",
        &[
            ("node-a", "CPU", &[]),
            ("node-b", "CPU", &[]),
            ("node-c", "CPU", door),
        ],
        1,
        &rec_config(port),
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&url);
    let worker_url = format!("http://{worker_door}");
    wait_ready(&worker_url);
    let mut args = vec!["cluster".to_string(), "--json".to_string()];
    args.extend(cluster.client_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out, err) = util::tessera(&args);
    assert!(ok, "tessera cluster --json: {err}");
    let cli: serde_json::Value = serde_json::from_str(&out).expect("cluster JSON");
    let api = curl_json(&format!("{url}/api/cluster"));
    let names = |doc: &serde_json::Value| -> Vec<String> {
        let workers = doc["workers"].as_array().expect("workers");
        workers
            .iter()
            .map(|w| w["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&cli), ["node-a", "node-b", "node-c"]);
    assert_eq!(names(&api), names(&cli));
    let cpu = &api["workers"][0]["devices"][0];
    assert_eq!(cpu["device"], "CPU");
    assert!(cpu["memory"]["stages"].as_u64().unwrap() > 0, "{cpu}");

    let mut args = vec!["models".to_string(), "--json".to_string()];
    args.extend(cluster.client_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out, err) = util::tessera(&args);
    assert!(ok, "tessera models --json: {err}");
    let cli: serde_json::Value = serde_json::from_str(&out).expect("models JSON");
    let api = curl_json(&format!("{url}/api/models"));
    for doc in [&cli, &api] {
        let rec = &doc["models"][0];
        assert_eq!(rec["name"], "rec");
        assert_eq!(rec["state"], "READY");
        assert_eq!(
            rec["inputs"][0]["shape"],
            serde_json::json!([1, 3, 48, 320])
        );
        let subgraphs = rec["plan"]["subgraphs"].as_array().expect("subgraphs");
        let hosts: Vec<&str> = subgraphs
            .iter()
            .filter_map(|s| s["host"].as_str())
            .collect();
        assert!(
            hosts.contains(&"node-a") && hosts.contains(&"node-b"),
            "{hosts:?}"
        );
        let edge = subgraphs
            .iter()
            .find_map(|s| s["inputs"].as_array()?.first().cloned());
        assert!(edge.is_some_and(|e| e["bytes"].as_u64().unwrap_or(0) > 0));
    }
    // One subgraph's nodes, with op types and why each runs where it does.
    let nodes = curl_json(&format!("{url}/api/models/rec/subgraphs/0"));
    let first = &nodes["nodes"][0];
    assert!(
        first["op_type"].as_str().is_some_and(|t| !t.is_empty()),
        "{first}"
    );
    assert!(first["decision"]["rule"].is_string(), "{first}");
    // An unknown subgraph or model is a 404.
    for missing in [
        "/api/models/rec/subgraphs/99",
        "/api/models/nope/subgraphs/0",
    ] {
        let status = Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &format!("{url}{missing}"),
            ])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&status.stdout), "404", "{missing}");
    }
    // The live document names the model once the front door has sampled
    // its load (every second).
    let started = Instant::now();
    loop {
        let live = curl_json(&format!("{url}/api/live"));
        if live["models"][0]["name"] == "rec" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{live}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // A worker's front door serves the page and the same documents.
    let page = Command::new("curl")
        .args(["-sf", &format!("{worker_url}/")])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&page.stdout).contains("<title>Tessera</title>"));
    let doc = curl_json(&format!("{worker_url}/api/cluster"));
    assert_eq!(names(&doc), ["node-a", "node-b", "node-c"]);
    let doc = curl_json(&format!("{worker_url}/api/models"));
    let subgraphs = doc["models"][0]["plan"]["subgraphs"]
        .as_array()
        .map_or(0, Vec::len);
    assert!(subgraphs >= 2, "{doc}");
}

#[test]
fn the_playground_generates_onnxruntime_genais_greedy_text() {
    if !browser_present() {
        return;
    }
    let _one = one_at_a_time();
    let model = util::model("smollm2-135m-instruct");
    let port = free_port();
    let config = format!(
        "http_listen = \"127.0.0.1:{port}\"\n[models.smollm2]\npath = {:?}\ndevices = \"CPU\"\n\
         context = 256\nmax_sequences = 2\n",
        model.display().to_string()
    );
    let _cluster =
        Cluster::start_configured("web-page-playground", &[("node-a", "CPU")], 1, &config);
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&url);
    page_test(
        "playground",
        &url,
        &["--model", "smollm2", "--folder", model.to_str().unwrap()],
    );
}

#[test]
fn with_tokens_on_the_page_asks_for_one_and_shows_nothing() {
    if !browser_present() {
        return;
    }
    let _one = one_at_a_time();
    const TOKEN: &str = "page-test-token";
    let port = free_port();
    let secrets = util::Scratch::new("web-page-tokens");
    let tokens = secrets.join("tokens.txt");
    std::fs::write(&tokens, format!("{TOKEN}\n")).unwrap();
    let config = format!(
        "http_listen = \"127.0.0.1:{port}\"\n[serving]\ntokens_file = {:?}\n",
        tokens.display().to_string()
    );
    let _cluster = Cluster::start_configured(
        "web-page-tokens",
        &[("node-a", "CPU"), ("node-b", "CPU")],
        1,
        &config,
    );
    let url = format!("http://127.0.0.1:{port}");
    wait_ready(&url);
    page_test("tokens", &url, &["--token", TOKEN]);
}
