//! The replication stream's frames as bytes: what the server's CopyData carries (WAL data,
//! keepalives) and the standby status update the relay sends back. Pure.

use super::*;

/// One frame of the replication stream (the payload of a server CopyData).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicationFrame {
    /// `w`: WAL data carrying one pgoutput message.
    XLogData {
        wal_start: Lsn,
        wal_end: Lsn,
        data: Bytes,
    },
    /// `k`: the server's sent position, and whether it wants an answer now.
    Keepalive { wal_end: Lsn, reply_requested: bool },
}

/// Parses the payload of a server CopyData frame.
pub fn parse_frame(mut body: Bytes) -> Result<ReplicationFrame, ReplicationError> {
    let short = |what: &str| ReplicationError::Protocol(format!("truncated {what} frame"));
    if body.is_empty() {
        return Err(short("empty"));
    }
    match body.get_u8() {
        b'w' => {
            if body.len() < 24 {
                return Err(short("XLogData"));
            }
            let wal_start = Lsn(body.get_u64());
            let wal_end = Lsn(body.get_u64());
            let _send_time = body.get_i64();
            Ok(ReplicationFrame::XLogData {
                wal_start,
                wal_end,
                data: body,
            })
        }
        b'k' => {
            if body.len() < 17 {
                return Err(short("keepalive"));
            }
            let wal_end = Lsn(body.get_u64());
            let _send_time = body.get_i64();
            let reply_requested = body.get_u8() != 0;
            Ok(ReplicationFrame::Keepalive {
                wal_end,
                reply_requested,
            })
        }
        tag => Err(ReplicationError::Protocol(format!(
            "unknown replication frame tag {:?}",
            tag as char
        ))),
    }
}

/// Encodes a standby status update ('r') inside a CopyData message.
pub fn encode_status_update(write: Lsn, flush: Lsn, apply: Lsn, reply: bool) -> BytesMut {
    let mut body = BytesMut::with_capacity(34);
    body.put_u8(b'r');
    body.put_u64(write.0);
    body.put_u64(flush.0);
    body.put_u64(apply.0);
    body.put_i64(pg_now_us());
    body.put_u8(u8::from(reply));
    let mut out = BytesMut::with_capacity(40);
    out.put_u8(b'd');
    out.put_i32(4 + body.len() as i32);
    out.extend_from_slice(&body);
    out
}

fn pg_now_us() -> i64 {
    crate::clock::unix_us() - PG_EPOCH_OFFSET_US
}

/// Converts a PostgreSQL timestamp (µs since 2000-01-01) to µs since the Unix epoch.
pub fn pg_time_to_unix_us(pg_us: i64) -> i64 {
    pg_us + PG_EPOCH_OFFSET_US
}
