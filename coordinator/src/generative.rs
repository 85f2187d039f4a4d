//! A generative network on the coordinator: its spec (tokenizer, chat
//! template, limits), checked when it loads and handed to requesters,
//! which tokenize and drive generations themselves (the coordinator takes
//! no part in a generation); and its state pairs, which every routing
//! table carries.

use tessera_common::generation::feed::Feed;
use tessera_common::graph::{Graph, StatePair};
use tessera_common::wire::generate::GenerationSpec;
use tessera_common::wire::routes::Signature;

use crate::CoordinatorError;

/// A generative network's spec and state pairs.
#[derive(Debug, Clone)]
pub struct Generative {
    pub spec: GenerationSpec,
    pub state: Vec<StatePair>,
}

/// Checks that `graph` can be fed for generation and that `spec`'s
/// tokenizer and chat template parse (at load, rather than at the first
/// generation).
pub fn check(spec: &GenerationSpec, graph: &Graph) -> Result<Generative, CoordinatorError> {
    let bad = |e: String| CoordinatorError::Model(format!("not generative: {e}"));
    let state = graph.state_pairs().map_err(|e| bad(e.to_string()))?;
    Feed::new(&Signature::of(graph), &state).map_err(|e| bad(e.to_string()))?;
    tokenizers::Tokenizer::from_bytes(spec.tokenizer_json.as_bytes())
        .map_err(|e| bad(format!("tokenizer.json: {e}")))?;
    if let Some(template) = &spec.chat_template {
        let mut env = minijinja::Environment::new();
        env.add_template("chat", template)
            .map_err(|e| bad(format!("the chat template does not parse: {e}")))?;
    }
    Ok(Generative {
        spec: spec.clone(),
        state,
    })
}
