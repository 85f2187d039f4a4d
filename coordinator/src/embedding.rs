//! An embedding network on the coordinator: its spec checked when it
//! loads (the tokenizer parses; the graph takes `input_ids` and
//! `attention_mask`, and `token_type_ids` if anything, as int64, and gives
//! token vectors) and handed to requesters, which tokenize and pool
//! themselves (the coordinator takes no part in a request).

use std::sync::Arc;

use tessera_common::graph::Graph;
use tessera_common::onnx::ElemType;
use tessera_common::wire::control::LoadRequest;
use tessera_common::wire::embed::EmbeddingSpec;
use tessera_common::wire::routes::{Signature, TensorSig};

use crate::CoordinatorError;

/// The inputs an embedding model may take; the first two it must.
pub const INPUTS: [&str; 3] = ["input_ids", "attention_mask", "token_type_ids"];

/// A load's embedding spec checked against its graph (none when it does
/// not embed).
pub fn checked(
    request: &LoadRequest,
    graph: &Graph,
) -> Result<Option<Arc<EmbeddingSpec>>, CoordinatorError> {
    match (&request.embedding, &request.generation) {
        (None, _) => Ok(None),
        (Some(_), Some(_)) => Err(CoordinatorError::Model(
            "a model either generates or embeds, not both".into(),
        )),
        (Some(spec), None) => Ok(Some(Arc::new(check(spec, graph)?))),
    }
}

/// Checks `spec` against `graph`; the spec with its output named (the one
/// output of rank 3 when the config names none).
pub fn check(spec: &EmbeddingSpec, graph: &Graph) -> Result<EmbeddingSpec, CoordinatorError> {
    let bad = |e: String| CoordinatorError::Model(format!("not an embedding model: {e}"));
    if spec.tokenizer_json.is_empty() {
        return Err(bad(format!(
            "no tokenizer was read (embedding.tokenizer = {:?})",
            spec.tokenizer_path
        )));
    }
    tokenizers::Tokenizer::from_bytes(spec.tokenizer_json.as_bytes())
        .map_err(|e| bad(format!("its tokenizer: {e}")))?;
    let signature = Signature::of(graph);
    for input in &signature.inputs {
        if !INPUTS.contains(&input.name.as_str()) {
            return Err(bad(format!(
                "input '{}' is none of {}",
                input.name,
                INPUTS.join(", ")
            )));
        }
        if input.elem.is_some_and(|e| e != ElemType::INT64.0) {
            return Err(bad(format!("input {} is not int64", input.type_string())));
        }
    }
    for wanted in &INPUTS[..2] {
        if !signature.inputs.iter().any(|i| i.name == *wanted) {
            return Err(bad(format!("it has no input '{wanted}'")));
        }
    }
    let output = token_vectors(spec, &signature.outputs).map_err(bad)?;
    Ok(EmbeddingSpec {
        output,
        ..spec.clone()
    })
}

/// The output of the token vectors: the one named, else the one of rank
/// 3.
fn token_vectors(spec: &EmbeddingSpec, outputs: &[TensorSig]) -> Result<String, String> {
    let rank = |o: &TensorSig| o.shape.as_ref().map(Vec::len);
    if !spec.output.is_empty() {
        let o = outputs
            .iter()
            .find(|o| o.name == spec.output)
            .ok_or_else(|| format!("it has no output '{}'", spec.output))?;
        if rank(o).is_some_and(|r| r != 3) {
            return Err(format!(
                "output {} is not [batch, tokens, dims]",
                o.type_string()
            ));
        }
        return Ok(o.name.clone());
    }
    let of_rank_3: Vec<&TensorSig> = outputs.iter().filter(|o| rank(o) == Some(3)).collect();
    match of_rank_3.as_slice() {
        [one] => Ok(one.name.clone()),
        [] => Err("no output is [batch, tokens, dims]".into()),
        many => Err(format!(
            "name the token vectors' output (embedding.output): one of {}",
            many.iter()
                .map(|o| o.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}
