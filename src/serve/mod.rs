//! What the relay shows while it runs: the metrics it keeps, and the HTTP listener that serves
//! them (`/metrics`) with its health (`/healthz`, `/readyz`); and the traces it exports
//! (`traces.rs`, `[tracing]`).

pub mod http;
pub mod metrics;
pub mod traces;
