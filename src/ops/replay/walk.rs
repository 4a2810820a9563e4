//! Going through the selected rows: every table's rows read a page at a time through a portal
//! in one read-only snapshot, merged by `created_at`, mapped, counted per topic and handed to
//! the sender (or only counted, in a dry run).

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use tokio_postgres::{Portal, Row, Transaction};

use super::progress::Progress;
use super::rebuild::TableSource;
use super::send::Sender;
use super::{ReplayOptions, ReplayReport, REPLAY_HEADER, REPLAY_HEADER_VALUE};
use crate::postgres::control::describe;

/// Rows fetched per round trip.
const PAGE_ROWS: i32 = 1_000;

/// One table's selected rows, read a page at a time.
struct Cursor<'a> {
    source: &'a TableSource,
    portal: Portal,
    page: VecDeque<Row>,
    done: bool,
}

/// Going through the selected rows: counts, topics and progress.
pub(super) struct Walk {
    matched: u64,
    tables: BTreeMap<String, u64>,
    dry_run: bool,
    mapped: u64,
    topics: BTreeMap<String, u64>,
    started: Instant,
    pub(super) progress: Progress,
}

impl Walk {
    pub(super) fn new(
        tables: BTreeMap<String, u64>,
        options: &ReplayOptions,
        started: Instant,
    ) -> Walk {
        let matched = tables.values().sum();
        Walk {
            matched,
            tables,
            dry_run: options.dry_run,
            mapped: 0,
            topics: BTreeMap::new(),
            started,
            progress: Progress::new(options.progress, matched),
        }
    }

    /// Pages through every table's rows, merged by `created_at` (ties: the configured table
    /// order), sending each (unless a dry run). Stops at the first failure: its description is
    /// the error.
    pub(super) async fn rows(
        &mut self,
        tx: &Transaction<'_>,
        sources: &[TableSource],
        mut sender: Option<&mut Sender>,
    ) -> Result<(), String> {
        let mut cursors = Vec::with_capacity(sources.len());
        for source in sources {
            let statement = tx
                .prepare(&source.query.select_sql())
                .await
                .map_err(|e| format!("preparing the row query: {}", describe(&e)))?;
            let portal = tx
                .bind(&statement, &source.query.params())
                .await
                .map_err(|e| format!("selecting the rows: {}", describe(&e)))?;
            cursors.push(Cursor {
                source,
                portal,
                page: VecDeque::new(),
                done: false,
            });
        }
        loop {
            for cursor in cursors.iter_mut().filter(|c| c.page.is_empty() && !c.done) {
                let rows = tx
                    .query_portal(&cursor.portal, PAGE_ROWS)
                    .await
                    .map_err(|e| format!("reading the rows: {}", describe(&e)))?;
                cursor.done = rows.is_empty();
                cursor.page.extend(rows);
            }
            let next = cursors
                .iter()
                .enumerate()
                .filter_map(|(i, c)| {
                    let row = c.page.front()?;
                    Some((c.source.created_us(row).unwrap_or(i64::MAX), i))
                })
                .min();
            let Some((_, i)) = next else {
                return Ok(());
            };
            let cursor = &mut cursors[i];
            let Some(row) = cursor.page.pop_front() else {
                continue;
            };
            let event = cursor.source.event(&row).map_err(|e| e.to_string())?;
            *self.topics.entry(event.record.topic.clone()).or_default() += 1;
            self.mapped += 1;
            match sender.as_deref_mut() {
                Some(sender) => sender.send(&event, &mut self.progress).await?,
                None => self.progress.update(self.mapped),
            }
        }
    }

    pub(super) fn report(
        self,
        sender: Option<Sender>,
        stopped: Option<String>,
        commit_time: &str,
    ) -> ReplayReport {
        let (sent, acknowledged, failed, failures) = match sender {
            Some(s) => (s.sent, s.acknowledged, s.failed, s.failures),
            None => (0, 0, 0, Vec::new()),
        };
        let complete = match self.dry_run {
            true => self.mapped == self.matched,
            false => failed == 0 && acknowledged == self.matched,
        };
        ReplayReport {
            ok: stopped.is_none() && complete,
            dry_run: self.dry_run,
            matched: self.matched,
            sent,
            acknowledged,
            failed,
            tables: self.tables,
            topics: self.topics,
            header: format!("{REPLAY_HEADER}: {REPLAY_HEADER_VALUE}"),
            commit_time: commit_time.to_string(),
            seconds: self.started.elapsed().as_secs_f64(),
            failures,
            stopped,
            sweeper_holds: Vec::new(),
        }
    }
}
