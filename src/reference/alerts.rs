//! `alerts.md`: every alert of `deploy/prometheus/outbox-relay.rules.yml` with its severity,
//! its `for`, its summary and its runbook link, read from the rules file itself.

use std::path::Path;

/// The rules file, relative to the repository root.
const RULES: &str = "deploy/prometheus/outbox-relay.rules.yml";
/// From `docs/src/reference/` back to the repository root, where `runbook_url`s start.
const TO_ROOT: &str = "../../../";

#[derive(Default)]
struct Alert {
    name: String,
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

/// The alerts, in file order. The file is YAML; its rules are one mapping per `- alert:` with
/// the keys on lines of their own, which is all this reads (promtool checks the rest).
fn alerts(text: &str) -> Vec<Alert> {
    let mut alerts: Vec<Alert> = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with('#') {
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
        if let Some(v) = value_of(line, "for") {
            alert.wait = v.to_string();
        } else if let Some(v) = value_of(line, "severity") {
            alert.severity = v.to_string();
        } else if let Some(v) = value_of(line, "summary") {
            alert.summary = v.to_string();
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
        "The alerting rules shipped in [`{RULES}`]({TO_ROOT}{RULES}), over the series of the \
         [metrics reference](metrics.md). Each links to its runbook. Thresholds are starting \
         points: the rules file says how to size them.\n\n"
    ));
    out.push_str("| Alert | Severity | For | Summary | Runbook |\n|---|---|---|---|---|\n");
    for alert in alerts {
        assert!(
            !alert.runbook.is_empty(),
            "alert {} in {RULES} has no runbook_url",
            alert.name
        );
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | [runbook]({TO_ROOT}{}) |\n",
            alert.name,
            alert.severity,
            alert.wait,
            alert.summary.replace('|', "\\|"),
            alert.runbook
        ));
    }
    out
}
