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
    let Some(head) = read_head(&mut stream).await? else {
        let too_large = Response::text(431, "request too large\n");
        return respond(&mut stream, &too_large, true).await;
    };
    let request = parse_request(&head);
    let path = request.as_ref().map(|r| r.path);
    debug!(%peer, path = path.unwrap_or("?"), "http request");
    let response = match path {
        Some(path) => route(path, metrics, staleness),
        None => Response::text(400, "bad request\n"),
    };
    // A HEAD request gets the head a GET would (its Content-Length too), without the body.
    let with_body = !request.is_some_and(|r| r.head_only);
    respond(&mut stream, &response, with_body).await
}

/// What `path` answers.
fn route(path: &str, metrics: &Metrics, staleness: Duration) -> Response {
    match path {
        "/metrics" => Response {
            status: 200,
            content_type: crate::serve::metrics::CONTENT_TYPE,
            body: metrics.render(staleness),
        },
        "/healthz" => Response::text(200, "ok\n"),
        "/readyz" => match metrics.readiness(staleness) {
            Ok(()) => Response::text(200, "ready\n"),
            Err(why) => Response::text(503, format!("not ready: {why}\n")),
        },
        _ => Response::text(404, "try /metrics, /healthz or /readyz\n"),
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

/// A `GET` or `HEAD` request.
#[derive(Debug, PartialEq, Eq)]
struct Request<'a> {
    /// The path, without the query string.
    path: &'a str,
    /// `HEAD`: answered without a body.
    head_only: bool,
}

/// The request line's method and path; `None` for another method or no request line.
fn parse_request(head: &str) -> Option<Request<'_>> {
    let mut parts = head.lines().next()?.split_whitespace();
    let head_only = match parts.next()? {
        "GET" => false,
        "HEAD" => true,
        _ => return None,
    };
    let target = parts.next()?;
    let path = target.split('?').next().unwrap_or(target);
    Some(Request { path, head_only })
}

struct Response {
    status: u16,
    content_type: &'static str,
    body: String,
}

impl Response {
    fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain",
            body: body.into(),
        }
    }
}

async fn respond(
    stream: &mut TcpStream,
    response: &Response,
    with_body: bool,
) -> std::io::Result<()> {
    let Response {
        status,
        content_type,
        body,
    } = response;
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
    if with_body {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_line_gives_the_path() {
        let path = |head| parse_request(head).map(|r| r.path);
        assert_eq!(
            path("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Some("/metrics")
        );
        assert_eq!(
            path("GET /readyz?verbose=1 HTTP/1.1\r\n\r\n"),
            Some("/readyz")
        );
        assert_eq!(
            parse_request("HEAD /healthz HTTP/1.1\r\n\r\n"),
            Some(Request {
                path: "/healthz",
                head_only: true
            })
        );
        assert_eq!(path("POST /metrics HTTP/1.1\r\n\r\n"), None);
        assert_eq!(path(""), None);
    }

    /// A server on a free port: its address, its metrics, and what stops it.
    async fn start() -> (std::net::SocketAddr, Arc<Metrics>, CancellationToken) {
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
        (addr, metrics, shutdown)
    }

    /// One `method path` request; the whole answer.
    async fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn serves_metrics_and_readiness() {
        let (addr, metrics, shutdown) = start().await;
        let get = |path| request(addr, "GET", path);
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

    #[tokio::test]
    async fn head_requests_get_the_head_without_a_body() {
        let (addr, _metrics, shutdown) = start().await;
        let head = |path| request(addr, "HEAD", path);
        for (path, status, length) in [
            ("/healthz", "200", "ok\n".len()),
            (
                "/readyz",
                "503",
                "not ready: not streaming (state: starting)\n".len(),
            ),
            ("/nope", "404", "try /metrics, /healthz or /readyz\n".len()),
        ] {
            let out = head(path).await;
            assert!(
                out.starts_with(&format!("HTTP/1.1 {status} ")),
                "{path}: {out}"
            );
            assert!(
                out.contains(&format!("\r\nContent-Length: {length}\r\n")),
                "{path}: {out}"
            );
            assert!(out.ends_with("\r\n\r\n"), "{path}: a body\n{out}");
        }
        let out = head("/metrics").await;
        assert!(out.starts_with("HTTP/1.1 200 "), "{out}");
        assert!(out.ends_with("\r\n\r\n"), "a body\n{out}");
        shutdown.cancel();
    }
}
