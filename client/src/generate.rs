//! Text generation: a model folder (the Hugging Face / onnxruntime-genai
//! layout: `model.onnx` with its external data, `tokenizer.json`,
//! `tokenizer_config.json`, `genai_config.json`) read and loaded as a
//! generative network, and [`Network::generate`] streaming its text.

use std::path::Path;

use bytes::Bytes;
use tessera_common::wire::client::{ClientReply, ClientRequest};
pub use tessera_common::wire::generate::{
    ChatMessage, FinishReason, GenerateParams, GenerateStats, GenerationSpec, Prompt,
};
use tessera_common::wire::Failure;
use tessera_common::wire::{Frame, Limits};
use tessera_net::{exchange, recv_frame};

use crate::{ClientError, Network, Operation};

/// A generative model read from its folder.
pub struct ModelFolder {
    /// `model.onnx`, external data inlined.
    pub model: Bytes,
    pub generation: GenerationSpec,
}

impl ModelFolder {
    /// Reads `dir`; each stage will keep state for up to `max_sequences`
    /// sequences at once.
    pub fn read(dir: &Path, max_sequences: u32) -> Result<ModelFolder, ClientError> {
        let generation = tessera_common::onnx::read_generation_spec(dir, max_sequences)
            .map_err(|e| ClientError::Model(e.to_string()))?;
        let model = tessera_common::onnx::load_model(dir.join("model.onnx"))
            .map_err(|e| ClientError::Model(format!("{}: {e}", dir.display())))?;
        Ok(ModelFolder {
            model: tessera_common::onnx::encode_model(&model).into(),
            generation,
        })
    }
}

/// What a generation sends.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// New tokens and their text (the text may lag a token, or hold back
    /// what could begin a stop string).
    Tokens { ids: Vec<u32>, text: String },
    /// The generation ended.
    Done(GenerateStats),
}

/// A generation under way: its events in order ([`Generation::next`]).
/// Dropping it ends the generation (the stages free its state).
pub struct Generation {
    recv: quinn::RecvStream,
    _send: quinn::SendStream,
    limits: Limits,
    done: bool,
}

impl Generation {
    /// The next event; `None` after [`Event::Done`].
    pub async fn next(&mut self) -> Result<Option<Event>, ClientError> {
        if self.done {
            return Ok(None);
        }
        let op = Operation::Generate;
        let frame = recv_frame::<ClientReply>(&mut self.recv, &self.limits)
            .await
            .map_err(|e| ClientError::Connection(e.to_string()))?;
        match frame {
            Some(Frame::Control(ClientReply::Tokens { ids, text }, _)) => {
                Ok(Some(Event::Tokens { ids, text }))
            }
            Some(Frame::Control(ClientReply::Generated(stats), _)) => {
                self.done = true;
                Ok(Some(Event::Done(stats)))
            }
            Some(Frame::Control(ClientReply::Failed(Failure { kind, error, .. }), _)) => {
                self.done = true;
                Err(ClientError::Failed {
                    op,
                    kind,
                    message: error,
                })
            }
            Some(Frame::Control(other, _)) => Err(ClientError::unexpected(op, &other)),
            Some(other) => Err(ClientError::Protocol(format!(
                "unexpected {} frame",
                other.kind().name()
            ))),
            None => Err(ClientError::Connection(
                "the coordinator closed the generation".into(),
            )),
        }
    }

    /// Every event until the end: the whole text and the figures.
    pub async fn collect(mut self) -> Result<(String, Vec<u32>, GenerateStats), ClientError> {
        let (mut text, mut ids) = (String::new(), Vec::new());
        while let Some(event) = self.next().await? {
            match event {
                Event::Tokens { ids: i, text: t } => {
                    ids.extend(i);
                    text.push_str(&t);
                }
                Event::Done(stats) => return Ok((text, ids, stats)),
            }
        }
        Err(ClientError::Protocol(
            "the generation ended without figures".into(),
        ))
    }
}

impl Network {
    /// Starts generating on this (generative) network.
    pub async fn generate(
        &self,
        prompt: Prompt,
        params: GenerateParams,
    ) -> Result<Generation, ClientError> {
        let limits = self.client.inner.limits;
        let (mut send, recv) = self.client.open().await?;
        let msg = ClientRequest::Generate {
            network: self.id,
            prompt,
            params,
        };
        exchange::send_message(&mut send, &msg, None, &limits)
            .await
            .map_err(|e| ClientError::Connection(e.to_string()))?;
        Ok(Generation {
            recv,
            _send: send,
            limits,
            done: false,
        })
    }
}
