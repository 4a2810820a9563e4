//! `kafka-refusals.md`: what the relay does when Kafka says no, one row per fault of
//! `sink::fault`'s one classification, with the codes its list gives it.

use crate::sink::fault::{KafkaFault, Stamp, Verdict, CODES};

/// A librdkafka code as the relay's log names it (its Rust name, then librdkafka's number
/// and description: `MessageSizeTooLarge (Broker: Message size too large)`, code 10).
fn code_name(code: rdkafka::types::RDKafkaErrorCode) -> String {
    format!("`{code}`, code {}", code as i32)
}

/// What a verdict says, in a word or two.
fn verdict_name(verdict: Verdict) -> String {
    match verdict {
        Verdict::Retry => "retry".into(),
        Verdict::Hold(reason) => format!("hold (`{}`)", reason.name()),
        Verdict::JudgeSize => "judge the size".into(),
        Verdict::OwnFault(reason) => format!("dead letter (`{}`)", reason.code()),
    }
}

pub(super) fn page() -> String {
    let mut faults: Vec<KafkaFault> = Vec::new();
    for (_, fault) in CODES {
        if !faults.contains(fault) {
            faults.push(*fault);
        }
    }
    faults.push(KafkaFault::Transient);

    let mut out = String::from("# What the relay does when Kafka says no\n\n");
    out.push_str(
        "Every refusal of Kafka (a delivery report, a record refused before it is sent, a \
         metadata read) is classified once, where it enters, into one fault; what the relay \
         does follows from the fault alone, and from where the record's timestamp came from \
         (the row's own, `outbox.timestamp_column`, or the commit time). A deployment error — \
         a missing ACL or topic, a refused login — is never a record's fault: it holds what \
         waits for it, turns `/readyz` red, shows in `outbox_relay_kafka_blocked` and logs the \
         fix. See [dead letters](../guides/dead-letters.md) and [Kafka](../guides/kafka.md).\n\n",
    );
    out.push_str(
        "| Kafka says | whose fault | verdict (row's own time / commit time) | what the relay does |\n\
         |---|---|---|---|\n",
    );
    for fault in faults {
        let codes: Vec<String> = CODES
            .iter()
            .filter(|(_, f)| *f == fault)
            .map(|(code, _)| code_name(*code))
            .collect();
        let codes = if codes.is_empty() {
            "any other code".to_string()
        } else {
            codes.join(", ")
        };
        let (whose, what) = fault.describe();
        let (own, commit) = (
            verdict_name(fault.verdict(Stamp::Row)),
            verdict_name(fault.verdict(Stamp::CommitOrUnknown)),
        );
        let verdict = if own == commit {
            own
        } else {
            format!("{own} / {commit}")
        };
        out.push_str(&format!("| {codes} | {whose} | {verdict} | {what} |\n"));
    }
    out.push_str(
        "\nA size refusal is judged because Kafka checks a topic's `max.message.bytes` against \
         a whole record batch and librdkafka fails every record of a refused batch without \
         splitting it: a record at least as large as the producer's `batch.size` was alone in \
         its batch, and its refusal is its own; any other was refused with its neighbours, \
         and the producer is made again with batches within the limit learned.\n",
    );
    super::banner("src/sink/fault.rs") + &super::escape_angles(&out)
}
