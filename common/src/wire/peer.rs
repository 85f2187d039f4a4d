//! Workers' data streams: what a worker receives from its peers (and the
//! coordinator's request inputs) is tensor frames only. No control message
//! exists on this channel: [`PeerMessage`] has no values, so a control
//! frame on such a stream fails to decode and closes that stream.

/// The (empty) set of control messages on a worker's data streams.
pub type PeerMessage = super::message::NoMessage;
