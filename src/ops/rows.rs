//! Outbox rows as pgoutput would send them: the table's columns (names, type OIDs, typmods) as a
//! [`Relation`], and each row's values as their types' text output. `replay` and `check` turn
//! them into records with the live [`crate::outbox::OutboxMapping`], so that topic, key,
//! partition, payload, timestamp and headers come out exactly as in the live stream.
//!
//! The values are read with `format('%s', column)`, which calls the type's output function
//! like pgoutput does; a `::text` cast would not (`true::text` is `true`, pgoutput sends `t`;
//! `char(n)::text` drops the padding).

use bytes::Bytes;
use tokio_postgres::{Client, Row};

use super::{query_err, OpsError};
use crate::config::OutboxConfig;
use crate::control::quote_ident;
use crate::pgoutput::{Column, Relation, Tuple, TupleValue};

/// One configured outbox table, described by the catalog.
#[derive(Debug, Clone)]
pub struct OutboxTable {
    /// The table's complete mapping (one entry of `OutboxConfig::table_configs`).
    pub config: OutboxConfig,
    /// `schema.table`, for messages.
    pub display: String,
    /// `"schema"."table"`, for SQL.
    pub quoted: String,
    /// Every column in `attnum` order, as a Relation message would list them.
    pub relation: Relation,
}

impl OutboxTable {
    /// Reads the table's columns; `None` when the table does not exist.
    pub async fn describe(
        client: &Client,
        config: &OutboxConfig,
    ) -> Result<Option<OutboxTable>, OpsError> {
        let (schema, name) = config.schema_and_table();
        let rows = client
            .query(
                "SELECT a.attname::text, a.atttypid, a.atttypmod
                 FROM pg_attribute a
                 JOIN pg_class c ON c.oid = a.attrelid
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped
                 ORDER BY a.attnum",
                &[&schema, &name],
            )
            .await
            .map_err(query_err(format!("reading the columns of {schema}.{name}")))?;
        if rows.is_empty() {
            return Ok(None);
        }
        let columns = rows
            .iter()
            .map(|r| Column {
                flags: 0,
                name: r.get(0),
                type_oid: r.get(1),
                type_modifier: r.get(2),
            })
            .collect();
        Ok(Some(OutboxTable {
            config: config.clone(),
            display: format!("{schema}.{name}"),
            quoted: format!("{}.{}", quote_ident(&schema), quote_ident(&name)),
            relation: Relation {
                id: 0,
                namespace: schema,
                name,
                replica_identity: b'd',
                columns,
            },
        }))
    }

    /// Every column's text output, in order: the start of a SELECT list.
    pub fn select_list(&self) -> String {
        let values: Vec<String> = self
            .relation
            .columns
            .iter()
            .map(|c| text_output(&c.name))
            .collect();
        values.join(", ")
    }

    /// The row's first columns (those of [`OutboxTable::select_list`]) as pgoutput's tuple.
    pub fn tuple(&self, row: &Row) -> Tuple {
        let values = (0..self.relation.columns.len())
            .map(|i| match row.get::<_, Option<String>>(i) {
                Some(text) => TupleValue::Text(Bytes::from(text)),
                None => TupleValue::Null,
            })
            .collect();
        Tuple(values)
    }

    pub fn has_column(&self, name: &str) -> bool {
        self.relation.columns.iter().any(|c| c.name == name)
    }
}

/// The column's value as its type's text output, NULL kept NULL (`format` turns NULL into '').
pub fn text_output(column: &str) -> String {
    let c = quote_ident(column);
    format!("CASE WHEN {c} IS NULL THEN NULL ELSE format('%s', {c}) END")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_as_their_text_output() {
        assert_eq!(
            text_output("pay\"load"),
            r#"CASE WHEN "pay""load" IS NULL THEN NULL ELSE format('%s', "pay""load") END"#
        );
    }
}
