//! The ordinary (non-replication) side of PostgreSQL: the control connection used for set-up
//! and inspection (publication, slot, catalog, lag) and the TLS settings both connections use.

pub mod aws_iam;
pub mod conninfo;
pub mod control;
pub mod tls;
