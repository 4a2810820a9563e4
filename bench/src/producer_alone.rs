//! The relay's Kafka producer with nothing in front of it: the relay's own librdkafka settings
//! (`client_config` of the defaults), its in-flight window, the backlog's payloads, the same
//! topics. What it reaches is the Kafka side's limit on this machine, as `pg_recvlogical`'s is
//! the walsender's: what the relay could send if reading and mapping cost nothing (a sample of
//! its own, on the broker as it is at that moment, not a strict ceiling). It runs as a process of its own (`outbox-bench producer-alone`), so that
//! its CPU is counted alone; `run --producer-alone` starts it after each drain and rate.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use outbox_relay::config::{Config, KafkaConfig};
use outbox_relay::sink::publisher::client_config;
use outbox_relay::sink::window::InFlight;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use crate::proc_stat::{clk_tck, cpu_seconds};
use crate::records::ProducerAlone;

/// How the records are sent: a backlog as fast as the window lets, or a steady rate.
#[derive(Debug, Clone, Copy)]
pub enum Pace {
    Backlog {
        events: u64,
    },
    Steady {
        rate: u64,
        seconds: u64,
        warm_up_seconds: u64,
    },
}

/// The window shared with the delivery reports, and the reports that were errors.
struct Settle {
    window: Mutex<InFlight>,
    room: Condvar,
    failed: AtomicU64,
    /// The first error a report carried, for the message that ends the run.
    first_error: Mutex<Option<String>>,
}

struct Reports(Arc<Settle>);

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, bytes: usize) {
        if let Err((error, _)) = result {
            let mut first = self.0.first_error.lock().unwrap();
            first.get_or_insert_with(|| error.to_string());
            self.0.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.0.window.lock().unwrap().settled(bytes);
        self.0.room.notify_one();
    }
}

/// Sends the records to `topics` (record i to topic i mod n, payload i mod m, a unique key
/// like the relay's event id) and waits for every acknowledgement.
pub fn produce(
    brokers: &str,
    topics: &[String],
    payloads: &[Vec<u8>],
    pace: Pace,
) -> anyhow::Result<ProducerAlone> {
    if topics.is_empty() || payloads.is_empty() {
        bail!("the producer alone needs at least one topic and one payload");
    }
    let config = kafka_config(brokers)?;
    let settle = Arc::new(Settle {
        window: Mutex::new(InFlight::new(
            config.max_in_flight_messages,
            config.max_in_flight_bytes,
        )),
        room: Condvar::new(),
        failed: AtomicU64::new(0),
        first_error: Mutex::new(None),
    });
    let clk_tck = clk_tck();
    let own_cpu = || cpu_seconds(std::process::id(), clk_tck);
    let (cpu0, started) = (own_cpu()?, Instant::now());
    let producer: ThreadedProducer<Reports> = client_config(&config)
        .create_with_context(Reports(settle.clone()))
        .context("create the producer")?;
    let mut sender = Sender {
        producer: &producer,
        settle: &settle,
        topics,
        payloads,
        sent: 0,
    };
    let (measured_from, cpu_from, events) = match pace {
        Pace::Backlog { events } => {
            sender.send_many(events, None)?;
            (started, cpu0, events)
        }
        Pace::Steady {
            rate,
            seconds,
            warm_up_seconds,
        } => {
            sender.send_many(rate * warm_up_seconds, Some(rate))?;
            sender.wait_all()?;
            let (from, cpu) = (Instant::now(), own_cpu()?);
            sender.send_many(rate * seconds, Some(rate))?;
            (from, cpu, rate * seconds)
        }
    };
    sender.wait_all()?;
    let seconds = measured_from.elapsed().as_secs_f64();
    Ok(ProducerAlone {
        events,
        seconds,
        cpu_seconds: own_cpu()? - cpu_from,
    })
}

/// The relay's Kafka settings: its defaults and this process's `OUTBOX_RELAY__KAFKA__…`
/// variables (the bench passes its `--relay-env`), read as the relay reads them.
fn kafka_config(brokers: &str) -> anyhow::Result<KafkaConfig> {
    let env = std::env::vars().filter(|(k, _)| k.starts_with("OUTBOX_RELAY__KAFKA__"));
    let config = Config::from_sources(None, env).context("the relay's Kafka settings")?;
    Ok(KafkaConfig {
        brokers: brokers.to_string(),
        ..config.kafka
    })
}

struct Sender<'a> {
    producer: &'a ThreadedProducer<Reports>,
    settle: &'a Settle,
    topics: &'a [String],
    payloads: &'a [Vec<u8>],
    sent: u64,
}

impl Sender<'_> {
    /// Sends `count` more records, each when the window has room; at a `rate`, wakes once a
    /// millisecond and sends the records due by then (the schedule starts now). Waking per
    /// record instead cost half again as much CPU at 5,000/s: the limit is the cheaper pace
    /// that still keeps a millisecond's latency.
    fn send_many(&mut self, count: u64, rate: Option<u64>) -> anyhow::Result<()> {
        let start = Instant::now();
        let mut sent = 0;
        while sent < count {
            let due = match rate {
                Some(rate) => (start.elapsed().as_secs_f64() * rate as f64) as u64 + 1,
                None => count,
            };
            if due <= sent {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            while sent < due.min(count) {
                self.send_one()?;
                sent += 1;
            }
        }
        Ok(())
    }

    fn send_one(&mut self) -> anyhow::Result<()> {
        let n = self.sent as usize;
        let payload = &self.payloads[n % self.payloads.len()];
        self.wait_room()?;
        self.settle.window.lock().unwrap().sent(payload.len());
        let key = format!("00000000-0000-4000-8000-{:012}", self.sent);
        let topic = &self.topics[n % self.topics.len()];
        let aggregate_id = (self.sent % 100_000).to_string();
        // The relay's four headers (docs/src/guides/routing.md: `id`, `type`, `aggregatetype`, `aggregateid`), so
        // that its records weigh what the relay's do.
        let headers = OwnedHeaders::new_with_capacity(4)
            .insert(header("id", &key))
            .insert(header("type", "OrderCreated"))
            .insert(header("aggregatetype", "order"))
            .insert(header("aggregateid", &aggregate_id));
        let mut record = BaseRecord::with_opaque_to(topic, payload.len())
            .key(&key)
            .payload(payload)
            .headers(headers);
        loop {
            match self.producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => bail!("send to {topic}: {e}"),
            }
        }
        self.sent += 1;
        Ok(())
    }

    /// Waits until the window has room; an error report ends the run (the limit is only a
    /// limit when every record arrived).
    fn wait_room(&self) -> anyhow::Result<()> {
        let mut window = self.settle.window.lock().unwrap();
        while !window.has_room() {
            window = self.settle.room.wait(window).unwrap();
        }
        drop(window);
        self.check_failed()
    }

    fn wait_all(&self) -> anyhow::Result<()> {
        let mut window = self.settle.window.lock().unwrap();
        while !window.is_empty() {
            window = self.settle.room.wait(window).unwrap();
        }
        drop(window);
        self.producer.flush(Duration::from_secs(30))?;
        self.check_failed()
    }

    fn check_failed(&self) -> anyhow::Result<()> {
        match self.settle.failed.load(Ordering::Relaxed) {
            0 => Ok(()),
            n => {
                let first = self.settle.first_error.lock().unwrap().clone();
                bail!(
                    "{n} records were not acknowledged, the first: {}",
                    first.unwrap_or_default()
                )
            }
        }
    }
}

fn header<'a>(key: &'a str, value: &'a str) -> Header<'a, &'a str> {
    Header {
        key,
        value: Some(value),
    }
}

/// Lines of a file: the topics, or the payloads (JSON text has no line breaks).
pub fn read_lines(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    Ok(text
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

/// Where a run of the producer alone sends what, and how.
pub struct Job<'a> {
    pub brokers: &'a str,
    /// Names the files written for it in `dir` (an identifier).
    pub name: &'a str,
    pub dir: &'a Path,
    pub topics: &'a [String],
    pub payloads: &'a [String],
    pub pace: Pace,
    /// The relays' `OUTBOX_RELAY__K=V` (`--relay-env`): its Kafka settings apply here too.
    pub relay_env: &'a [String],
}

/// Runs the producer alone as a process of its own (`outbox-bench producer-alone`), so that
/// nothing of the benchmark's counts in its CPU; its stderr goes to `<dir>/<name>.log`.
pub async fn run_process(job: &Job<'_>) -> anyhow::Result<ProducerAlone> {
    let file = |what: &str| job.dir.join(format!("{}-{what}", job.name));
    let (topics, payloads, log) = (file("topics.txt"), file("payloads.txt"), file("log"));
    std::fs::write(&topics, job.topics.join("\n"))?;
    std::fs::write(&payloads, job.payloads.join("\n"))?;
    let mut command = tokio::process::Command::new(std::env::current_exe()?);
    command
        .arg("producer-alone")
        .args(["--brokers", job.brokers])
        .arg("--topics-file")
        .arg(&topics)
        .arg("--payloads-file")
        .arg(&payloads)
        .args(pace_args(job.pace))
        .envs(job.relay_env.iter().filter_map(|kv| kv.split_once('=')))
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log)?)
        .kill_on_drop(true);
    let output = tokio::time::timeout(PROCESS_TIMEOUT, command.output())
        .await
        .with_context(|| format!("the producer alone ran over {PROCESS_TIMEOUT:?}"))??;
    if !output.status.success() {
        bail!(
            "the producer alone failed ({}); log: {}",
            output.status,
            log.display()
        );
    }
    let line = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(line.trim()).with_context(|| format!("producer-alone printed {line:?}"))
}

/// As long as a relay drain may take (`run/drain.rs`).
const PROCESS_TIMEOUT: Duration = Duration::from_secs(900);

/// The command-line options of `producer-alone` for `pace`.
fn pace_args(pace: Pace) -> Vec<String> {
    match pace {
        Pace::Backlog { events } => vec!["--events".into(), events.to_string()],
        Pace::Steady {
            rate,
            seconds,
            warm_up_seconds,
        } => vec![
            "--rate".into(),
            rate.to_string(),
            "--seconds".into(),
            seconds.to_string(),
            "--warm-up-seconds".into(),
            warm_up_seconds.to_string(),
        ],
    }
}

/// The pace given on the command line: `--events`, or `--rate` with `--seconds`.
pub fn pace_of(
    events: Option<u64>,
    rate: Option<u64>,
    seconds: Option<u64>,
    warm_up_seconds: u64,
) -> anyhow::Result<Pace> {
    match (events, rate, seconds) {
        (Some(events), None, None) => Ok(Pace::Backlog { events }),
        (None, Some(rate), Some(seconds)) if rate > 0 => Ok(Pace::Steady {
            rate,
            seconds,
            warm_up_seconds,
        }),
        _ => bail!("give --events N, or --rate R (> 0) with --seconds S"),
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::ClientConfig;

    use super::*;

    /// Records in `topic` (the sum of its partitions' high watermarks).
    fn records_in(brokers: &str, topic: &str, partitions: i32) -> i64 {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()
            .unwrap();
        (0..partitions)
            .map(|p| {
                let (low, high) = consumer
                    .fetch_watermarks(topic, p, Duration::from_secs(10))
                    .unwrap();
                high - low
            })
            .sum()
    }

    /// Against the test suite's broker (scripts/test.sh): every record arrives, and a steady
    /// rate takes at least its schedule's time (its warm-up not counted in the figures).
    #[tokio::test(flavor = "multi_thread")]
    async fn sends_every_record_of_a_backlog_and_keeps_a_rate() {
        let brokers = std::env::var("OUTBOX_TEST_KAFKA_BROKERS")
            .expect("OUTBOX_TEST_KAFKA_BROKERS is not set: run the tests through scripts/test.sh");
        let topic = format!("bench-producer-alone-{}", std::process::id());
        crate::kafka::create_topics(&brokers, 3, &[], std::slice::from_ref(&topic))
            .await
            .unwrap();
        let (topics, payloads) = (vec![topic.clone()], vec![vec![b'x'; 1000], vec![b'y'; 10]]);
        let backlog = Pace::Backlog { events: 300 };
        let (b, t) = (brokers.clone(), topics.clone());
        let (p, q) = (payloads.clone(), payloads);
        let sent = tokio::task::spawn_blocking(move || produce(&b, &t, &p, backlog))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(sent.events, 300);
        assert!(sent.seconds > 0.0 && sent.cpu_seconds >= 0.0, "{sent:?}");
        assert_eq!(records_in(&brokers, &topic, 3), 300);
        let steady = Pace::Steady {
            rate: 200,
            seconds: 1,
            warm_up_seconds: 1,
        };
        let b = brokers.clone();
        let sent = tokio::task::spawn_blocking(move || produce(&b, &topics, &q, steady))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(sent.events, 200, "the warm-up's records are not counted");
        assert!(
            sent.seconds >= 0.99,
            "200 records at 200/s took {} s",
            sent.seconds
        );
        assert_eq!(records_in(&brokers, &topic, 3), 300 + 2 * 200);
    }

    #[test]
    fn the_command_line_gives_back_the_pace() {
        let steady = Pace::Steady {
            rate: 2000,
            seconds: 30,
            warm_up_seconds: 3,
        };
        let args = pace_args(steady);
        let get = |name: &str| {
            let at = args.iter().position(|a| a == name)?;
            args[at + 1].parse::<u64>().ok()
        };
        let back = pace_of(get("--events"), get("--rate"), get("--seconds"), 3).unwrap();
        assert!(matches!(
            back,
            Pace::Steady {
                rate: 2000,
                seconds: 30,
                warm_up_seconds: 3
            }
        ));
        let args = pace_args(Pace::Backlog { events: 500 });
        assert_eq!(args, ["--events", "500"]);
        assert!(
            pace_of(Some(5), Some(1), Some(1), 0).is_err(),
            "both paces at once"
        );
        assert!(pace_of(None, Some(0), Some(1), 0).is_err(), "a rate of 0");
        assert!(
            pace_of(None, Some(10), None, 0).is_err(),
            "a rate without seconds"
        );
    }
}
