//! The command line's definition: every command, flag and help text, in one place.
//!
//! `main` parses it and dispatches; the generated reference (`docs/src/reference/commands.md`)
//! walks the same definition, so the page cannot drift from the flags.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::{dead_letters, slot};

#[derive(Parser)]
#[command(
    name = "outbox-relay",
    version,
    about = "Transactional outbox relay: PostgreSQL logical replication to Kafka"
)]
pub struct Cli {
    /// The config file (TOML). Every key can also be set as OUTBOX_RELAY__<SECTION>__<KEY>.
    #[arg(long, short, global = true, env = "OUTBOX_RELAY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log one JSON object per line (overrides relay.log_format).
    #[arg(long, global = true)]
    pub log_json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Stream the outbox to Kafka until SIGTERM or Ctrl-C.
    Run,
    /// Print the effective configuration, secrets redacted.
    ///
    /// With --from-debezium, print instead the configuration equivalent to a Debezium
    /// PostgreSQL connector with the outbox event router.
    Config(ConfigArgs),
    /// Pre-flight: check PostgreSQL and Kafka set-up; each problem comes with its fix.
    ///
    /// Exit 0 when there is no problem (warnings allowed), 1 otherwise.
    Check(JsonFlag),
    /// Where the relay stands: slot, lag, retained WAL, publication, outbox rows.
    ///
    /// Read-only; safe while the relay runs. Exit 1 when the slot is missing or lost.
    Status(JsonFlag),
    /// Create, drop or advance the replication slot; release its sweeper hold.
    #[command(subcommand)]
    Slot(SlotCommand),
    /// Re-publish events still in the outbox table (the rewind a slot cannot do).
    ///
    /// Rows are selected by the given filters (all must match) and sent in created_at, id order
    /// with the same topic, key, payload and headers as the live stream, plus the header
    /// `outbox-relay-replay: true`. Success is reported only once Kafka acknowledged every
    /// record; any failure exits 1.
    Replay(ReplayArgs),
    /// Read the dead-letter topic (`dead_letter.topic`).
    #[command(subcommand)]
    DeadLetters(DeadLettersCommand),
}

#[derive(Args)]
pub struct ConfigArgs {
    /// A Debezium PostgreSQL connector's configuration using the outbox event router (a
    /// `.properties` file, or Kafka Connect's JSON `{"name": …, "config": {…}}`): print the
    /// equivalent TOML, each mapped key named in a comment; keys that cannot be mapped are
    /// listed on stderr with the reason. Reads no config file and connects to nothing.
    #[arg(long, value_name = "FILE")]
    pub from_debezium: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum DeadLettersCommand {
    /// List dead letters (reason, event id, original topic or table, error), filtered; reads
    /// the topic from its beginning to its current end and consumes nothing.
    List(DeadLettersListArgs),
    /// Send dead letters back: those of a mapping reason are mapped again with the current
    /// configuration, those Kafka refused are re-sent to their topic as they were.
    ///
    /// Reads from the position of its consumer group (--group), which is committed only once
    /// Kafka acknowledged what was sent: an interrupted redrive resumes, a finished one run
    /// again sends nothing. Records still unmappable are dead-lettered again with their
    /// redrive count raised; past --max-redrives a dead letter is left and reported. Exit 1
    /// when Kafka did not take a record (run it again).
    Redrive(DeadLettersRedriveArgs),
}

#[derive(Args)]
pub struct DeadLettersRedriveArgs {
    #[command(flatten)]
    pub select: DeadLettersListArgs,
    /// Decide and report, but send and commit nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Leave a dead letter that was redriven this many times already.
    #[arg(long, value_name = "N", default_value_t = dead_letters::DEFAULT_MAX_REDRIVES)]
    pub max_redrives: u32,
    /// The consumer group holding the redrive's position. Filters pass over the dead letters
    /// they do not select; redrive those later with another group.
    #[arg(long, default_value = dead_letters::REDRIVE_GROUP)]
    pub group: String,
}

#[derive(Args)]
pub struct DeadLettersListArgs {
    /// Only this reason: mapping, invalid_topic, too_large or rejected.
    #[arg(long)]
    pub reason: Option<String>,
    /// Only the dead letter of this event id (the record's `id` header, whatever
    /// `key_column` made its key).
    #[arg(long, value_name = "ID")]
    pub event_id: Option<String>,
    /// Only those of this original topic (or, for rows that never became a record, table).
    #[arg(long)]
    pub topic: Option<String>,
    /// Records timestamped at or after this RFC 3339 time (e.g. 2026-05-01T12:00:00Z).
    #[arg(long, value_name = "TIME")]
    pub since: Option<jiff::Timestamp>,
    /// Records timestamped before this RFC 3339 time.
    #[arg(long, value_name = "TIME")]
    pub until: Option<jiff::Timestamp>,
    /// Show (redrive: send) at most this many; the counts per reason cover all that match.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    #[command(flatten)]
    pub out: JsonFlag,
}

#[derive(Args)]
pub struct JsonFlag {
    /// Print the result as JSON on stdout (for scripts).
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum SlotCommand {
    /// Create the logical slot (pgoutput) if it does not exist. Idempotent.
    Create(JsonFlag),
    /// Drop the slot. Idempotent. Refuses while the slot is active unless --force.
    Drop {
        /// Confirm: the slot's position is lost, and events committed while no slot exists are
        /// never relayed.
        #[arg(long)]
        yes: bool,
        /// End the backend holding the slot first (pg_terminate_backend). Stop a running relay
        /// instead: it reconnects.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Skip forward: move the slot's confirmed position to an LSN, or to `now`.
    ///
    /// Events committed in between are not relayed. A slot cannot move backwards: to send
    /// events again, use `replay`. Refuses while the slot is active unless --force.
    Advance {
        /// The target position, like 0/16B3748, or `now` for the server's current position.
        #[arg(long, value_name = "LSN|now")]
        to: slot::AdvanceTarget,
        /// End the backend holding the slot first (pg_terminate_backend).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// End the sweeper hold on the rows a new slot never streamed (a covering `replay`
    /// releases it by itself): they are then swept once older than the retention.
    ReleaseHold {
        /// Confirm: the held rows are deleted once they pass the retention.
        #[arg(long)]
        yes: bool,
        /// Only this outbox table's hold (`schema.table`, or a bare name in public).
        #[arg(long, value_name = "TABLE")]
        table: Option<String>,
        #[command(flatten)]
        out: JsonFlag,
    },
}

#[derive(Args)]
pub struct ReplayArgs {
    /// Rows with created_at at or after this time (PostgreSQL timestamptz input,
    /// e.g. '2026-05-01 12:00:00+00'; '-infinity' selects all).
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub since: Option<String>,
    /// Rows with created_at before this time.
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub until: Option<String>,
    /// Rows whose id is at least this (compared as the id column's type).
    #[arg(long, value_name = "ID", allow_hyphen_values = true)]
    pub from_id: Option<String>,
    /// Rows whose id is at most this.
    #[arg(long, value_name = "ID", allow_hyphen_values = true)]
    pub to_id: Option<String>,
    /// Rows of this aggregate type only.
    #[arg(long, value_name = "TYPE")]
    pub aggregate_type: Option<String>,
    /// Rows of this event type only.
    #[arg(long = "type", value_name = "TYPE")]
    pub event_type: Option<String>,
    /// Replay only this outbox table (`schema.table`, or a bare name in public); default: every
    /// configured table, merged in created_at order.
    #[arg(long, value_name = "TABLE")]
    pub table: Option<String>,
    /// Count and map the selected rows; send nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub out: JsonFlag,
}
