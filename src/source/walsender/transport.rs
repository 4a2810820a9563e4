//! Opening the replication connection's transport: TCP with keepalives and
//! `TCP_USER_TIMEOUT`, then TLS when the server agrees and the mode asks for it.

use super::*;

pub(super) async fn open_transport(
    params: &ConnectParams,
    endpoint: &Endpoint,
) -> Result<Opened, ReplicationError> {
    let target = endpoint.target();
    let connect_err = |source| ReplicationError::Connect {
        target: target.clone(),
        source,
    };
    match &endpoint.host {
        Host::Tcp(host) => {
            let stream = TcpStream::connect((host.as_str(), endpoint.port))
                .await
                .map_err(connect_err)?;
            stream.set_nodelay(true).map_err(connect_err)?;
            set_keepalive(&stream, &params.info.keepalive).map_err(connect_err)?;
            negotiate_tls(stream, host, &params.info.tls).await
        }
        // Like libpq, no TLS over a local socket.
        #[cfg(unix)]
        Host::Unix(dir) => {
            let path = dir.join(format!(".s.PGSQL.{}", endpoint.port));
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(connect_err)?;
            Ok((Box::new(stream), None))
        }
        #[cfg(not(unix))]
        Host::Unix(_) => Err(ReplicationError::Url(
            "unix sockets are not supported here".into(),
        )),
    }
}

/// TCP keepalives and `TCP_USER_TIMEOUT` on the socket, before TLS (which wraps it).
fn set_keepalive(stream: &TcpStream, keepalive: &TcpKeepalive) -> io::Result<()> {
    let socket = socket2::SockRef::from(stream);
    if keepalive.enabled {
        let probes = socket2::TcpKeepalive::new()
            .with_time(keepalive.idle)
            .with_interval(keepalive.interval)
            .with_retries(keepalive.retries);
        socket.set_tcp_keepalive(&probes)?;
    }
    #[cfg(target_os = "linux")]
    socket.set_tcp_user_timeout(keepalive.user_timeout)?;
    Ok(())
}

/// SSLRequest, then a TLS handshake when the server agrees (or plain TCP where the mode
/// allows it).
async fn negotiate_tls(
    mut tcp: TcpStream,
    host: &str,
    tls: &TlsSettings,
) -> Result<Opened, ReplicationError> {
    if tls.mode == SslMode::Disable {
        return Ok((Box::new(tcp), None));
    }
    let mut request = BytesMut::new();
    frontend::ssl_request(&mut request);
    tcp.write_all(&request).await?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await?;
    match answer[0] {
        b'S' => {}
        b'N' if tls.mode == SslMode::Prefer => return Ok((Box::new(tcp), None)),
        b'N' => {
            return Err(ReplicationError::Tls(format!(
                "the server does not accept TLS, but postgres.ssl_mode is {:?}; enable ssl on the server or lower ssl_mode",
                tls.mode
            )))
        }
        other => {
            return Err(ReplicationError::Protocol(format!(
                "unexpected answer {other:#x} to SSLRequest"
            )))
        }
    }
    let tls_err = |e: &dyn std::fmt::Display| ReplicationError::Tls(e.to_string());
    let mut config = tls
        .connector()
        .map_err(|e| tls_err(&e))?
        .configure()
        .map_err(|e| tls_err(&e))?;
    config.set_verify_hostname(tls.mode == SslMode::VerifyFull);
    let ssl = config.into_ssl(host).map_err(|e| tls_err(&e))?;
    let mut stream = tokio_openssl::SslStream::new(ssl, tcp).map_err(|e| tls_err(&e))?;
    std::pin::Pin::new(&mut stream)
        .connect()
        .await
        .map_err(|e| {
            let verify = stream.ssl().verify_result();
            if verify == openssl::x509::X509VerifyResult::OK {
                ReplicationError::TlsInterrupted(e.to_string())
            } else {
                // A certificate the settings reject: retrying will not help.
                ReplicationError::Tls(format!(
                    "handshake failed: {e} (certificate check: {verify}); check postgres.ssl_root_cert and the host name"
                ))
            }
        })?;
    let binding = server_end_point(stream.ssl());
    Ok((Box::new(stream), binding))
}
