//! The mapping's vocabulary, shared by every record part: what a field is used for
//! ([`Role`]), how its value reads ([`Kind`], [`Value`]), where an event's fields come from
//! ([`Source`]: a row or a message), the configured column of each role ([`Columns`]), and
//! [`FieldReader`], through which the parts read fields and name the column in their errors.
//! A leaf: it imports no other part.

use bytes::Bytes;

use super::MappingError;

/// Type OIDs whose text form the mapping interprets, or whose binary form it converts
/// ([`super::binary`]).
pub(super) mod oid {
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const NAME: u32 = 19;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const OID: u32 = 26;
    pub const JSON: u32 = 114;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const UUID: u32 = 2950;
    pub const JSONB: u32 = 3802;
}

/// What a mapped column (or message member) is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Id,
    AggregateType,
    AggregateId,
    Type,
    Payload,
    Key,
    Timestamp,
    Headers,
    Tracing,
    Topic,
    Partition,
    Subject,
}

impl Role {
    pub(super) const ALL: [Role; 12] = [
        Role::Id,
        Role::AggregateType,
        Role::AggregateId,
        Role::Type,
        Role::Payload,
        Role::Key,
        Role::Timestamp,
        Role::Headers,
        Role::Tracing,
        Role::Topic,
        Role::Partition,
        Role::Subject,
    ];

    pub(super) fn index(self) -> usize {
        self as usize
    }

    /// The config key naming this role's column, for error messages.
    pub(super) fn setting(self) -> &'static str {
        match self {
            Role::Id => "id_column",
            Role::AggregateType => "aggregate_type_column",
            Role::AggregateId => "aggregate_id_column",
            Role::Type => "type_column",
            Role::Payload => "payload_column",
            Role::Key => "key_column",
            Role::Timestamp => "timestamp_column",
            Role::Headers => "headers_column",
            Role::Tracing => "tracing_column",
            Role::Topic => "topic_column",
            Role::Partition => "partition_by",
            Role::Subject => "cloudevents_subject_column",
        }
    }
}

/// How a value's text is read, from its column's type (or its JSON kind in a message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Any other type, `timestamp` and `timestamptz` included: a timestamp column parses
    /// their ISO text, as it does a text column's.
    Text,
    Json,
    /// Already decoded from `\x…` to the raw bytes.
    Bytea,
    Integer,
}

impl Kind {
    pub(super) fn of_type(type_oid: u32) -> Kind {
        match type_oid {
            oid::BYTEA => Kind::Bytea,
            oid::JSON | oid::JSONB => Kind::Json,
            oid::INT2 | oid::INT4 | oid::INT8 => Kind::Integer,
            _ => Kind::Text,
        }
    }
}

/// One field's value: its bytes (text form, bytea decoded) and how to read them.
#[derive(Debug, Clone)]
pub(super) struct Value {
    pub bytes: Bytes,
    pub kind: Kind,
}

/// The configured column (or message member) of each [`Role`], `None` for an optional role
/// not configured; and the extra columns: the `header_columns`, then the CloudEvents
/// extensions.
#[derive(Debug)]
pub(super) struct Columns {
    by_role: [Option<String>; Role::ALL.len()],
    extra: Vec<String>,
}

impl Columns {
    pub(super) fn new(by_role: [Option<String>; Role::ALL.len()], extra: Vec<String>) -> Self {
        Columns { by_role, extra }
    }

    pub(super) fn of(&self, role: Role) -> Option<&str> {
        self.by_role[role.index()].as_deref()
    }

    /// The `i`-th extra column.
    pub(super) fn extra(&self, i: usize) -> Option<&str> {
        self.extra.get(i).map(String::as_str)
    }

    /// How many extra columns there are.
    pub(super) fn extra_len(&self) -> usize {
        self.extra.len()
    }
}

/// Where an event's fields come from: a row ([`super::table`]), or a message's JSON object
/// ([`super::message`]).
pub(super) trait Source {
    /// The value of a role's field; `None` when null or when the role is not configured.
    fn get(
        &self,
        columns: &Columns,
        role: Role,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError>;
    /// The value of the `i`-th extra column ([`Columns::extra`]).
    fn extra(
        &self,
        columns: &Columns,
        i: usize,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError>;
}

/// One event's fields as the record parts read them: from its source, with the configured
/// column names for the errors.
#[derive(Clone, Copy)]
pub(super) struct FieldReader<'a> {
    pub source: &'a dyn Source,
    pub columns: &'a Columns,
}

impl FieldReader<'_> {
    pub(super) fn get(&self, role: Role, event_id: &str) -> Result<Option<Value>, MappingError> {
        self.source.get(self.columns, role, event_id)
    }

    pub(super) fn extra(&self, i: usize, event_id: &str) -> Result<Option<Value>, MappingError> {
        self.source.extra(self.columns, i, event_id)
    }

    /// The configured column of `role`, or "" (for error messages).
    pub(super) fn column(&self, role: Role) -> String {
        self.columns.of(role).unwrap_or_default().to_string()
    }

    /// A configured field that must not be null.
    pub(super) fn required(&self, role: Role, event_id: &str) -> Result<Value, MappingError> {
        self.get(role, event_id)?
            .ok_or_else(|| MappingError::NullColumn {
                event_id: event_id.to_string(),
                column: self.column(role),
            })
    }

    pub(super) fn utf8<'b>(
        &self,
        bytes: &'b [u8],
        role: Role,
        event_id: &str,
    ) -> Result<&'b str, MappingError> {
        std::str::from_utf8(bytes).map_err(|_| MappingError::InvalidUtf8 {
            event_id: event_id.to_string(),
            column: self.column(role),
        })
    }

    pub(super) fn invalid(
        &self,
        role: Role,
        event_id: &str,
        reason: impl Into<String>,
    ) -> MappingError {
        MappingError::InvalidValue {
            event_id: event_id.to_string(),
            column: self.column(role),
            reason: reason.into(),
        }
    }
}

/// The named fields of one event, as topic templates, the envelope and CloudEvents read them.
pub(super) struct EventFields<'a> {
    pub id: &'a str,
    pub aggregate_type: &'a str,
    pub aggregate_id: &'a str,
    pub event_type: &'a str,
    pub table: &'a str,
    pub schema: &'a str,
}
