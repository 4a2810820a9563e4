//! The HTTP listener: `/metrics` (Prometheus text), `/healthz` (alive) and `/readyz`
//! (streaming and not stalled). Deliberately tiny: HTTP/1.1, one request per connection,
//! bounded request size and time, so a misbehaving scraper cannot hold the relay.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::serve::metrics::Metrics;

/// Largest request head we read; anything longer is answered with 431.
const MAX_REQUEST_BYTES: usize = 8 * 1024;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Binds the listener now (so a bad address fails at start-up), serves until `shutdown`.
pub async fn bind(addr: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    staleness: Duration,
    shutdown: CancellationToken,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics, /healthz and /readyz");
    }
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    debug!(error = %e, "accept failed");
                    continue;
                }
            },
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _ =
                tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, peer, &metrics, staleness))
                    .await;
        });
    }
}

async fn answer(
    mut stream: TcpStream,
    peer: SocketAddr,
    metrics: &Metrics,
    staleness: Duration,
) -> std::io::Result<()> {
    let head = match read_head(&mut stream).await? {
        Some(head) => head,
        None => return respond(&mut stream, 431, "text/plain", "request too large\n").await,
    };
    let path = request_path(&head);
    debug!(%peer, path = path.unwrap_or("?"), "http request");
    match path {
        Some("/metrics") => {
            respond(
                &mut stream,
                200,
                crate::serve::metrics::CONTENT_TYPE,
                &metrics.render(staleness),
            )
            .await
        }
        Some("/healthz") => respond(&mut stream, 200, "text/plain", "ok\n").await,
        Some("/readyz") => match metrics.readiness(staleness) {
            Ok(()) => respond(&mut stream, 200, "text/plain", "ready\n").await,
            Err(why) => {
                respond(
                    &mut stream,
                    503,
                    "text/plain",
                    &format!("not ready: {why}\n"),
                )
                .await
            }
        },
        Some(_) => {
            respond(
                &mut stream,
                404,
                "text/plain",
                "try /metrics, /healthz or /readyz\n",
            )
            .await
        }
        None => respond(&mut stream, 400, "text/plain", "bad request\n").await,
    }
}

/// Reads until the blank line ending the request head; `None` when it is too large.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<String>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > MAX_REQUEST_BYTES {
            return Ok(None);
        }
    }
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

/// The path of a `GET` (or `HEAD`) request line, without the query string.
fn request_path(head: &str) -> Option<&str> {
    let mut parts = head.lines().next()?.split_whitespace();
    let method = parts.next()?;
    let target = parts.next()?;
    if method != "GET" && method != "HEAD" {
        return None;
    }
    Some(target.split('?').next().unwrap_or(target))
}

async fn respond(
    stream: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_line_gives_the_path() {
        assert_eq!(
            request_path("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some("/metrics")
        );
        assert_eq!(
            request_path("GET /readyz?verbose=1 HTTP/1.1\r\n\r\n"),
            Some("/readyz")
        );
        assert_eq!(request_path("POST /metrics HTTP/1.1\r\n\r\n"), None);
        assert_eq!(request_path(""), None);
    }

    #[tokio::test]
    async fn serves_metrics_and_readiness() {
        let listener = bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::default());
        let shutdown = CancellationToken::new();
        tokio::spawn(serve(
            listener,
            metrics.clone(),
            Duration::from_secs(5),
            shutdown.clone(),
        ));
        let get = |path: &'static str| async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/readyz").await.starts_with("HTTP/1.1 503"));
        metrics.set_state(crate::serve::metrics::RelayState::Streaming);
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/metrics")
            .await
            .contains("outbox_relay_events_published_total"));
        assert!(get("/nope").await.starts_with("HTTP/1.1 404"));
        shutdown.cancel();
    }
}
