//! The table-less outbox: a transactional `pg_logical_emit_message` whose content is a JSON
//! object with members named like the outbox columns. Member values are taken as raw slices of
//! the content, so a JSON payload is forwarded byte-for-byte, as a jsonb column's would be.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use serde::de::{Deserialize, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::fields::{oid, Columns, Kind, Role, Source, Value};
use super::MappingError;
use crate::source::pgoutput::{Column, Message, Relation, Tuple, TupleValue};

/// A message's JSON members, named like the columns.
pub(super) struct MessageSource<'c> {
    members: Vec<(Cow<'c, str>, Bytes)>,
}

impl<'c> MessageSource<'c> {
    /// The members of the JSON object `content`, in order (the first of a repeated name wins).
    pub(super) fn parse(content: &'c Bytes) -> Result<Self, String> {
        let mut deserializer = serde_json::Deserializer::from_slice(content);
        RawMembers { content }
            .deserialize(&mut deserializer)
            .and_then(|members| deserializer.end().map(|()| members))
            .map(|members| MessageSource { members })
            .map_err(|e| describe(content, e))
    }

    fn member(
        &self,
        name: &str,
        is_payload: bool,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError> {
        let Some((_, raw)) = self.members.iter().find(|(n, _)| n == name) else {
            return Ok(None);
        };
        let kind = match raw.first() {
            Some(b'n') | None => return Ok(None),
            // The payload is the member's JSON text, as a jsonb column's would be.
            _ if is_payload => Kind::Json,
            Some(b'"') => {
                let text: String =
                    serde_json::from_slice(raw).map_err(|e| MappingError::InvalidValue {
                        event_id: event_id.to_string(),
                        column: name.to_string(),
                        reason: e.to_string(),
                    })?;
                return Ok(Some(Value {
                    bytes: Bytes::from(text),
                    kind: Kind::Text,
                }));
            }
            Some(b't' | b'f') => Kind::Text,
            Some(b'{' | b'[') => Kind::Json,
            Some(_) => Kind::Integer,
        };
        Ok(Some(Value {
            bytes: raw.clone(),
            kind,
        }))
    }
}

/// Why `content` is not a JSON object of members: not JSON at all, JSON but not an object, or
/// a member name that is not a string Rust can hold (a lone surrogate escape).
fn describe(content: &[u8], error: serde_json::Error) -> String {
    if let Err(e) = serde_json::from_slice::<IgnoredAny>(content) {
        return format!("content is not JSON ({e})");
    }
    if content.trim_ascii_start().first() != Some(&b'{') {
        return "content is not a JSON object".into();
    }
    format!("bad member name ({error})")
}

/// Reads a JSON object's members in order: names borrowed from `content` unless escaped,
/// values as raw slices of it.
struct RawMembers<'c> {
    content: &'c Bytes,
}

impl<'c> DeserializeSeed<'c> for RawMembers<'c> {
    type Value = Vec<(Cow<'c, str>, Bytes)>;

    fn deserialize<D: Deserializer<'c>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'c> Visitor<'c> for RawMembers<'c> {
    type Value = Vec<(Cow<'c, str>, Bytes)>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'c>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::with_capacity(8);
        while let Some(MemberName(name)) = map.next_key()? {
            let raw: &'c RawValue = map.next_value()?;
            members.push((name, self.content.slice_ref(raw.get().as_bytes())));
        }
        Ok(members)
    }
}

/// A member name, borrowed from the content when it has no escapes.
struct MemberName<'c>(Cow<'c, str>);

impl<'c> Deserialize<'c> for MemberName<'c> {
    fn deserialize<D: Deserializer<'c>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl<'c> Visitor<'c> for NameVisitor {
            type Value = MemberName<'c>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, name: &'c str) -> Result<Self::Value, E> {
                Ok(MemberName(Cow::Borrowed(name)))
            }
            fn visit_str<E>(self, name: &str) -> Result<Self::Value, E> {
                Ok(MemberName(Cow::Owned(name.to_string())))
            }
        }
        deserializer.deserialize_str(NameVisitor)
    }
}

impl Source for MessageSource<'_> {
    fn get(
        &self,
        columns: &Columns,
        role: Role,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError> {
        match columns.of(role) {
            Some(name) => self.member(name, role == Role::Payload, event_id),
            None => Ok(None),
        }
    }

    fn extra(
        &self,
        columns: &Columns,
        i: usize,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError> {
        match columns.extra(i) {
            Some(name) => self.member(name, false, event_id),
            None => Ok(None),
        }
    }
}

/// A logical message as a one-column row (`content`, json) of a relation named after its
/// prefix in namespace `pg_logical_emit_message`: lets row-shaped consumers such as dead
/// letters carry it.
pub fn message_as_row(message: &Message) -> (Relation, Tuple) {
    let relation = Relation {
        id: 0,
        namespace: "pg_logical_emit_message".into(),
        name: message.prefix.clone(),
        replica_identity: b'n',
        columns: vec![Column {
            flags: 0,
            name: "content".into(),
            type_oid: oid::JSON,
            type_modifier: -1,
        }],
    };
    (
        relation,
        Tuple(vec![TupleValue::Text(message.content.clone())]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::test_support::*;

    #[test]
    fn transactional_messages_with_the_prefix_become_events() {
        let m = mapping(|c| c.message_prefix = Some("outbox".into()));
        assert!(m.messages_enabled());
        let content = r#" { "id" : "m-1", "aggregatetype": "order", "aggregateid": 42,
            "type": "Shipped", "payload": {"b": [1, "}"], "a": "x"}, "extra": null } "#;
        let msg = message(true, "outbox", content);
        assert_eq!(m.route_message(&msg), MessageRoute::Event);
        let event = m.message_event(&msg, 99).unwrap();
        assert_eq!(event.id, "m-1");
        assert_eq!(event.record.topic, "outbox.event.order");
        assert_eq!(&event.record.key[..], b"m-1");
        assert_eq!(event.record.partition_key.as_deref(), Some(&b"42"[..]));
        assert_eq!(
            event.record.payload.as_deref(),
            Some(&br#"{"b": [1, "}"], "a": "x"}"#[..])
        );
        assert_eq!(event.record.timestamp_ms, Some(99));
        assert_eq!(headers(&event.record)[1], ("type", &b"Shipped"[..]));

        assert_eq!(
            m.route_message(&message(true, "other", content)),
            MessageRoute::Ignored
        );
        assert_eq!(
            m.route_message(&message(false, "outbox", content)),
            MessageRoute::NonTransactional { rejected_total: 1 }
        );
        assert_eq!(
            m.route_message(&message(false, "outbox", content)),
            MessageRoute::NonTransactional { rejected_total: 2 }
        );
        assert_eq!(m.non_transactional_messages(), 2);
        assert_eq!(
            default_mapping().route_message(&message(true, "", content)),
            MessageRoute::Ignored
        );
        assert!(!default_mapping().messages_enabled());
    }

    #[test]
    fn bad_message_content_is_a_mapping_error() {
        let m = mapping(|c| {
            c.message_prefix = Some("outbox".into());
            c.timestamp_column = Some("at".into());
        });
        for (content, expect) in [
            ("not json", "not JSON"),
            ("[1]", "not a JSON object"),
            (r#"{"id": "x"}"#, "aggregatetype"),
            (
                r#"{"id":"x","aggregatetype":"o","aggregateid":"1","type":"t","payload":{},"at":"soon"}"#,
                "ISO timestamp",
            ),
        ] {
            let err = m
                .message_event(&message(true, "outbox", content), 0)
                .unwrap_err();
            assert!(err.to_string().contains(expect), "{content}: {err}");
        }
        let ok = r#"{"id":"x","aggregatetype":"o","aggregateid":"1","type":"t","payload":"s","at":1700000000000}"#;
        let event = m.message_event(&message(true, "outbox", ok), 0).unwrap();
        assert_eq!(event.record.timestamp_ms, Some(1_700_000_000_000));
        assert_eq!(event.record.payload.as_deref(), Some(&b"\"s\""[..]));
        let null_payload =
            r#"{"id":"x","aggregatetype":"o","aggregateid":"1","type":"t","payload":null}"#;
        assert!(matches!(
            m.message_event(&message(true, "outbox", null_payload), 0),
            Err(MappingError::NullPayload { .. })
        ));
    }

    #[test]
    fn message_as_row_keeps_the_content() {
        let (rel, tuple) = message_as_row(&message(true, "outbox", "{}"));
        assert_eq!(rel.name, "outbox");
        assert_eq!(rel.columns[0].name, "content");
        assert_eq!(tuple.0, vec![text("{}")]);
    }

    #[test]
    fn json_members_are_raw_slices() {
        let text = Bytes::from_static(br#"{"a":"x\"}","b" : [ {"c": "]"} ] ,"d":-1.5e3,"e":true}"#);
        let members = MessageSource::parse(&text).unwrap().members;
        let shown: Vec<(&str, &[u8])> = members.iter().map(|(k, raw)| (&**k, &raw[..])).collect();
        assert_eq!(
            shown,
            vec![
                ("a", &br#""x\"}""#[..]),
                ("b", br#"[ {"c": "]"} ]"#),
                ("d", b"-1.5e3"),
                ("e", b"true"),
            ]
        );
        assert!(MessageSource::parse(&Bytes::from_static(b"{}"))
            .unwrap()
            .members
            .is_empty());
    }
}
