//! What the relay shows while it runs: the metrics it keeps, and the HTTP listener that serves
//! them (`/metrics`) with its health (`/healthz`, `/readyz`). The traces it exports live with
//! the sink that makes their spans (`sink::traces`, `[tracing]`).

pub mod http;
pub mod metrics;
