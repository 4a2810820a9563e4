//! What the relay shows while it runs: the metrics it keeps, and the HTTP listener that serves
//! them (`/metrics`) with its health (`/healthz`, `/readyz`).

pub mod http;
pub mod metrics;
