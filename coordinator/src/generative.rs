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
    check_texts(spec)?;
    check_graph(spec, graph)
}

/// That `spec`'s tokenizer and chat template parse. Blocking: a large
/// vocabulary's tokenizer takes a tenth of a second (a load runs it beside
/// planning).
pub fn check_texts(spec: &GenerationSpec) -> Result<(), CoordinatorError> {
    tokenizers::Tokenizer::from_bytes(spec.tokenizer_json.as_bytes())
        .map_err(|e| not_generative(format!("tokenizer.json: {e}")))?;
    if let Some(template) = &spec.chat_template {
        let mut env = minijinja::Environment::new();
        env.add_template("chat", template)
            .map_err(|e| not_generative(format!("the chat template does not parse: {e}")))?;
    }
    Ok(())
}

/// That `graph` can be fed for generation: its state pairs and inputs.
pub fn check_graph(spec: &GenerationSpec, graph: &Graph) -> Result<Generative, CoordinatorError> {
    let state = graph
        .state_pairs()
        .map_err(|e| not_generative(e.to_string()))?;
    Feed::new(&Signature::of(graph), &state).map_err(|e| not_generative(e.to_string()))?;
    Ok(Generative {
        spec: spec.clone(),
        state,
    })
}

fn not_generative(e: String) -> CoordinatorError {
    CoordinatorError::Model(format!("not generative: {e}"))
}
