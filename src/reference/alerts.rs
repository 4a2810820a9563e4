//! `alerts.md`: every alert of `deploy/prometheus/outbox-relay.rules.yml` with its severity,
//! its `for`, what it watches (the rule's comment), its expression with the threshold, its
//! summary and its runbook, read from the rules file itself.

use std::path::Path;

/// The rules file, relative to the repository root.
const RULES: &str = "deploy/prometheus/outbox-relay.rules.yml";
/// Where the `runbook_url`s start (they are relative to the repository root) …
const RUNBOOKS_FROM_ROOT: &str = "docs/src/";
/// … and the same place seen from `docs/src/reference/`, inside the book.
const RUNBOOKS_FROM_PAGE: &str = "../";

#[derive(Default)]
struct Alert {
    name: String,
    /// The rule's comment: what the alert watches and why.
    about: Vec<String>,
    expr: Vec<String>,
    severity: String,
    wait: String,
    summary: String,
    runbook: String,
}

/// The value of a `key: value` line, quotes removed.
fn value_of<'l>(line: &'l str, key: &str) -> Option<&'l str> {
    let rest = line.trim().strip_prefix(key)?.strip_prefix(':')?.trim();
    Some(rest.trim_matches('"'))
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The alerts, in file order. The file is YAML; its rules are one mapping per `- alert:` with
/// the keys on lines of their own and `expr` either on its line or a block (`|`, `>-`) below
/// it, which is all this reads (promtool checks the rest).
fn alerts(text: &str) -> Vec<Alert> {
    let mut alerts: Vec<Alert> = Vec::new();
    // The indentation of an `expr:` whose block is being read.
    let mut block: Option<usize> = None;
    for line in text.lines() {
        if let Some(key_indent) = block {
            if line.trim().is_empty() || indent(line) > key_indent {
                if let Some(alert) = alerts.last_mut() {
                    if !line.trim().is_empty() {
                        alert.expr.push(line.trim().to_string());
                    }
                }
                continue;
            }
            block = None;
        }
        if let Some(comment) = line.trim_start().strip_prefix('#') {
            // A comment between `- alert:` and `expr:` is the rule's own.
            if let Some(alert) = alerts.last_mut().filter(|a| a.expr.is_empty()) {
                alert.about.push(comment.trim().to_string());
            }
            continue;
        }
        if let Some(name) = line.trim().strip_prefix("- alert:") {
            alerts.push(Alert {
                name: name.trim().to_string(),
                ..Alert::default()
            });
            continue;
        }
        let Some(alert) = alerts.last_mut() else {
            continue;
        };
        if let Some(v) = value_of(line, "expr") {
            if matches!(v, "|" | "|-" | ">" | ">-") {
                block = Some(indent(line));
            } else {
                alert.expr.push(v.to_string());
            }
        } else if let Some(v) = value_of(line, "for") {
            alert.wait = v.to_string();
        } else if let Some(v) = value_of(line, "severity") {
            alert.severity = v.to_string();
        } else if let Some(v) = value_of(line, "summary") {
            alert.summary = v.replace("\\\"", "\"");
        } else if let Some(v) = value_of(line, "runbook_url") {
            alert.runbook = v.to_string();
        }
    }
    alerts
}

pub(super) fn page() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(RULES);
    let text = std::fs::read_to_string(&path).unwrap();
    let alerts = alerts(&text);
    assert!(!alerts.is_empty(), "no `- alert:` in {RULES}");
    let mut out = super::banner(&format!("`{RULES}`"));
    out.push_str("# Alerts reference\n\n");
    out.push_str(&format!(
        "The alerting rules shipped in the repository's `{RULES}` (load it into Prometheus as \
         it is, or copy the rules below), over the series of the [metrics \
         reference](metrics.md). An alert fires when its expression has returned a series \
         for as long as its *for* says (at once without one); the number in the expression is \
         the threshold. Thresholds are starting points: size the WAL ones from the disk under \
         `pg_wal` and `max_slot_wal_keep_size`, the latency one from what your consumers \
         tolerate. Every relay of one slot is scraped under one job whose name starts with \
         `outbox-relay`: rules about the slot aggregate `by (job)`, rules about one process \
         keep `instance`.\n\n"
    ));
    out.push_str("| Alert | Severity | For | Summary |\n|---|---|---|---|\n");
    for alert in &alerts {
        out.push_str(&format!(
            "| [`{}`](#{}) | {} | {} | {} |\n",
            alert.name,
            alert.name.to_lowercase(),
            alert.severity,
            alert.wait,
            alert.summary.replace('|', "\\|")
        ));
    }
    // A config section (`[outbox.serialization]`) as code: at a line's start markdown would
    // read it as a link definition and drop the line.
    let section = regex::Regex::new(r"\[([a-z_.]+)\]").unwrap();
    for alert in &alerts {
        let runbook = alert
            .runbook
            .strip_prefix(RUNBOOKS_FROM_ROOT)
            .unwrap_or_else(|| {
                panic!(
                    "alert {} in {RULES}: runbook_url `{}` is not under {RUNBOOKS_FROM_ROOT}",
                    alert.name, alert.runbook
                )
            });
        assert!(
            !alert.expr.is_empty(),
            "alert {} in {RULES} has no expr",
            alert.name
        );
        let wait = if alert.wait.is_empty() {
            "fires at once".to_string()
        } else {
            format!("fires after {}", alert.wait)
        };
        out.push_str(&format!(
            "\n### `{}`\n\n*{}* · {wait} · [runbook]({RUNBOOKS_FROM_PAGE}{runbook})\n\n",
            alert.name, alert.severity
        ));
        if !alert.about.is_empty() {
            let about = alert.about.join(" ");
            let about = section.replace_all(&about, "`[$1]`");
            out.push_str(&super::escape_angles(&about));
            out.push_str("\n\n");
        }
        out.push_str(&format!(
            "```promql\n{}\n```\n\nSummary: `{}`\n",
            alert.expr.join("\n"),
            alert.summary
        ));
    }
    out
}
