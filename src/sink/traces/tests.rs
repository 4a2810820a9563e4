use std::sync::Arc;

use bytes::Bytes;

use super::*;
use crate::config::{SampleRatio, TracingConfig};

const ROW_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const ROW_SPAN: &str = "00f067aa0ba902b7";

/// Tracing towards a port nobody listens on (nothing here waits for an export).
fn traces(ratio: f64) -> Traces {
    let config = TracingConfig {
        enabled: true,
        endpoint: "http://127.0.0.1:9/v1/traces".into(),
        sample_ratio: SampleRatio(ratio),
        ..TracingConfig::default()
    };
    Traces::new(&config, Arc::new(|| 0)).unwrap()
}

fn record(headers: &[(&str, &str)]) -> Record {
    Record {
        topic: "orders".into(),
        key: Bytes::from_static(b"order-1"),
        payload: Some(Bytes::from_static(b"{}")),
        headers: headers
            .iter()
            .map(|(k, v)| (Arc::from(*k), Bytes::copy_from_slice(v.as_bytes())))
            .collect(),
        ..Record::default()
    }
}

fn header<'a>(record: &'a Record, name: &str) -> Option<&'a str> {
    let mut values = record.headers.iter().filter(|(k, _)| &**k == name);
    let value = values.next().map(|(_, v)| std::str::from_utf8(v).unwrap());
    assert!(
        values.next().is_none(),
        "two `{name}` headers: {:?}",
        record.headers
    );
    value
}

/// `00-<trace>-<span>-<flags>`, split.
fn fields(traceparent: &str) -> (String, String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00");
    (parts[1].into(), parts[2].into(), parts[3].into())
}

#[test]
fn the_row_s_context_is_the_parent_and_the_span_s_replaces_it() {
    let traces = traces(0.0);
    let row = format!("00-{ROW_TRACE}-{ROW_SPAN}-01");
    let mut r = record(&[
        ("id", "e1"),
        ("traceparent", &row),
        ("tracestate", "vendor=x"),
    ]);
    traces.start(&mut r, "e1", 1_700_000_000_000_000);
    let (trace, span, flags) = fields(header(&r, "traceparent").unwrap());
    // Sampled parent: followed even at ratio 0 (parent-based).
    assert_eq!((trace.as_str(), flags.as_str()), (ROW_TRACE, "01"));
    assert_ne!(span, ROW_SPAN);
    assert_eq!(header(&r, "tracestate"), Some("vendor=x"));
    assert_eq!(header(&r, "id"), Some("e1"), "other headers stay");
    let key = parse_span_id(header(&r, "traceparent").unwrap().as_bytes()).unwrap();
    assert!(
        traces.pending().spans.contains_key(&key),
        "the span waits for its ack"
    );
}

#[test]
fn an_unsampled_parent_makes_no_span_but_still_propagates() {
    let traces = traces(1.0);
    let row = format!("00-{ROW_TRACE}-{ROW_SPAN}-00");
    let mut r = record(&[("traceparent", &row)]);
    traces.start(&mut r, "e1", 0);
    let (trace, span, flags) = fields(header(&r, "traceparent").unwrap());
    assert_eq!((trace.as_str(), flags.as_str()), (ROW_TRACE, "00"));
    assert_ne!(span, ROW_SPAN);
    assert!(traces.pending().spans.is_empty());
}

#[test]
fn without_a_valid_context_the_span_is_a_root_subject_to_the_ratio() {
    for bad in [
        None,
        Some("garbage"),
        Some("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
    ] {
        let headers: Vec<(&str, &str)> = bad.map(|v| ("traceparent", v)).into_iter().collect();
        let sampled = traces(1.0);
        let mut r = record(&headers);
        sampled.start(&mut r, "e1", 0);
        let (trace, _, flags) = fields(header(&r, "traceparent").unwrap());
        assert_ne!(trace, ROW_TRACE);
        assert_ne!(trace, "0".repeat(32), "{bad:?}");
        assert_eq!(flags, "01", "{bad:?}");
        assert_eq!(sampled.pending().spans.len(), 1, "{bad:?}");
        let dropped = traces(0.0);
        let mut r = record(&headers);
        dropped.start(&mut r, "e1", 0);
        assert_eq!(
            fields(header(&r, "traceparent").unwrap()).2,
            "00",
            "{bad:?}"
        );
        assert!(dropped.pending().spans.is_empty(), "{bad:?}");
    }
}

#[test]
fn the_span_id_is_read_back_from_a_traceparent() {
    let tp = format!("00-{ROW_TRACE}-{ROW_SPAN}-01");
    assert_eq!(parse_span_id(tp.as_bytes()), Some(0x00f067aa0ba902b7));
    for bad in [
        "",
        "00-abc",
        "00-x-00f067aa0ba902b-01",
        "00-x-zzf067aa0ba902b7-01",
    ] {
        assert_eq!(parse_span_id(bad.as_bytes()), None, "{bad}");
    }
}
