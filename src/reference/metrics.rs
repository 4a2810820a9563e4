//! `metrics.md`: every metric family with its type, labels and help, from what `/metrics`
//! serves: the exposition of a `Metrics` with a series in every family.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::serve::metrics::tests::every_family;
use crate::sink::blocked::BlockReason;

/// One family of the exposition.
struct Family {
    name: String,
    kind: String,
    help: String,
    labels: Vec<String>,
}

/// What the values of a label are: a closed set listed from the code (`None`: the values the
/// exposition shows, every one of a one-hot family), or an open one described.
fn label_values(label: &str) -> Option<String> {
    let described = match label {
        "kind" => "librdkafka's error code, by its name: `MessageTimedOut`, `QueueFull`, `MessageSizeTooLarge`, … (`Other`: an error without a code)",
        "broker" => "librdkafka's name of the broker: `host:port/node id`",
        "topic" => "a Kafka topic's name",
        "subject" => "a Schema Registry subject",
        "table" => "an outbox table, as `schema.table`",
        "slot" => "`postgres.slot`",
        "publication" => "`postgres.publication`",
        "version" => "the relay's version",
        "reason" => {
            let names: Vec<String> = BlockReason::ALL
                .iter()
                .map(|r| format!("`{}`", r.name()))
                .collect();
            return Some(names.join(", "));
        }
        "state" | "status" | "quantile" => return None,
        other => panic!("describe the values of the label `{other}` in src/reference/metrics.rs"),
    };
    Some(described.to_string())
}

/// The labels of a sample line (`name{a="x",b="y"} 1`) as `(name, value)`, `le` aside (a
/// histogram's buckets: part of the type).
fn labels_of(sample: &str) -> Vec<(String, String)> {
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
            names.push((name, value[..end.min(value.len())].to_string()));
        }
        rest = value.get(end + 1..).unwrap_or("");
    }
    names
}

/// The families, and every value each label shows in the exposition.
fn families() -> (Vec<Family>, BTreeMap<String, Vec<String>>) {
    let text = every_family().render(Duration::from_secs(5));
    let mut families: Vec<Family> = Vec::new();
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
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
            for (name, value) in labels_of(line) {
                let values = seen.entry(name.clone()).or_default();
                if !values.contains(&value) {
                    values.push(value);
                }
                if !family.labels.contains(&name) {
                    family.labels.push(name);
                }
            }
        }
    }
    (families, seen)
}

pub(super) fn page() -> String {
    let mut out = super::banner("the metrics declared in `src/serve/metrics/`");
    out.push_str("# Metrics reference\n\n");
    out.push_str(
        "What `GET /metrics` serves (Prometheus text format 0.0.4) when `http.listen` is set. \
         Counters are exposed with their `_total`; a histogram as `_bucket` (label `le`), `_sum` \
         and `_count`, in seconds. A labelled family is listed before its first series, so rules \
         and dashboards find it on a fresh relay. Each label's values: [below](#label-values).\n\n",
    );
    out.push_str("| Metric | Type | Labels | Description |\n|---|---|---|---|\n");
    let (families, seen) = families();
    let mut labels_used: Vec<String> = Vec::new();
    for family in families {
        let labels: Vec<String> = family
            .labels
            .iter()
            .map(|l| format!("[`{l}`](#label-{l})"))
            .collect();
        for label in &family.labels {
            if !labels_used.contains(label) {
                labels_used.push(label.clone());
            }
        }
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            family.name,
            family.kind,
            labels.join(", "),
            family.help.replace('|', "\\|")
        ));
    }
    out.push_str("\n## Label values\n\n");
    labels_used.sort();
    for label in labels_used {
        let values = label_values(&label).unwrap_or_else(|| {
            let shown: Vec<String> = seen[&label].iter().map(|v| format!("`{v}`")).collect();
            shown.join(", ")
        });
        out.push_str(&format!(
            "- <a id=\"label-{label}\"></a>`{label}`: {values}\n"
        ));
    }
    out
}
