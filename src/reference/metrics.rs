//! `metrics.md`: every metric family with its type, labels and help, from what `/metrics`
//! serves: the exposition of a `Metrics` with a series in every family.

use std::time::Duration;

use crate::serve::metrics::tests::every_family;

/// One family of the exposition.
struct Family {
    name: String,
    kind: String,
    help: String,
    labels: Vec<String>,
}

/// The label names of a sample line (`name{a="x",b="y"} 1`), `le` and `quantile` aside
/// (a histogram's buckets, a summary's quantiles: part of the type).
fn label_names(sample: &str) -> Vec<String> {
    let Some(open) = sample.find('{') else {
        return Vec::new();
    };
    let close = sample.rfind('}').unwrap_or(sample.len());
    let mut names = Vec::new();
    let mut rest = &sample[open + 1..close];
    while let Some(eq) = rest.find("=\"") {
        let name = rest[..eq].trim_start_matches(',').trim().to_string();
        // Skip the quoted value (label values escape `"` as `\"`).
        let value = &rest[eq + 2..];
        let mut end = 0;
        let bytes = value.as_bytes();
        while end < bytes.len() && !(bytes[end] == b'"' && (end == 0 || bytes[end - 1] != b'\\')) {
            end += 1;
        }
        if name != "le" {
            names.push(name);
        }
        rest = value.get(end + 1..).unwrap_or("");
    }
    names
}

fn families() -> Vec<Family> {
    let text = every_family().render(Duration::from_secs(5));
    let mut families: Vec<Family> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.push(Family {
                name: name.to_string(),
                kind: String::new(),
                help: help.to_string(),
                labels: Vec::new(),
            });
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let family = families.last_mut().expect("TYPE after HELP");
            family.kind = rest
                .split_once(' ')
                .map(|(_, k)| k)
                .unwrap_or("")
                .to_string();
        } else if !line.starts_with('#') && !line.is_empty() {
            let family = families.last_mut().expect("a sample after HELP");
            for name in label_names(line) {
                if !family.labels.contains(&name) {
                    family.labels.push(name);
                }
            }
        }
    }
    families
}

pub(super) fn page() -> String {
    let mut out = super::banner("the metrics declared in `src/serve/metrics/`");
    out.push_str("# Metrics reference\n\n");
    out.push_str(
        "What `GET /metrics` serves (Prometheus text format 0.0.4) when `http.listen` is set. \
         Counters are exposed with their `_total`; a histogram as `_bucket` (label `le`), `_sum` \
         and `_count`, in seconds. A labelled family is listed before its first series, so rules \
         and dashboards find it on a fresh relay.\n\n",
    );
    out.push_str("| Metric | Type | Labels | Description |\n|---|---|---|---|\n");
    for family in families() {
        let labels: Vec<String> = family.labels.iter().map(|l| format!("`{l}`")).collect();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            family.name,
            family.kind,
            labels.join(", "),
            family.help.replace('|', "\\|")
        ));
    }
    out
}
