//! The plan in a `NetworkLoaded` message: a typed [`PlanReport`] in the
//! message, carried in the frame as its JSON document (the form
//! `<model>_subgraphs.json` has). bincode cannot carry it as is: its rules
//! are an internally tagged enum and several of its fields are left out
//! of JSON when empty, which a positional format cannot express. The
//! conversion lives here once; neither end handles the JSON.

use serde::de::Error as _;
use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serializer};

use crate::dump::PlanReport;

pub fn serialize<S: Serializer>(plan: &PlanReport, s: S) -> Result<S::Ok, S::Error> {
    let text = serde_json::to_string(plan).map_err(S::Error::custom)?;
    s.serialize_str(&text)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Box<PlanReport>, D::Error> {
    let text = String::deserialize(d)?;
    serde_json::from_str(&text)
        .map(Box::new)
        .map_err(|e| D::Error::custom(format!("plan: {e}")))
}
