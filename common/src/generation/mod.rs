//! Text generation's rules, free of I/O: what a generative network is fed
//! ([`feed`]), drawing the next token from a row's logits ([`sample`], on
//! the stage that makes them), batching the sequences' steps of one copy
//! ([`batcher`]) and releasing their text ([`emitter`]), both as pure
//! state machines (the requester drives them).

pub mod batcher;
pub mod emitter;
pub mod feed;
pub mod sample;
