//! The reference pages of the book (`docs/src/reference/`), generated from the code they
//! describe, and the tests that keep the committed pages equal to what the code says now.
//!
//! In: the config structs' sources and defaults (`config.md`), the command line's definition
//! (`commands.md`), the metrics as `/metrics` renders them (`metrics.md`), the alerting
//! rules (`alerts.md`) and the one classification of Kafka's refusals (`kafka-refusals.md`).
//! Out: one markdown page each. Only compiled for tests: the pages are made by
//! `cargo test --lib reference`, never by the relay.
//!
//! A test fails when its committed page differs from the generated one and says how to
//! regenerate: `OUTBOX_REGENERATE_DOCS=1 cargo test --lib reference` writes every page.

use std::path::Path;

mod alerts;
mod commands;
mod config;
mod kafka_refusals;
mod metrics;

/// The variable that makes the tests write the pages instead of comparing them.
const REGENERATE: &str = "OUTBOX_REGENERATE_DOCS";

/// The line every page opens with, so nobody edits one by hand.
fn banner(source: &str) -> String {
    format!(
        "<!-- Generated from {source} by `{REGENERATE}=1 cargo test --lib reference`: do not edit. -->\n\n"
    )
}

/// Markdown text with `<` outside code spans escaped, so that `OUTBOX_RELAY__<SECTION>` is
/// not read as an HTML tag and dropped.
fn escape_angles(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_code = false;
    for c in text.chars() {
        match c {
            '`' => in_code = !in_code,
            '<' if !in_code => out.push('\\'),
            _ => {}
        }
        out.push(c);
    }
    out
}

/// Compares the committed page (`relative` to the repository root) with `generated`; with
/// `OUTBOX_REGENERATE_DOCS` set, writes it instead.
fn check_page(relative: &str, generated: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    if std::env::var_os(REGENERATE).is_some() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&path, generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed == generated {
        return;
    }
    let (line, was, now) = committed
        .lines()
        .map(Some)
        .chain(std::iter::repeat(None))
        .zip(generated.lines().map(Some).chain(std::iter::repeat(None)))
        .enumerate()
        .find(|(_, (a, b))| a != b)
        .map(|(i, (a, b))| {
            (
                i + 1,
                a.unwrap_or("(end of file)"),
                b.unwrap_or("(end of file)"),
            )
        })
        .unwrap_or((0, "", ""));
    panic!(
        "{relative} is not what the code says now (first difference at line {line}):\n  \
         committed: {was}\n  generated: {now}\n\
         Regenerate the reference pages and commit them:\n    \
         {REGENERATE}=1 cargo test --lib reference"
    );
}

#[test]
fn config_reference_matches_the_config_structs() {
    check_page("docs/src/reference/config.md", &config::page());
}

#[test]
fn commands_reference_matches_the_command_line() {
    check_page("docs/src/reference/commands.md", &commands::page());
}

#[test]
fn metrics_reference_matches_the_metrics_served() {
    check_page("docs/src/reference/metrics.md", &metrics::page());
}

#[test]
fn alerts_reference_matches_the_alerting_rules() {
    check_page("docs/src/reference/alerts.md", &alerts::page());
}

#[test]
fn kafka_refusals_reference_matches_the_one_classification() {
    check_page(
        "docs/src/reference/kafka-refusals.md",
        &kafka_refusals::page(),
    );
}
