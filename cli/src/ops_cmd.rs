//! `tessera ops`: what Tessera knows about each op type (its rules) and
//! which backends run it, from one entry per op
//! ([`tessera_worker::plugins::support`]).

use std::fmt::Write;

use tessera_worker::plugins::support::{self, OpSupport};

#[derive(clap::Args)]
pub struct OpsArgs {
    /// Op types to show (default domain), e.g. `Conv LpPool`; default:
    /// every op type some rule or backend table names.
    ops: Vec<String>,
}

/// Prints one row per op type.
pub fn ops(args: OpsArgs) -> anyhow::Result<()> {
    let rows: Vec<OpSupport> = if args.ops.is_empty() {
        support::all()
    } else {
        args.ops.iter().map(|op| support::of(op)).collect()
    };
    crate::print_stdout(&table(&rows));
    Ok(())
}

/// The rows as a text table, with what the columns mean below it.
fn table(rows: &[OpSupport]) -> String {
    let width = rows
        .iter()
        .map(|r| r.op_type.len())
        .max()
        .unwrap_or(2)
        .max(2);
    let mut out = format!(
        "{:width$}  types shapes fold decompose  {:14}  {:5}  gpu kernels\n",
        "op", "cost", "tract"
    );
    let mark = |on: bool| if on { "yes" } else { "-" };
    for r in rows {
        let rule = |f: fn(&tessera_common::ops::OpEntry) -> bool| mark(r.rules.is_some_and(f));
        let cost = r.rules.map_or("-".to_string(), |e| format!("{:?}", e.cost));
        let gpu = match r.gpu_kernels {
            Some([]) => "yes (no launch)".to_string(),
            Some(kernels) => kernels.join(","),
            None => "-".to_string(),
        };
        let _ = writeln!(
            out,
            "{:width$}  {:5} {:6} {:4} {:9}  {:14}  {:5}  {gpu}",
            r.op_type,
            rule(|e| e.infers_types()),
            rule(|e| e.infers_shapes()),
            rule(|e| e.folds()),
            rule(|e| e.decomposes()),
            cost,
            mark(r.tract),
        );
    }
    out.push_str(
        "\nonnxruntime (the default CPU backend) has kernels for the standard opsets: \
         QueryNetwork asks it node by node.\n\
         A backend's QueryNetwork decides each node (its types, attributes and shapes); \
         `tessera query` shows those answers for a model.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_joins_rules_and_backends() {
        let text = table(&[support::of("MatMul"), support::of("NoSuchOp")]);
        let matmul = text
            .lines()
            .find(|l| l.starts_with("MatMul"))
            .expect("a MatMul row");
        assert!(
            matmul.contains("MatMul") && matmul.contains("gemm"),
            "{text}"
        );
        let unknown = text
            .lines()
            .find(|l| l.starts_with("NoSuchOp"))
            .expect("a row");
        assert!(!unknown.contains("yes"), "{text}");
        assert!(text.contains("onnxruntime"), "{text}");
    }
}
