//! The record's topic: templates such as `outbox.event.{aggregatetype}` and per-aggregate-type
//! overrides. Whether a name is one Kafka accepts is config's rule (`topic_name_problem`),
//! shared with config validation.

use std::collections::{BTreeMap, HashMap};

use super::fields::{EventFields, FieldReader, Role};
use super::MappingError;
use crate::config::topic_name_problem;

/// The fields of an outbox event a topic template may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Id,
    AggregateType,
    AggregateId,
    Type,
    Table,
    Schema,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Field(Field),
}

/// A parsed topic template such as `outbox.event.{aggregatetype}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TopicTemplate {
    segments: Vec<Segment>,
}

impl TopicTemplate {
    pub(super) fn parse(template: &str) -> Result<Self, MappingError> {
        let mut segments = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                segments.push(Segment::Literal(rest[..open].to_string()));
            }
            let close = rest[open..].find('}').map(|c| open + c).ok_or_else(|| {
                MappingError::UnknownPlaceholder(template.into(), rest[open + 1..].into())
            })?;
            let name = &rest[open + 1..close];
            let field = match name {
                "id" => Field::Id,
                "aggregatetype" => Field::AggregateType,
                "aggregateid" => Field::AggregateId,
                "type" => Field::Type,
                "table" => Field::Table,
                "schema" => Field::Schema,
                other => {
                    return Err(MappingError::UnknownPlaceholder(
                        template.into(),
                        other.into(),
                    ))
                }
            };
            segments.push(Segment::Field(field));
            rest = &rest[close + 1..];
        }
        if !rest.is_empty() {
            segments.push(Segment::Literal(rest.to_string()));
        }
        Ok(TopicTemplate { segments })
    }

    pub(super) fn render(&self, event: &EventFields<'_>) -> String {
        let mut topic = String::with_capacity(64);
        for segment in &self.segments {
            match segment {
                Segment::Literal(s) => topic.push_str(s),
                Segment::Field(f) => topic.push_str(value_of(event, *f)),
            }
        }
        topic
    }
}

/// The value of a template field.
fn value_of<'a>(event: &EventFields<'a>, field: Field) -> &'a str {
    match field {
        Field::Id => event.id,
        Field::AggregateType => event.aggregate_type,
        Field::AggregateId => event.aggregate_id,
        Field::Type => event.event_type,
        Field::Table => event.table,
        Field::Schema => event.schema,
    }
}

/// The topic template and its per-aggregate-type overrides.
#[derive(Debug)]
pub(super) struct Topics {
    template: TopicTemplate,
    overrides: HashMap<String, TopicTemplate>,
}

impl Topics {
    pub(super) fn parse(
        template: &str,
        overrides: &BTreeMap<String, String>,
    ) -> Result<Self, MappingError> {
        let mut parsed = HashMap::with_capacity(overrides.len());
        for (aggregate_type, template) in overrides {
            parsed.insert(aggregate_type.clone(), TopicTemplate::parse(template)?);
        }
        Ok(Topics {
            template: TopicTemplate::parse(template)?,
            overrides: parsed,
        })
    }

    /// `topic_column` if non-null, else the aggregate type's override, else the template;
    /// checked like the broker checks it.
    pub(super) fn topic(
        &self,
        reader: FieldReader<'_>,
        fields: &EventFields<'_>,
    ) -> Result<String, MappingError> {
        let id = fields.id;
        let topic = match reader.get(Role::Topic, id)? {
            Some(v) => reader.utf8(&v.bytes, Role::Topic, id)?.to_string(),
            None => self
                .overrides
                .get(fields.aggregate_type)
                .unwrap_or(&self.template)
                .render(fields),
        };
        match topic_name_problem(&topic) {
            Some(reason) => Err(MappingError::InvalidTopic {
                event_id: id.to_string(),
                topic,
                reason,
            }),
            None => Ok(topic),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::test_support::*;

    #[test]
    fn template_placeholders() {
        let t = TopicTemplate::parse("{schema}.{table}.{type}-x").unwrap();
        let f = EventFields {
            id: "i",
            aggregate_type: "a",
            aggregate_id: "b",
            event_type: "T",
            table: "outbox",
            schema: "s",
        };
        assert_eq!(t.render(&f), "s.outbox.T-x");
        assert!(TopicTemplate::parse("x.{nope}").is_err());
        assert!(TopicTemplate::parse("x.{type").is_err());
    }

    #[test]
    fn invalid_topic_is_caught_before_sending() {
        let bound = default_mapping()
            .bind(&relation(&COLUMNS))
            .unwrap()
            .unwrap();
        let err = bound
            .to_event(&row(text("bad name!"), text("{}")), 0)
            .unwrap_err();
        assert!(matches!(err, MappingError::InvalidTopic { .. }), "{err}");
        let long = "x".repeat(240);
        let err = bound
            .to_event(&row(text(&long), text("{}")), 0)
            .unwrap_err();
        assert!(matches!(err, MappingError::InvalidTopic { .. }), "{err}");
    }

    #[test]
    fn topic_overrides_and_topic_column_choose_the_topic() {
        let m = mapping(|c| {
            c.topic = "{schema}.{table}.{aggregatetype}.{type}".into();
            c.topic_overrides
                .insert("customer".into(), "crm.{aggregateid}".into());
            c.topic_column = Some("destination".into());
        });
        let mut cols = debezium_columns(text("{}"));
        cols.push(("destination", 25, TupleValue::Null));
        assert_eq!(
            map_row(&m, &cols).unwrap().record.topic,
            "public.outbox.order.OrderCreated"
        );
        cols[1].2 = text("customer");
        assert_eq!(map_row(&m, &cols).unwrap().record.topic, "crm.42");
        cols[5].2 = text("explicit.topic");
        assert_eq!(map_row(&m, &cols).unwrap().record.topic, "explicit.topic");
        cols[5].2 = text("not a topic");
        assert!(matches!(
            map_row(&m, &cols),
            Err(MappingError::InvalidTopic { .. })
        ));
    }
}
