//! A generative network's text side: prompts to token ids (plain text, or
//! chat messages through the model's Jinja chat template) with the
//! `tokenizers` crate, and ids back to text as they come.

use minijinja::Environment;
use tessera_common::wire::generate::{GenerationSpec, Prompt};
use tokenizers::Tokenizer;

/// Why text could not become tokens, or tokens text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    #[error("tokenizer.json: {0}")]
    Tokenizer(String),
    #[error("the chat template does not parse: {0}")]
    TemplateSyntax(String),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("cannot tokenize the prompt: {0}")]
    Tokenize(String),
    #[error("the prompt has no tokens")]
    NoTokens,
    #[error("the chat has no messages")]
    NoMessages,
    #[error("the model has no chat template (tokenizer_config.json chat_template)")]
    NoTemplate,
    #[error("the chat template failed: {0}")]
    Template(String),
    #[error("cannot decode token {token}: {reason}")]
    Decode { token: u32, reason: String },
    #[error("token {token} is not in the vocabulary of {vocabulary}")]
    UnknownToken { token: u32, vocabulary: usize },
}

pub struct Text {
    tokenizer: Tokenizer,
    /// The vocabulary's size, added tokens included (counted once).
    vocabulary: usize,
    template: Option<Environment<'static>>,
    bos_token: String,
    eos_token: String,
}

impl Text {
    pub fn new(spec: &GenerationSpec) -> Result<Text, TextError> {
        let tokenizer = Tokenizer::from_bytes(spec.tokenizer_json.as_bytes())
            .map_err(|e| TextError::Tokenizer(e.to_string()))?;
        let template = match &spec.chat_template {
            Some(source) => {
                // As Hugging Face's apply_chat_template renders: block tags
                // take their line's indentation and newline, and Python's
                // string methods (`.strip()`, `.startswith()`, …) work.
                let mut env = Environment::new();
                env.set_trim_blocks(true);
                env.set_lstrip_blocks(true);
                env.set_unknown_method_callback(
                    minijinja_contrib::pycompat::unknown_method_callback,
                );
                env.add_function("raise_exception", |msg: String| -> Result<String, _> {
                    Err(minijinja::Error::new(
                        minijinja::ErrorKind::InvalidOperation,
                        msg,
                    ))
                });
                env.add_template_owned("chat", source.clone())
                    .map_err(|e| TextError::TemplateSyntax(e.to_string()))?;
                Some(env)
            }
            None => None,
        };
        Ok(Text {
            vocabulary: tokenizer.get_vocab_size(true),
            tokenizer,
            template,
            bos_token: spec.bos_token.clone().unwrap_or_default(),
            eos_token: spec.eos_token.clone().unwrap_or_default(),
        })
    }

    /// The prompt's token ids, as the model is fed them (an empty prompt
    /// is an error).
    pub fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, TextError> {
        self.ids(prompt, None)
    }

    /// The prompt's token ids, special tokens (a BOS) added as `special`
    /// says; by default (`None`) as the model is fed them: added to plain
    /// text, not to a chat (its template writes them).
    pub fn ids(&self, prompt: &Prompt, special: Option<bool>) -> Result<Vec<u32>, TextError> {
        let (text, fed) = match prompt {
            Prompt::Text(text) => (text.clone(), true),
            Prompt::Chat(messages) => (self.render_chat(messages)?, false),
        };
        let special = special.unwrap_or(fed);
        if text.is_empty() {
            return Err(TextError::EmptyPrompt);
        }
        let encoding = self
            .tokenizer
            .encode(text.as_str(), special)
            .map_err(|e| TextError::Tokenize(e.to_string()))?;
        let ids = encoding.get_ids().to_vec();
        if ids.is_empty() {
            return Err(TextError::NoTokens);
        }
        Ok(ids)
    }

    /// Chat messages through the template, the assistant's turn opened.
    fn render_chat(
        &self,
        messages: &[tessera_common::wire::generate::ChatMessage],
    ) -> Result<String, TextError> {
        if messages.is_empty() {
            return Err(TextError::NoMessages);
        }
        let env = self.template.as_ref().ok_or(TextError::NoTemplate)?;
        let template = env
            .get_template("chat")
            .map_err(|e| TextError::Template(e.to_string()))?;
        let messages: Vec<minijinja::Value> = messages
            .iter()
            .map(|m| {
                minijinja::context! { role => m.role.clone(), content => m.content.clone() }
            })
            .collect();
        template
            .render(minijinja::context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => self.bos_token.clone(),
                eos_token => self.eos_token.clone(),
            })
            .map_err(|e| TextError::Template(e.to_string()))
    }

    /// The text of `ids` (special tokens included); an id beyond the
    /// vocabulary is an error.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TextError> {
        let vocabulary = self.vocabulary;
        if let Some(&token) = ids.iter().find(|&&id| id as usize >= vocabulary) {
            return Err(TextError::UnknownToken { token, vocabulary });
        }
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| TextError::Decode {
                token: ids.first().copied().unwrap_or_default(),
                reason: e.to_string(),
            })
    }

    /// One token's text on its own (special tokens included).
    pub fn token(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }

    /// Text as tokens come, each token's new text once (special tokens
    /// left out): no re-decoding of everything so far at every token.
    pub fn pieces(&self) -> Pieces<'_> {
        self.tokenizer.decode_stream(true)
    }
}

/// The text of tokens as they come ([`Text::pieces`]).
pub type Pieces<'a> = tokenizers::DecodeStream<
    'a,
    tokenizers::ModelWrapper,
    tokenizers::NormalizerWrapper,
    tokenizers::PreTokenizerWrapper,
    tokenizers::PostProcessorWrapper,
    tokenizers::DecoderWrapper,
>;

/// The new text `token` adds (empty while a character is unfinished).
pub fn piece(pieces: &mut Pieces<'_>, token: u32) -> Result<String, TextError> {
    pieces
        .step(token)
        .map(Option::unwrap_or_default)
        .map_err(|e| TextError::Decode {
            token,
            reason: e.to_string(),
        })
}
