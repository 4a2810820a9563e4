//! Where events come from: the replication connection to PostgreSQL's walsender and the
//! decoder of what it streams.
//!
//! In: a slot, a publication, connection parameters. Out: [`walsender::ReplicationFrame`]s
//! (keepalives and WAL data), decoded by [`pgoutput::decode`] into logical messages (BEGIN,
//! RELATION, INSERT, COMMIT, MESSAGE...). Status updates go back the same connection.

pub mod pgoutput;
pub mod walsender;
