//! The Kafka record the mapping builds and the sink sends.

use std::sync::Arc;

use bytes::Bytes;

use super::cloudevents;
use super::headers::ID_HEADER;

/// One Kafka record, built from an outbox event. Payload and key are shared, not copied,
/// until librdkafka copies them into its queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    pub topic: String,
    pub key: Bytes,
    /// `None` is a tombstone.
    pub payload: Option<Bytes>,
    pub headers: Vec<(Arc<str>, Bytes)>,
    /// Milliseconds since the Unix epoch; `None` lets the producer stamp it.
    pub timestamp_ms: Option<i64>,
    /// An explicit partition; `None` lets the partitioner choose from the key.
    pub partition: Option<i32>,
    /// When `partition` is `None`: bytes to choose the partition from instead of the key,
    /// exactly as the Java client's default partitioner would for a record keyed by them
    /// (`toPositive(murmur2(bytes)) % partitions`). The outbox puts the aggregate id here.
    pub partition_key: Option<Bytes>,
}

impl Record {
    /// Bytes this record holds while in flight (what the in-flight cap counts).
    pub fn size(&self) -> usize {
        self.key.len() + self.payload.as_ref().map_or(0, Bytes::len)
    }

    /// The bytes the limits on a record count, less its framing: key, value, and every
    /// header's name and value.
    pub fn wire_bytes(&self) -> usize {
        let headers: usize = self.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.size() + headers
    }
}

/// The event id a record of the relay carries, read back from its headers (in order) and value;
/// never from its key, which is the event id only while `key_column` is unset.
///
/// A CloudEvents structured record begins with its `content-type`: the id is the value's `id`
/// attribute. Any other record holds it in the first `id` header (`plain`, `envelope`, a row's
/// dead letter) or `ce_id` header (CloudEvents binary, and tombstones of both CloudEvents modes),
/// which the relay writes before the `header_columns`, so a header of theirs named `id` comes
/// later. `None` when the record has none of them (a dead letter of a row whose id could not
/// be read, or a record not written by the relay).
pub fn event_id_of<'a>(
    headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    value: Option<&[u8]>,
) -> Option<String> {
    let mut headers = headers.into_iter().peekable();
    let structured = headers.peek().is_some_and(|(name, v)| {
        *name == cloudevents::CONTENT_TYPE_HEADER
            && *v == cloudevents::STRUCTURED_CONTENT_TYPE.as_bytes()
    });
    if structured {
        #[derive(serde::Deserialize)]
        struct Attributes {
            id: String,
        }
        let event: Attributes = serde_json::from_slice(value?).ok()?;
        return Some(event.id);
    }
    headers
        .find(|(name, _)| *name == ID_HEADER || *name == cloudevents::ID_HEADER)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
}

#[cfg(test)]
mod tests {
    use super::event_id_of;
    use crate::config::Format;
    use crate::mapping::test_support::*;

    fn id_of(record: &Record) -> Option<String> {
        event_id_of(headers(record), record.payload.as_deref())
    }

    /// Keyed by the aggregate id and with a header column named `id`, in every format: the id
    /// read back is the event id.
    #[test]
    fn the_event_id_is_read_back_in_every_format_whatever_the_key() {
        for format in [
            Format::Plain,
            Format::Envelope,
            Format::CloudeventsBinary,
            Format::CloudeventsStructured,
        ] {
            let m = mapping(|c| {
                c.format = format;
                c.key_column = Some("aggregateid".into());
                c.header_columns.insert("ref".into(), "id".into());
            });
            let mut cols = debezium_columns(text("{}"));
            cols.push(("ref", 25, text("not-the-event-id")));
            let record = map_row(&m, &cols).unwrap().record;
            assert_eq!(
                &record.key[..],
                b"42",
                "{format:?}: keyed by the aggregate id"
            );
            assert_eq!(id_of(&record).as_deref(), Some(ID), "{format:?}");
        }
    }

    #[test]
    fn a_tombstone_in_structured_mode_has_the_id_in_its_headers() {
        let m = mapping(|c| {
            c.format = Format::CloudeventsStructured;
            c.null_payload = crate::config::NullPayload::Tombstone;
        });
        let record = map_row(&m, &debezium_columns(TupleValue::Null))
            .unwrap()
            .record;
        assert_eq!(record.payload, None);
        assert_eq!(id_of(&record).as_deref(), Some(ID));
    }

    #[test]
    fn a_record_without_an_id_has_none() {
        assert_eq!(event_id_of([("type", &b"T"[..])], Some(b"{}")), None);
        let structured = [(
            "content-type",
            &b"application/cloudevents+json; charset=UTF-8"[..],
        )];
        assert_eq!(event_id_of(structured, Some(b"not json")), None);
        assert_eq!(event_id_of(structured, None), None);
    }
}
