//! `otlp-sink`: a local OTLP/HTTP endpoint that takes every export request, answers 200 and
//! throws the spans away, so that `--tracing` measures the relay's side of
//! tracing (making, batching, encoding and sending spans), not a collector.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Requests and body bytes taken so far.
#[derive(Default)]
struct Taken {
    requests: AtomicU64,
    bytes: AtomicU64,
}

/// Listens on 127.0.0.1 (a free port, written to `port_file`) until killed; after every
/// request `counts_file` holds `{"requests": n, "bytes": b}`.
pub fn run(port_file: &Path, counts_file: &Path) -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    std::fs::write(port_file, listener.local_addr()?.port().to_string())?;
    serve(listener, counts_file)
}

/// The sink on a thread of this process (the `run` driver's, for `--tracing`): returns its
/// port. It serves until the process exits.
pub fn start(counts_file: &Path) -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let counts_file = counts_file.to_path_buf();
    std::thread::spawn(move || serve(listener, &counts_file));
    Ok(port)
}

fn serve(listener: TcpListener, counts_file: &Path) -> anyhow::Result<()> {
    let taken = Arc::new(Taken::default());
    for stream in listener.incoming() {
        let (taken, counts_file) = (taken.clone(), counts_file.to_path_buf());
        let stream = stream?;
        std::thread::spawn(move || {
            let _ = connection(stream, &taken, &counts_file);
        });
    }
    Ok(())
}

/// HTTP/1.1 requests with a Content-Length body, one after another on a kept-alive connection.
fn connection(stream: TcpStream, taken: &Taken, counts_file: &Path) -> std::io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        std::io::copy(&mut (&mut reader).take(length as u64), &mut std::io::sink())?;
        let requests = taken.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let bytes = taken.bytes.fetch_add(length as u64, Ordering::Relaxed) + length as u64;
        let counts = format!("{{\"requests\": {requests}, \"bytes\": {bytes}}}\n");
        std::fs::write(counts_file, counts)?;
        writer.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")?;
    }
}
