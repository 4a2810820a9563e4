//! A registry stand-in for the unit tests: an HTTP/1.1 server on 127.0.0.1 answering each
//! request with what the test's closure says, and counting what it saw.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

/// One request: method, path and `Authorization` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
}

pub struct StandIn {
    pub url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl StandIn {
    /// Serves until the test process ends; `answer` gives (status, body).
    pub fn start(answer: impl Fn(&Seen) -> (u16, String) + Send + 'static) -> StandIn {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let log = seen.clone();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(&stream);
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let mut parts = line.split_whitespace();
                let mut request = Seen {
                    method: parts.next().unwrap_or("").to_string(),
                    path: parts.next().unwrap_or("").to_string(),
                    authorization: None,
                };
                let mut length = 0usize;
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap_or(0) == 0 || header.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = header.trim().split_once(':') {
                        if k.eq_ignore_ascii_case("authorization") {
                            request.authorization = Some(v.trim().to_string());
                        } else if k.eq_ignore_ascii_case("content-length") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                }
                let mut body = vec![0; length];
                let _ = std::io::Read::read_exact(&mut reader, &mut body);
                let (status, body) = answer(&request);
                log.lock().unwrap().push(request);
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        StandIn { url, seen }
    }

    /// The requests so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}
