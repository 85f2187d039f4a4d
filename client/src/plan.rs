//! The plan a load returns: the coordinator's [`PlanReport`](tessera_common::dump::PlanReport) of the
//! partition (subgraphs with their hosts and predicted costs, affinity,
//! why each node went where, what simplification did).

pub use tessera_common::dump::{NodeExplanation, PlanReport as Plan, SubgraphReport};
