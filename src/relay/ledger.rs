//! The checkpoint ledger: which WAL position may be confirmed to PostgreSQL.
//!
//! A position may be confirmed only when every event at or before it has been acknowledged by
//! Kafka. Transactions are kept in commit order; each counts the records it still waits for.
//! The watermark is the `end_lsn` of the newest commit such that it and every earlier commit
//! are fully acknowledged. Per-change LSNs are never used: several changes share an LSN.
//!
//! When nothing is open or in flight, the last keepalive's WAL end is confirmed too, so an idle
//! outbox on a busy database does not hold back WAL.
//!
//! Memory is bounded by the records in flight, not by the traffic: a committed transaction that
//! has nothing left to acknowledge (no outbox record, as PostgreSQL 14 sends for every
//! transaction of the database, or records already acknowledged) folds into the committed
//! entry before it, which then simply ends later.

use std::collections::VecDeque;

use crate::lsn::Lsn;

pub use crate::sink::TxnSeq;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("BEGIN while transaction {0} is still open")]
    NestedBegin(TxnSeq),
    #[error("{0} outside a transaction")]
    NoOpenTransaction(&'static str),
    #[error("acknowledgement for unknown transaction {0}")]
    UnknownTransaction(TxnSeq),
}

#[derive(Debug)]
struct Entry {
    seq: TxnSeq,
    /// `None` while the transaction is still being received.
    end_lsn: Option<Lsn>,
    outstanding: u64,
    /// Commit time (ms since the Unix epoch), for commit-to-acknowledgement latency.
    commit_time_ms: i64,
}

#[derive(Debug)]
pub struct Ledger {
    entries: VecDeque<Entry>,
    next_seq: TxnSeq,
    confirmed: Lsn,
    /// Newest keepalive WAL end; confirmable once everything before it is acknowledged.
    wal_end: Lsn,
}

impl Ledger {
    /// A ledger that starts at the slot's `confirmed_flush_lsn`: it never reports less.
    pub fn new(start: Lsn) -> Self {
        Ledger {
            entries: VecDeque::new(),
            next_seq: 0,
            confirmed: start,
            wal_end: start,
        }
    }

    pub fn begin(&mut self, commit_time_ms: i64) -> Result<TxnSeq, LedgerError> {
        if let Some(open) = self.open_entry() {
            return Err(LedgerError::NestedBegin(open.seq));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.push_back(Entry {
            seq,
            end_lsn: None,
            outstanding: 0,
            commit_time_ms,
        });
        Ok(seq)
    }

    /// Counts one record handed to Kafka for the open transaction.
    pub fn record_sent(&mut self) -> Result<TxnSeq, LedgerError> {
        let open = self
            .open_entry_mut()
            .ok_or(LedgerError::NoOpenTransaction("record"))?;
        open.outstanding += 1;
        Ok(open.seq)
    }

    pub fn commit(&mut self, end_lsn: Lsn) -> Result<(), LedgerError> {
        let open = self
            .open_entry_mut()
            .ok_or(LedgerError::NoOpenTransaction("COMMIT"))?;
        open.end_lsn = Some(end_lsn);
        if open.outstanding == 0 {
            self.fold_last();
        }
        self.advance();
        Ok(())
    }

    /// Folds the last entry, committed with nothing outstanding, into the committed entry
    /// before it: confirming that one's end then means confirming this one's. No delivery
    /// refers to the folded sequence number any more, so the next transaction reuses it and
    /// the numbers stay contiguous (`entry_mut` relies on that).
    fn fold_last(&mut self) {
        let len = self.entries.len();
        if len < 2 || self.entries[len - 2].end_lsn.is_none() {
            return;
        }
        if let Some(last) = self.entries.pop_back() {
            self.entries[len - 2].end_lsn = last.end_lsn;
            self.next_seq -= 1;
        }
    }

    /// Kafka acknowledged one record of transaction `seq`; returns the transaction's commit
    /// time.
    pub fn ack(&mut self, seq: TxnSeq) -> Result<i64, LedgerError> {
        let entry = self
            .entry_mut(seq)
            .filter(|e| e.outstanding > 0)
            .ok_or(LedgerError::UnknownTransaction(seq))?;
        entry.outstanding -= 1;
        let commit_time_ms = entry.commit_time_ms;
        self.advance();
        Ok(commit_time_ms)
    }

    /// The server's sent position from a keepalive.
    pub fn observe_wal_end(&mut self, wal_end: Lsn) {
        self.wal_end = self.wal_end.max(wal_end);
        self.advance();
    }

    /// The position that may be reported as flushed. Never goes backwards.
    pub fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    /// True when no transaction is open and no record is unacknowledged.
    pub fn is_idle(&self) -> bool {
        self.entries.is_empty()
    }

    /// Transactions held: open, or waiting for acknowledgements (or for an earlier one).
    pub fn transactions_held(&self) -> usize {
        self.entries.len()
    }

    fn advance(&mut self) {
        while let Some(front) = self.entries.front() {
            match front.end_lsn {
                Some(end) if front.outstanding == 0 => {
                    self.confirmed = self.confirmed.max(end);
                    self.entries.pop_front();
                }
                _ => break,
            }
        }
        if self.entries.is_empty() {
            // Everything received before the keepalive has been handled and acknowledged.
            self.confirmed = self.confirmed.max(self.wal_end);
        }
    }

    fn open_entry(&self) -> Option<&Entry> {
        self.entries.back().filter(|e| e.end_lsn.is_none())
    }

    fn open_entry_mut(&mut self) -> Option<&mut Entry> {
        self.entries.back_mut().filter(|e| e.end_lsn.is_none())
    }

    fn entry_mut(&mut self, seq: TxnSeq) -> Option<&mut Entry> {
        let front = self.entries.front()?.seq;
        let index = usize::try_from(seq.checked_sub(front)?).ok()?;
        self.entries.get_mut(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn txn(ledger: &mut Ledger, records: u64, end: u64) -> TxnSeq {
        let seq = ledger.begin(0).unwrap();
        for _ in 0..records {
            ledger.record_sent().unwrap();
        }
        ledger.commit(Lsn(end)).unwrap();
        seq
    }

    #[test]
    fn lsn_not_confirmed_until_kafka_acks() {
        let mut l = Ledger::new(Lsn(10));
        let a = txn(&mut l, 2, 100);
        assert_eq!(l.confirmed(), Lsn(10));
        l.ack(a).unwrap();
        assert_eq!(l.confirmed(), Lsn(10));
        l.ack(a).unwrap();
        assert_eq!(l.confirmed(), Lsn(100));
    }

    #[test]
    fn later_acks_wait_for_earlier_transactions() {
        let mut l = Ledger::new(Lsn(0));
        let a = txn(&mut l, 1, 100);
        let b = txn(&mut l, 1, 200);
        l.ack(b).unwrap();
        assert_eq!(l.confirmed(), Lsn(0));
        l.ack(a).unwrap();
        assert_eq!(l.confirmed(), Lsn(200));
    }

    #[test]
    fn open_transaction_holds_back_keepalive_position() {
        let mut l = Ledger::new(Lsn(0));
        let a = txn(&mut l, 1, 100);
        l.begin(0).unwrap();
        l.record_sent().unwrap();
        l.observe_wal_end(Lsn(500));
        l.ack(a).unwrap();
        assert_eq!(l.confirmed(), Lsn(100));
    }

    #[test]
    fn idle_outbox_still_advances_slot() {
        let mut l = Ledger::new(Lsn(50));
        l.observe_wal_end(Lsn(900));
        assert_eq!(l.confirmed(), Lsn(900));
        let a = txn(&mut l, 1, 1000);
        l.observe_wal_end(Lsn(1200));
        assert_eq!(l.confirmed(), Lsn(900));
        l.ack(a).unwrap();
        assert_eq!(l.confirmed(), Lsn(1200));
    }

    #[test]
    fn never_reports_below_start() {
        let mut l = Ledger::new(Lsn(1000));
        l.observe_wal_end(Lsn(10));
        txn(&mut l, 0, 20);
        assert_eq!(l.confirmed(), Lsn(1000));
    }

    #[test]
    fn protocol_misuse_is_an_error() {
        let mut l = Ledger::new(Lsn(0));
        assert!(l.record_sent().is_err());
        assert!(l.commit(Lsn(1)).is_err());
        l.begin(0).unwrap();
        assert!(l.begin(0).is_err());
        assert_eq!(l.ack(0), Err(LedgerError::UnknownTransaction(0)));
        assert!(l.ack(7).is_err());
    }

    #[test]
    fn empty_transactions_behind_an_unacked_one_fold_into_one_entry() {
        let mut l = Ledger::new(Lsn(0));
        let a = txn(&mut l, 1, 100);
        for i in 0..100_000 {
            txn(&mut l, 0, 200 + i);
        }
        assert_eq!(l.transactions_held(), 1, "empty commits must not pile up");
        let b = txn(&mut l, 1, 200_000);
        assert_eq!(l.transactions_held(), 2);
        assert_eq!(l.confirmed(), Lsn(0));
        l.ack(b).unwrap();
        assert_eq!(l.confirmed(), Lsn(0), "b waits for a");
        assert!(!l.is_idle(), "a is unacknowledged");
        l.ack(a).unwrap();
        assert_eq!(l.confirmed(), Lsn(200_000));
        assert!(l.is_idle());
    }

    #[test]
    fn an_open_transaction_is_never_folded_into() {
        let mut l = Ledger::new(Lsn(0));
        let a = txn(&mut l, 1, 100);
        let b = l.begin(0).unwrap();
        l.record_sent().unwrap();
        l.ack(b).unwrap();
        // b's only record was acknowledged before its COMMIT arrived: it folds into a.
        l.commit(Lsn(300)).unwrap();
        assert_eq!(l.transactions_held(), 1);
        assert_eq!(l.confirmed(), Lsn(0));
        l.ack(a).unwrap();
        assert_eq!(l.confirmed(), Lsn(300));
    }

    proptest! {
        /// Whatever order acks arrive in, the confirmed position never passes a transaction
        /// with an unacknowledged record, never goes backwards, and reaches the last commit.
        #[test]
        fn no_ack_order_confirms_past_unacked(
            sizes in prop::collection::vec(0u64..4, 1..30),
            order_seed in any::<u64>(),
        ) {
            let mut l = Ledger::new(Lsn(0));
            // (sequence number, index in `sizes`): folded empty transactions give their
            // number to the next one.
            let mut acks = Vec::new();
            for (i, &n) in sizes.iter().enumerate() {
                let seq = txn(&mut l, n, (i as u64 + 1) * 10);
                acks.extend(std::iter::repeat_n((seq, i), n as usize));
            }
            // Deterministic shuffle from the seed.
            let mut state = order_seed | 1;
            for i in (1..acks.len()).rev() {
                state ^= state << 13; state ^= state >> 7; state ^= state << 17;
                acks.swap(i, (state % (i as u64 + 1)) as usize);
            }
            let mut pending: Vec<u64> = sizes.clone();
            let mut last = Lsn(0);
            for (seq, i) in acks {
                l.ack(seq).unwrap();
                pending[i] -= 1;
                let confirmed = l.confirmed();
                prop_assert!(confirmed >= last);
                last = confirmed;
                let first_unacked = pending.iter().position(|&p| p > 0);
                if let Some(i) = first_unacked {
                    prop_assert!(confirmed < Lsn((i as u64 + 1) * 10));
                }
            }
            prop_assert_eq!(l.confirmed(), Lsn(sizes.len() as u64 * 10));
            prop_assert!(l.is_idle());
        }
    }
}
