//! Avro: a JSON payload to Avro binary per the subject's schema. Pure.
//!
//! The payload is plain JSON (what the application writes to the jsonb column), not Avro's
//! JSON encoding: a union member is given as its value (`"x"`, `null`), not as
//! `{"string": "x"}`. A union takes the branch of the value's own kind when it has one (an
//! integer: `int`, or `long` beyond an `int`'s range; a fraction: `double`), else its first
//! branch that holds the value as it is, else its first branch the value fits (a `float`
//! rounds only where no branch holds the number). Numbers are converted to the field's type only when the value
//! survives it: an `int` (and `date`, `time-millis`) takes an integer within
//! -2^31..2^31-1, a `long` (and the `time-micros` and timestamp types) one within
//! -2^63..2^63-1, a `float` any number within its finite range (rounded to the nearest
//! float), a `double` any number; an integer field never takes a fraction (`1.5`, `3.0`).
//! Anything else is the record's fault (reason `schema`), never wrapped to fit. Object
//! members the record does not name are ignored, missing ones take the field's default.
//!
//! The conversion is ours, guided by the schema, rather than apache-avro's
//! `Value::from(json).resolve(schema)`: that one turns a JSON integer above `i64::MAX` into a
//! negative `long` and narrows a `long` into an `int` with `as i32`, and its union resolution
//! could pick a branch that narrows.

use std::collections::HashMap;

use apache_avro::schema::{
    ArraySchema, EnumSchema, FixedSchema, MapSchema, Name, RecordSchema, ResolvedSchema,
    SchemaKind, UnionSchema,
};
use apache_avro::types::Value;
use apache_avro::Schema;
use serde_json::Value as Json;

/// A parsed Avro schema.
#[derive(Debug)]
pub struct AvroSchema(Schema);

impl AvroSchema {
    /// Parses the registry's schema text; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<AvroSchema, String> {
        let schema =
            Schema::parse_str(text).map_err(|e| format!("not a valid Avro schema: {e}"))?;
        // Every named type must be known for the conversion to follow references.
        ResolvedSchema::try_from(&schema).map_err(|e| format!("not a valid Avro schema: {e}"))?;
        Ok(AvroSchema(schema))
    }

    /// The Avro binary body of `payload` (JSON text); the error says why it does not fit.
    pub fn encode(&self, payload: &[u8]) -> Result<Vec<u8>, String> {
        let json: Json =
            serde_json::from_slice(payload).map_err(|e| format!("the payload is not JSON: {e}"))?;
        let names = ResolvedSchema::try_from(&self.0)
            .map_err(|e| format!("not a valid Avro schema: {e}"))?;
        let value = Convert {
            names: names.get_names(),
        }
        .value(&json, &self.0)
        .map_err(|e| format!("the payload does not match the Avro schema: {e}"))?;
        apache_avro::to_avro_datum(&self.0, value)
            .map_err(|e| format!("cannot encode the payload as Avro: {e}"))
    }
}

/// Why a JSON value does not fit: where (`total`, `items[3]`, `$` for the whole payload) and
/// what.
#[derive(Debug)]
struct Misfit {
    path: Vec<String>,
    reason: String,
}

impl std::fmt::Display for Misfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.reason)
        } else {
            let path: Vec<&str> = self.path.iter().rev().map(String::as_str).collect();
            write!(f, "`{}`: {}", path.join("."), self.reason)
        }
    }
}

fn misfit(reason: impl Into<String>) -> Misfit {
    Misfit {
        path: Vec::new(),
        reason: reason.into(),
    }
}

/// Adds a step to the path of an error coming out of a nested value.
fn at(step: impl Into<String>) -> impl FnOnce(Misfit) -> Misfit {
    let step = step.into();
    move |mut m| {
        m.path.push(step);
        m
    }
}

/// JSON to an Avro value already of its schema's exact type (no later resolution narrows it).
struct Convert<'a> {
    names: &'a HashMap<Name, &'a Schema>,
}

impl Convert<'_> {
    fn value(&self, json: &Json, schema: &Schema) -> Result<Value, Misfit> {
        Ok(match schema {
            Schema::Ref { name } => {
                let Some(named) = self.names.get(name) else {
                    return Err(misfit(format!(
                        "the schema names `{name}`, which it does not define"
                    )));
                };
                return self.value(json, named);
            }
            Schema::Null => match json {
                Json::Null => Value::Null,
                other => return Err(expected("null", other)),
            },
            Schema::Boolean => match json {
                Json::Bool(b) => Value::Boolean(*b),
                other => return Err(expected("a boolean", other)),
            },
            Schema::Int => Value::Int(int(json, "int")?),
            Schema::Date => Value::Date(int(json, "date")?),
            Schema::TimeMillis => Value::TimeMillis(int(json, "time-millis")?),
            Schema::Long => Value::Long(long(json, "long")?),
            Schema::TimeMicros => Value::TimeMicros(long(json, "time-micros")?),
            Schema::TimestampMillis => Value::TimestampMillis(long(json, "timestamp-millis")?),
            Schema::TimestampMicros => Value::TimestampMicros(long(json, "timestamp-micros")?),
            Schema::TimestampNanos => Value::TimestampNanos(long(json, "timestamp-nanos")?),
            Schema::LocalTimestampMillis => {
                Value::LocalTimestampMillis(long(json, "local-timestamp-millis")?)
            }
            Schema::LocalTimestampMicros => {
                Value::LocalTimestampMicros(long(json, "local-timestamp-micros")?)
            }
            Schema::LocalTimestampNanos => {
                Value::LocalTimestampNanos(long(json, "local-timestamp-nanos")?)
            }
            Schema::Float => float(json)?,
            Schema::Double => double(json)?,
            Schema::String => match json {
                Json::String(s) => Value::String(s.clone()),
                other => return Err(expected("a string", other)),
            },
            Schema::Bytes => bytes(json)?,
            Schema::Fixed(fixed_schema) => fixed(json, fixed_schema)?,
            Schema::Enum(enum_schema) => symbol(json, enum_schema)?,
            Schema::Array(ArraySchema { items, .. }) => self.array(json, items)?,
            Schema::Map(MapSchema { types, .. }) => self.map(json, types)?,
            Schema::Record(record) => self.record(json, record)?,
            Schema::Union(union) => self.union(json, union)?,
            // Types a JSON payload hardly carries (decimal, uuid, duration): apache-avro's
            // own conversion, which narrows no number into them.
            Schema::Decimal(_) | Schema::BigDecimal | Schema::Uuid | Schema::Duration => {
                if json.is_number() {
                    return Err(expected("a string", json));
                }
                Value::from(json.clone())
                    .resolve(schema)
                    .map_err(|e| misfit(e.to_string()))?
            }
        })
    }

    /// Each element of the array as `items`; a misfit names its index.
    fn array(&self, json: &Json, items: &Schema) -> Result<Value, Misfit> {
        let Json::Array(elements) = json else {
            return Err(expected("an array", json));
        };
        let values = elements
            .iter()
            .enumerate()
            .map(|(i, e)| self.value(e, items).map_err(at(format!("[{i}]"))))
            .collect::<Result<_, _>>()?;
        Ok(Value::Array(values))
    }

    /// Each member of the object as `types`; a misfit names its key.
    fn map(&self, json: &Json, types: &Schema) -> Result<Value, Misfit> {
        let Json::Object(members) = json else {
            return Err(expected("an object", json));
        };
        let values = members
            .iter()
            .map(|(k, v)| Ok((k.clone(), self.value(v, types).map_err(at(k.clone()))?)))
            .collect::<Result<_, Misfit>>()?;
        Ok(Value::Map(values))
    }

    /// Each field from its member, or its default; members the schema does not name are
    /// ignored.
    fn record(&self, json: &Json, record: &RecordSchema) -> Result<Value, Misfit> {
        let Json::Object(members) = json else {
            return Err(expected(
                &format!("an object (record `{}`)", record.name),
                json,
            ));
        };
        let mut fields = Vec::with_capacity(record.fields.len());
        for field in &record.fields {
            let value = match (members.get(&field.name), &field.default) {
                (Some(member), _) => self.value(member, &field.schema),
                // A union's default is of its first branch (the Avro specification).
                (None, Some(default)) => match &field.schema {
                    Schema::Union(union) => match union.variants().first() {
                        Some(first) => self
                            .value(default, first)
                            .map(|v| Value::Union(0, Box::new(v))),
                        None => Err(misfit("an empty union has no default")),
                    },
                    schema => self.value(default, schema),
                }
                .map_err(|m| misfit(format!("its default does not fit its schema: {m}"))),
                (None, None) => Err(misfit("missing, and the field has no default")),
            };
            fields.push((field.name.clone(), value.map_err(at(field.name.clone()))?));
        }
        Ok(Value::Record(fields))
    }

    /// The branch of the value's own kind when the union has one (apache-avro's choice), else
    /// the first branch that holds the value as it is, else the first it fits (a number
    /// rounded to a `float` only where no branch holds it: 123456789 goes to a `double` or a
    /// `long` after a `float`, not to the float 123456792).
    fn union(&self, json: &Json, union: &UnionSchema) -> Result<Value, Misfit> {
        let branches = union.variants();
        let own = kind_of(json).and_then(|kind| {
            branches
                .iter()
                .position(|b| !matches!(b, Schema::Ref { .. }) && SchemaKind::from(b) == kind)
        });
        if let Some(i) = own {
            if let Ok(v) = self.value(json, &branches[i]) {
                return Ok(Value::Union(i as u32, Box::new(v)));
            }
        }
        for as_it_is in [true, false] {
            for (i, branch) in branches.iter().enumerate() {
                match self.value(json, branch) {
                    Ok(v) if !as_it_is || holds_exactly(json, &v) => {
                        return Ok(Value::Union(i as u32, Box::new(v)))
                    }
                    Ok(_) | Err(_) => {}
                }
            }
        }
        let names: Vec<String> = branches.iter().map(branch_name).collect();
        Err(misfit(format!(
            "{} fits no branch of the union [{}]",
            describe(json),
            names.join(", ")
        )))
    }
}

/// Whether `v`, made from `json`, holds it without rounding (only a `float` or `double` made
/// from a number may not).
fn holds_exactly(json: &Json, v: &Value) -> bool {
    let x = match v {
        Value::Float(f) => f64::from(*f),
        Value::Double(d) => *d,
        _ => return true,
    };
    let Json::Number(n) = json else {
        return true;
    };
    match (n.as_i64(), n.as_u64()) {
        (Some(i), _) => x as i128 == i128::from(i) && x.fract() == 0.0,
        (None, Some(u)) => x as i128 == i128::from(u) && x.fract() == 0.0,
        (None, None) => n.as_f64() == Some(x),
    }
}

/// The kind apache-avro gives a JSON value (an integer: `int` when it fits one).
fn kind_of(json: &Json) -> Option<SchemaKind> {
    Some(match json {
        Json::Null => SchemaKind::Null,
        Json::Bool(_) => SchemaKind::Boolean,
        Json::Number(n) => match n.as_i64() {
            Some(i) if i32::try_from(i).is_ok() => SchemaKind::Int,
            Some(_) => SchemaKind::Long,
            None if n.is_u64() => return None,
            None => SchemaKind::Double,
        },
        Json::String(_) => SchemaKind::String,
        Json::Array(_) => SchemaKind::Array,
        Json::Object(_) => SchemaKind::Map,
    })
}

fn branch_name(schema: &Schema) -> String {
    match schema {
        Schema::Ref { name } => name.to_string(),
        Schema::Record(r) => r.name.to_string(),
        Schema::Enum(e) => e.name.to_string(),
        Schema::Fixed(f) => f.name.to_string(),
        other => format!("{:?}", SchemaKind::from(other)).to_lowercase(),
    }
}

/// A JSON value in an error message: numbers and booleans as written, the rest by kind (a
/// payload's strings are not copied into dead letters' reasons).
fn describe(json: &Json) -> String {
    match json {
        Json::Null => "null".into(),
        Json::Bool(b) => b.to_string(),
        Json::Number(n) => n.to_string(),
        Json::String(_) => "a string".into(),
        Json::Array(_) => "an array".into(),
        Json::Object(_) => "an object".into(),
    }
}

fn expected(what: &str, json: &Json) -> Misfit {
    misfit(format!("expected {what}, found {}", describe(json)))
}

/// An integer within `i32`; `avro_type` names the schema type in the error.
fn int(json: &Json, avro_type: &str) -> Result<i32, Misfit> {
    let n = integer(json, avro_type)?;
    i32::try_from(n).map_err(|_| {
        misfit(format!(
            "{n} is out of range for an Avro {avro_type} ({}..={})",
            i32::MIN,
            i32::MAX
        ))
    })
}

/// An integer within `i64`.
fn long(json: &Json, avro_type: &str) -> Result<i64, Misfit> {
    let n = integer(json, avro_type)?;
    i64::try_from(n).map_err(|_| {
        misfit(format!(
            "{n} is out of range for an Avro {avro_type} ({}..={})",
            i64::MIN,
            i64::MAX
        ))
    })
}

/// A JSON integer literal, as wide as serde_json reads it (up to `u64::MAX`; larger ones are
/// read as floats, and refused here as not integers).
fn integer(json: &Json, avro_type: &str) -> Result<i128, Misfit> {
    let Json::Number(n) = json else {
        return Err(expected(&format!("an integer ({avro_type})"), json));
    };
    if let Some(i) = n.as_i64() {
        Ok(i128::from(i))
    } else if let Some(u) = n.as_u64() {
        Ok(i128::from(u))
    } else {
        Err(misfit(format!(
            "{n} is not an integer, and an Avro {avro_type} takes only integers"
        )))
    }
}

/// Any number within a float's finite range (rounded to the nearest float), or the special
/// values Avro's JSON encoding writes as strings (`"NaN"`, `"Infinity"`, `"-Infinity"`).
fn float(json: &Json) -> Result<Value, Misfit> {
    match json {
        Json::Number(n) => {
            let x = number(n);
            let f = x as f32;
            if f.is_infinite() {
                return Err(misfit(format!(
                    "{n} is out of range for an Avro float (±{:e})",
                    f32::MAX
                )));
            }
            Ok(Value::Float(f))
        }
        Json::String(s) => special(s)
            .map(|x| Value::Float(x as f32))
            .ok_or_else(|| expected("a number (float)", json)),
        other => Err(expected("a number (float)", other)),
    }
}

/// Any number (serde_json has refused one beyond a double's range already).
fn double(json: &Json) -> Result<Value, Misfit> {
    match json {
        Json::Number(n) => Ok(Value::Double(number(n))),
        Json::String(s) => special(s)
            .map(Value::Double)
            .ok_or_else(|| expected("a number (double)", json)),
        other => Err(expected("a number (double)", other)),
    }
}

fn number(n: &serde_json::Number) -> f64 {
    // Every serde_json number without `arbitrary_precision` has an f64 reading.
    n.as_f64().unwrap_or(f64::NAN)
}

fn special(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "INF" | "Infinity" => Some(f64::INFINITY),
        "-INF" | "-Infinity" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

/// A string's UTF-8 bytes, or an array of integers 0..=255.
fn bytes(json: &Json) -> Result<Value, Misfit> {
    match json {
        Json::String(s) => Ok(Value::Bytes(s.as_bytes().to_vec())),
        Json::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                integer(item, "bytes element")
                    .ok()
                    .and_then(|n| u8::try_from(n).ok())
                    .ok_or_else(|| misfit(format!("{} is not a byte (0..=255)", describe(item))))
                    .map_err(at(format!("[{i}]")))
            })
            .collect::<Result<Vec<u8>, _>>()
            .map(Value::Bytes),
        other => Err(expected("a string or an array of bytes", other)),
    }
}

/// A `fixed` from a string of exactly its size (a JSON payload carries bytes as a string).
fn fixed(json: &Json, schema: &FixedSchema) -> Result<Value, Misfit> {
    let FixedSchema { size, name, .. } = schema;
    match json {
        Json::String(s) if s.len() == *size => Ok(Value::Fixed(*size, s.as_bytes().to_vec())),
        Json::String(s) => Err(misfit(format!(
            "fixed `{name}` takes {size} bytes, the string has {}",
            s.len()
        ))),
        other => Err(expected("a string", other)),
    }
}

/// An enum symbol the schema knows. One it does not know is the payload's misfit, even when
/// the enum has a default: that default is a *reader's* rule for symbols a newer writer added
/// (the Avro specification's schema resolution); the relay writes, and writing the default
/// would publish another value than the row's without a word.
fn symbol(json: &Json, schema: &EnumSchema) -> Result<Value, Misfit> {
    let EnumSchema { symbols, name, .. } = schema;
    let Json::String(symbol) = json else {
        return Err(expected("an enum symbol (a string)", json));
    };
    match symbols.iter().position(|x| x == symbol) {
        Some(i) => Ok(Value::Enum(i as u32, symbol.clone())),
        None => Err(misfit(format!(
            "`{symbol}` is not a symbol of enum `{name}` ({})",
            symbols.join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = r#"{"type":"record","name":"OrderPlaced","namespace":"dev.outbox",
        "fields":[{"name":"id","type":"long"},{"name":"status","type":"string"},
        {"name":"note","type":["null","string"],"default":null},
        {"name":"total","type":"double","default":0}]}"#;

    #[test]
    fn json_becomes_avro_binary_byte_exact() {
        let schema = AvroSchema::parse(ORDER).unwrap();
        let body = schema
            .encode(br#"{"id": 3, "status": "new", "note": "hi", "total": 1.5}"#)
            .unwrap();
        // long 3 = zigzag 6; string "new" = len 3 (6) + bytes; union branch 1 (2) + "hi";
        // double 1.5 little-endian.
        let mut want = vec![6, 6, b'n', b'e', b'w', 2, 4, b'h', b'i'];
        want.extend_from_slice(&1.5f64.to_le_bytes());
        assert_eq!(body, want);
    }

    #[test]
    fn missing_members_take_defaults_and_null_picks_the_null_branch() {
        let schema = AvroSchema::parse(ORDER).unwrap();
        let body = schema
            .encode(br#"{"id": 1, "status": "", "extra": true}"#)
            .unwrap();
        let mut want = vec![2, 0, 0];
        want.extend_from_slice(&0f64.to_le_bytes());
        assert_eq!(body, want);
    }

    #[test]
    fn a_payload_that_breaks_the_schema_is_refused_with_a_reason() {
        let schema = AvroSchema::parse(ORDER).unwrap();
        for bad in [
            &br#"{"status": "new"}"#[..],
            br#"{"id": "three", "status": "new"}"#,
            br#"{"id": 1.5, "status": "new"}"#,
            br#"[1, 2]"#,
            b"not json",
        ] {
            let err = schema.encode(bad).unwrap_err();
            assert!(
                err.contains("Avro schema") || err.contains("not JSON"),
                "{err}"
            );
        }
    }

    fn one_field(avro_type: &str) -> AvroSchema {
        let text = format!(
            r#"{{"type":"record","name":"R","fields":[{{"name":"v","type":{avro_type}}}]}}"#
        );
        AvroSchema::parse(&text).unwrap()
    }

    /// The value of field `v` read back from `body`.
    fn decoded(schema: &AvroSchema, body: &[u8]) -> Value {
        match apache_avro::from_avro_datum(&schema.0, &mut &body[..], None).unwrap() {
            Value::Record(mut fields) if fields.len() == 1 => fields.remove(0).1,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn integers_beyond_their_fields_range_are_refused_not_wrapped() {
        let int = one_field(r#""int""#);
        let long = one_field(r#""long""#);
        for (schema, payload, why) in [
            (&int, r#"{"v": 3000000000}"#, "out of range for an Avro int"),
            (
                &int,
                r#"{"v": -2147483649}"#,
                "out of range for an Avro int",
            ),
            (&int, r#"{"v": 1.5}"#, "not an integer"),
            (&int, r#"{"v": 3.0}"#, "not an integer"),
            (
                &long,
                r#"{"v": 9223372036854775808}"#,
                "out of range for an Avro long",
            ),
            (
                &long,
                r#"{"v": 18446744073709551615}"#,
                "out of range for an Avro long",
            ),
            (&long, r#"{"v": 18446744073709551616}"#, "not an integer"),
            (&long, r#"{"v": 1.5}"#, "not an integer"),
        ] {
            let err = schema.encode(payload.as_bytes()).unwrap_err();
            assert!(
                err.contains("Avro schema") && err.contains(why),
                "{payload}: {err}"
            );
            assert!(err.contains("`v`"), "the error names the field: {err}");
        }
        let body = long.encode(br#"{"v": 9223372036854775807}"#).unwrap();
        assert_eq!(decoded(&long, &body), Value::Long(i64::MAX));
    }

    #[test]
    fn a_union_never_narrows_a_number_into_a_branch_it_does_not_fit() {
        let nullable = one_field(r#"["null","int"]"#);
        let err = nullable.encode(br#"{"v": 3000000000}"#).unwrap_err();
        assert!(err.contains("fits no branch"), "{err}");
        // The first branch that fits takes it: here the double, not the int.
        let schema =
            one_field(r#"["int",{"type":"long","logicalType":"timestamp-millis"},"double"]"#);
        let wide = |payload: &[u8]| decoded(&schema, &schema.encode(payload).unwrap());
        assert_eq!(
            wide(br#"{"v": 7}"#),
            Value::Union(0, Box::new(Value::Int(7)))
        );
        assert_eq!(
            wide(br#"{"v": 3000000000}"#),
            Value::Union(1, Box::new(Value::TimestampMillis(3_000_000_000)))
        );
        assert_eq!(
            wide(br#"{"v": 1e19}"#),
            Value::Union(2, Box::new(Value::Double(1e19)))
        );
    }

    /// Issue 50, point 9: a union without an `int` branch took 123456789 as the float
    /// 123456792, its first branch that fits. A branch that holds the number as it is comes
    /// first; a float only rounds where no branch holds it.
    #[test]
    fn a_union_takes_a_branch_that_holds_the_number_before_one_that_rounds_it() {
        let schema = one_field(r#"["null","float","double"]"#);
        let got = |payload: &[u8]| decoded(&schema, &schema.encode(payload).unwrap());
        assert_eq!(
            got(br#"{"v": 123456789}"#),
            Value::Union(2, Box::new(Value::Double(123456789.0)))
        );
        assert_eq!(
            got(br#"{"v": 1.5}"#),
            Value::Union(2, Box::new(Value::Double(1.5)))
        );
        assert_eq!(
            got(br#"{"v": 16}"#),
            Value::Union(1, Box::new(Value::Float(16.0))),
            "a float that holds it"
        );
        let long = one_field(r#"["null","float","long"]"#);
        assert_eq!(
            decoded(&long, &long.encode(br#"{"v": 16777217}"#).unwrap()),
            Value::Union(2, Box::new(Value::Long(16_777_217)))
        );
        let only_float = one_field(r#"["null","float"]"#);
        assert_eq!(
            decoded(
                &only_float,
                &only_float.encode(br#"{"v": 123456789}"#).unwrap()
            ),
            Value::Union(1, Box::new(Value::Float(123456789.0))),
            "rounded as a float field rounds, where no branch holds it"
        );
    }

    #[test]
    fn other_narrowings_are_refused_too() {
        let date = one_field(r#"{"type":"int","logicalType":"date"}"#);
        let err = date.encode(br#"{"v": 2147483648}"#).unwrap_err();
        assert!(err.contains("out of range for an Avro date"), "{err}");
        let float = one_field(r#""float""#);
        let err = float.encode(br#"{"v": 1e39}"#).unwrap_err();
        assert!(err.contains("out of range for an Avro float"), "{err}");
        let bytes = one_field(r#""bytes""#);
        let err = bytes.encode(br#"{"v": [1, 4294967297]}"#).unwrap_err();
        assert!(err.contains("not a byte"), "{err}");
        let fixed = one_field(r#"{"type":"fixed","name":"F","size":2}"#);
        assert!(fixed
            .encode(br#"{"v": "abc"}"#)
            .unwrap_err()
            .contains("takes 2 bytes"));
        let items = one_field(r#"{"type":"array","items":"int"}"#);
        let err = items.encode(br#"{"v": [1, 2147483648]}"#).unwrap_err();
        assert!(err.contains("`v.[1]`"), "{err}");
    }

    #[test]
    fn enums_records_and_references_still_convert() {
        let schema = AvroSchema::parse(
            r#"{"type":"record","name":"Node","fields":[
                {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["A","B"]}},
                {"name":"next","type":["null","Node"],"default":null}]}"#,
        )
        .unwrap();
        let body = schema
            .encode(br#"{"kind": "B", "next": {"kind": "A"}}"#)
            .unwrap();
        // Enum index 1; union branch 1; enum index 0; union branch 0 (null).
        assert_eq!(body, vec![2, 2, 0, 0]);
        let err = schema.encode(br#"{"kind": "C"}"#).unwrap_err();
        assert!(err.contains("not a symbol of enum"), "{err}");
        // A default is the reader's, for symbols a newer writer added: the row's unknown
        // symbol is not published as it.
        let with_default =
            one_field(r#"{"type":"enum","name":"Kind","symbols":["A","B"],"default":"A"}"#);
        let err = with_default.encode(br#"{"v": "C"}"#).unwrap_err();
        assert!(err.contains("not a symbol of enum"), "{err}");
    }

    /// JSON number literals at and beyond the bounds of the integer types, and fractions.
    fn literal() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let bounds = [
            i128::from(i32::MIN),
            i128::from(i32::MAX),
            i128::from(i64::MIN),
            i128::from(i64::MAX),
            i128::from(u64::MAX),
            0,
        ];
        prop_oneof![
            (proptest::sample::select(bounds.to_vec()), -3i128..=3)
                .prop_map(|(b, d)| (b + d).to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<i32>().prop_map(|n| n.to_string()),
            (-(1i128 << 70)..(1i128 << 70)).prop_map(|n| n.to_string()),
            any::<f64>()
                .prop_filter("finite", |x| x.is_finite())
                .prop_map(|x| format!("{x:?}")),
            (-1e40f64..1e40).prop_map(|x| format!("{x:e}")),
        ]
    }

    proptest::proptest! {
        /// In range: encodes and reads back as the same number. Out of range or a fraction
        /// for an integer type: a schema error, never a wrapped value.
        #[test]
        fn avro_primitives_take_exactly_the_numbers_their_type_holds(text in literal()) {
            let json: serde_json::Value = serde_json::from_str(&text).unwrap();
            let integer: Option<i128> = json.as_i64().map(i128::from)
                .or_else(|| json.as_u64().map(i128::from));
            let real = json.as_f64().unwrap();
            let payload = format!(r#"{{"v": {text}}}"#);
            for (avro_type, want) in [
                (r#""int""#, integer.and_then(|n| i32::try_from(n).ok()).map(Value::Int)),
                (r#""long""#, integer.and_then(|n| i64::try_from(n).ok()).map(Value::Long)),
                (r#"{"type":"long","logicalType":"timestamp-micros"}"#,
                    integer.and_then(|n| i64::try_from(n).ok()).map(Value::TimestampMicros)),
                (r#""float""#, Some(real as f32).filter(|f| f.is_finite()).map(Value::Float)),
                (r#""double""#, Some(Value::Double(real))),
            ] {
                let schema = one_field(avro_type);
                let got = schema.encode(payload.as_bytes());
                match want {
                    Some(want) => {
                        let body = got.map_err(|e| proptest::test_runner::TestCaseError::fail(
                            format!("{text} into {avro_type}: {e}")))?;
                        proptest::prop_assert_eq!(decoded(&schema, &body), want, "{} into {}", text, avro_type);
                    }
                    None => {
                        let err = got.err();
                        proptest::prop_assert!(
                            err.as_deref().is_some_and(|e| e.contains("does not match the Avro schema")),
                            "{} into {}: {:?}", text, avro_type, err);
                    }
                }
            }
        }
    }

    #[test]
    fn an_invalid_schema_is_refused() {
        let err = AvroSchema::parse(r#"{"type":"record","name":"Broken""#).unwrap_err();
        assert!(err.starts_with("not a valid Avro schema"), "{err}");
    }
}
