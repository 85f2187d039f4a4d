//! onnxruntime-genai's greedy generations, the oracle of the text
//! generation tests (`scripts/llm/genai_generate.py`).

/// onnxruntime-genai's greedy answer for one prompt.
#[derive(Debug)]
pub struct Oracle {
    pub prompt_ids: Vec<u32>,
    pub ids: Vec<u32>,
    pub text: String,
}

/// onnxruntime-genai's greedy generations of `prompts` (as chat user
/// messages with `chat`).
pub fn genai(folder: &std::path::Path, prompts: &[&str], max_new: u32, chat: bool) -> Vec<Oracle> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/llm/genai_generate.py"
    );
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(script)
        .arg(folder)
        .args(["--max-new", &max_new.to_string()])
        .args(prompts);
    if chat {
        cmd.arg("--chat");
    }
    let out = cmd.output().expect("python3 runs");
    assert!(
        out.status.success(),
        "onnxruntime-genai: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("oracle JSON");
            let ids = |key: &str| -> Vec<u32> {
                let list = v[key].as_array().expect("ids").iter();
                list.map(|i| i.as_u64().expect("an id") as u32).collect()
            };
            Oracle {
                prompt_ids: ids("prompt_ids"),
                ids: ids("ids"),
                text: v["text"].as_str().expect("text").to_string(),
            }
        })
        .collect()
}
