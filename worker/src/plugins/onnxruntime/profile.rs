//! onnxruntime's profile (a Chrome-trace JSON array) as per-node times.
//!
//! Kernel runs are events `{"cat": "Node", "name": "<node>_kernel_time",
//! "dur": <µs>, "args": {"op_name": "Conv", ...}}`; session and fence
//! events are skipped. A fused kernel carries the name of the last node it
//! replaces (Conv+Relu runs as `relu1` with op `Conv`), and the NCHWc
//! layout pass appends `_nchwc`, which is dropped.

use std::collections::HashMap;

/// Microseconds and kernel op type by node name, summed over the run.
pub(super) fn node_times(profile: &str) -> HashMap<String, (u64, String)> {
    let mut times: HashMap<String, (u64, String)> = HashMap::new();
    let Ok(serde_json::Value::Array(events)) = serde_json::from_str(profile) else {
        tracing::debug!("onnxruntime's profile is not a JSON array");
        return times;
    };
    for e in &events {
        if e.get("cat").and_then(|c| c.as_str()) != Some("Node") {
            continue;
        }
        let Some(node) = e
            .get("name")
            .and_then(|n| n.as_str())
            .and_then(|n| n.strip_suffix("_kernel_time"))
        else {
            continue;
        };
        let node = node.strip_suffix("_nchwc").unwrap_or(node);
        let dur = e.get("dur").and_then(|d| d.as_u64()).unwrap_or(0);
        let op = e
            .pointer("/args/op_name")
            .and_then(|o| o.as_str())
            .unwrap_or("unknown");
        let entry = times
            .entry(node.to_string())
            .or_insert_with(|| (0, op.to_string()));
        entry.0 += dur;
    }
    times
}

#[cfg(test)]
mod tests {
    use super::node_times;

    #[test]
    fn reads_kernel_times_and_skips_the_rest() {
        let profile = r#"[
          {"cat":"Session","name":"model_run","dur":900,"args":{}},
          {"cat":"Node","name":"conv1_fence_before","dur":0,"args":{"op_name":"Conv"}},
          {"cat":"Node","name":"conv1_kernel_time","dur":120,"args":{"op_name":"FusedConv"}},
          {"cat":"Node","name":"relu_kernel_time","dur":7,"args":{"op_name":"Relu"}},
          {"cat":"Node","name":"relu_kernel_time","dur":3,"args":{"op_name":"Relu"}},
          {"cat":"Node","name":"pool1_nchwc_kernel_time","dur":5,"args":{"op_name":"MaxPool"}}
        ]"#;
        let t = node_times(profile);
        assert_eq!(t.len(), 3);
        assert_eq!(t["pool1"], (5, "MaxPool".to_string()));
        assert_eq!(t["conv1"], (120, "FusedConv".to_string()));
        assert_eq!(t["relu"], (10, "Relu".to_string()));
        assert!(node_times("not json").is_empty());
    }
}
