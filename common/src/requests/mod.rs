//! A request's life at its requester (the SDK or a front door), as pure
//! state machines with no I/O: its tries ([`tries`]: retry elsewhere, wait
//! to learn whether a worker was lost, fail) and one try in flight
//! ([`pending`]: outputs, timings and failures from several workers in any
//! order). `tessera-client` drives them over the data channel.

pub mod pending;
pub mod tries;
