//! Every command of the three binaries (`tessera` and its subcommands at
//! every depth, `coordinator`, `worker`) answers `--help`, and every flag
//! and argument there has a description. The binaries are debug builds, so
//! each `--help` also runs clap's own checks of that command's arguments
//! (unique names, valid defaults), which clap makes only when a command is
//! first built.

use std::process::Command;

/// `--help` of `binary` with `path` (subcommands), checked to succeed.
fn help(binary: &str, path: &[String]) -> String {
    let out = Command::new(binary)
        .args(path)
        .arg("--help")
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{binary} {} --help failed: {}{}",
        path.join(" "),
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The lines of a help section (`Commands:`, `Options:`, `Arguments:`).
fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| l.trim_end() != heading)
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with(' '))
        .filter(|l| !l.is_empty())
        .collect()
}

/// How far a line is indented.
fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Entries of a section (a flag, an argument or a command) whose
/// description is empty: nothing after the entry on its line and no more
/// deeply indented line under it.
fn undescribed(lines: &[&str]) -> Vec<String> {
    let entry_indent = lines.iter().map(|l| indent(l)).min().unwrap_or(0);
    let mut missing = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if indent(line) > entry_indent + 4 {
            continue;
        }
        let entry = line.trim();
        // The text after the entry: on its line past two spaces, else on
        // the next, more deeply indented line. clap's own notes
        // (`[default: 7]`, `[possible values: ...]`) say nothing of what
        // the flag is for.
        let same_line = entry.split_once("  ").map(|(_, rest)| rest.trim());
        let next_line = lines
            .get(i + 1)
            .filter(|next| indent(next) > entry_indent + 4)
            .map(|next| next.trim());
        let text = same_line.or(next_line).unwrap_or("");
        if text.is_empty() || text.starts_with('[') {
            missing.push(entry.to_string());
        }
    }
    missing
}

/// The subcommands a help text lists (without clap's own `help`).
fn subcommands(text: &str) -> Vec<String> {
    section(text, "Commands:")
        .iter()
        .filter(|l| indent(l) <= 4)
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

/// Checks `binary path...` and every subcommand under it; returns how
/// many commands it checked.
fn check_tree(binary: &str, path: Vec<String>, problems: &mut Vec<String>) -> usize {
    let text = help(binary, &path);
    for heading in ["Options:", "Arguments:", "Commands:"] {
        for entry in undescribed(&section(&text, heading)) {
            problems.push(format!("{binary} {}: {entry}", path.join(" ")));
        }
    }
    let mut checked = 1;
    for sub in subcommands(&text) {
        let mut deeper = path.clone();
        deeper.push(sub);
        checked += check_tree(binary, deeper, problems);
    }
    checked
}

#[test]
fn every_command_and_flag_is_described() {
    let mut problems = Vec::new();
    let tessera = check_tree(env!("CARGO_BIN_EXE_tessera"), Vec::new(), &mut problems);
    check_tree(env!("CARGO_BIN_EXE_coordinator"), Vec::new(), &mut problems);
    check_tree(env!("CARGO_BIN_EXE_worker"), Vec::new(), &mut problems);
    // tessera, its 13 commands and `certs init`.
    assert!(tessera >= 15, "only {tessera} tessera commands found");
    assert!(
        problems.is_empty(),
        "flags, arguments or commands without a description:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_checker_sees_a_missing_description() {
    let lines = [
        "      --devices <DEVICES>",
        "          Device kinds to serve",
        "      --cluster <CLUSTER>",
        "          ",
        "      --once",
        "      --seed <SEED>",
        "          [default: 7]",
        "  -h, --help     Print help",
        "  <MODEL>  [possible values: a, b]",
    ];
    assert_eq!(
        undescribed(&lines),
        [
            "--cluster <CLUSTER>",
            "--once",
            "--seed <SEED>",
            "<MODEL>  [possible values: a, b]"
        ]
    );
}
