//! Native librdkafka topic handles, one per topic: made on the topic's first record and
//! passed with every later one.
//!
//! rust-rdkafka's `BaseProducer::send` names the topic of each record. librdkafka then finds
//! the topic by comparing that name with each of its topics in turn (`rd_kafka_topic_find_fl`),
//! which with 1,000 topics was a third of the relay's CPU, and the name is copied into a
//! `CString` first. A handle from `rd_kafka_topic_new` needs neither (`RD_KAFKA_VTYPE_RKT`).
//!
//! Everything else about a record is passed as `BaseProducer::send` passes it, so that its
//! delivery report (read back by rust-rdkafka, opaque included) is the same.

use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::bindings::rd_kafka_vtype_t::*;
use rdkafka::error::{IsError, KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use rdkafka::util::IntoOpaque;

use crate::mapping::Record;

/// librdkafka's `RD_KAFKA_PARTITION_UA` (a C macro, missing from the bindings): the
/// partitioner picks the partition.
const PARTITION_UA: i32 = -1;

/// The handles of the topics a producer has written to, and the producer itself.
///
/// librdkafka's `rd_kafka_destroy` must not run while topic handles are alive: its manual
/// says destroy can then hang, and in 2.12.1 a handle destroyed afterwards would touch the
/// freed client. So this holds a reference to the producer of its own and lets go of it only
/// after destroying every handle: fields drop in declaration order, `handles` first.
pub(super) struct TopicHandles<C: ProducerContext> {
    handles: Mutex<HashMap<String, TopicHandle>>,
    producer: Arc<BaseProducer<C>>,
}

impl<C: ProducerContext> TopicHandles<C> {
    pub(super) fn new(producer: Arc<BaseProducer<C>>) -> Self {
        TopicHandles {
            handles: Mutex::new(HashMap::new()),
            producer,
        }
    }

    /// Hands `record` to librdkafka for `partition` (`None`: the partitioner picks one), with
    /// `opaque` for its delivery report. Fails as `BaseProducer::send` does: a full queue is
    /// `MessageProduction(QueueFull)`.
    pub(super) fn send(
        &self,
        record: &Record,
        partition: Option<i32>,
        opaque: C::DeliveryOpaque,
    ) -> Result<(), KafkaError> {
        let topic = self.handle(&record.topic)?;
        let headers = NativeHeaders::of(record)?;
        let (payload, payload_len) = match &record.payload {
            Some(p) => (p.as_ptr() as *mut c_void, p.len()),
            None => (ptr::null_mut(), 0),
        };
        let opaque = opaque.into_ptr();
        // SAFETY: the client is alive (we hold it); `topic` is a live handle of it (handles go
        // only when `self` does); every pointer/length pair points into `record`, which
        // librdkafka copies (F_COPY) before returning; each value has the C type its tag takes.
        let code = unsafe {
            rdsys::rd_kafka_producev(
                self.producer.client().native_ptr(),
                RD_KAFKA_VTYPE_RKT,
                topic,
                RD_KAFKA_VTYPE_PARTITION,
                partition.unwrap_or(PARTITION_UA),
                RD_KAFKA_VTYPE_MSGFLAGS,
                rdsys::RD_KAFKA_MSG_F_COPY,
                RD_KAFKA_VTYPE_VALUE,
                payload,
                payload_len,
                RD_KAFKA_VTYPE_KEY,
                record.key.as_ptr() as *mut c_void,
                record.key.len(),
                RD_KAFKA_VTYPE_OPAQUE,
                opaque,
                RD_KAFKA_VTYPE_TIMESTAMP,
                record.timestamp_ms.unwrap_or(0),
                RD_KAFKA_VTYPE_HEADERS,
                headers.as_ref().map_or(ptr::null_mut(), NativeHeaders::ptr),
                RD_KAFKA_VTYPE_END,
            )
        };
        if code.is_error() {
            // SAFETY: `opaque` came from `into_ptr` above, and librdkafka refused the message,
            // so nothing else will turn it back: it is reclaimed (and dropped) once, here.
            drop(unsafe { C::DeliveryOpaque::from_ptr(opaque) });
            // The headers stay ours on failure; dropping them frees them.
            return Err(KafkaError::MessageProduction(code.into()));
        }
        // librdkafka owns the headers now and frees them with the message.
        if let Some(headers) = headers {
            headers.hand_over();
        }
        Ok(())
    }

    /// The topic's handle, made on its first record. The pointer stays valid as long as
    /// `self`: handles are destroyed only when the map is dropped.
    fn handle(&self, topic: &str) -> Result<*mut rdsys::rd_kafka_topic_t, KafkaError> {
        let mut handles = self.handles.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(handle) = handles.get(topic) {
            return Ok(handle.0.as_ptr());
        }
        let handle = TopicHandle::new(self.producer.client().native_ptr(), topic)?;
        let raw = handle.0.as_ptr();
        handles.insert(topic.to_owned(), handle);
        Ok(raw)
    }

    /// The partition count (or the brokers' error) of each of `topics`, from ONE metadata
    /// request: that of every topic librdkafka knows locally (those with a handle and those
    /// in its metadata cache), after making a handle for each of `topics` so that they are
    /// among them. A request per topic instead, for a burst of new topics, made as many
    /// requests at once (one blocking thread each) and timed out under load.
    ///
    /// The request may create missing topics, as one for a single topic does, when the
    /// brokers auto-create topics. It blocks its caller for up to `timeout`.
    pub(super) fn fetch_counts(
        &self,
        topics: &[String],
        timeout: Duration,
    ) -> Result<TopicCounts, KafkaError> {
        let mut counts = TopicCounts::new();
        for topic in topics {
            if let Err(e) = self.handle(topic) {
                let code = match e {
                    KafkaError::MessageProduction(code) => code,
                    _ => RDKafkaErrorCode::InvalidArgument,
                };
                counts.insert(topic.clone(), Err(code));
            }
        }
        let metadata = LocalMetadata::fetch(self.producer.client().native_ptr(), timeout)?;
        for (name, count) in metadata.counts() {
            if let Some(topic) = topics.iter().find(|t| **t == name) {
                counts.entry(topic.clone()).or_insert(count);
            }
        }
        for topic in topics {
            counts
                .entry(topic.clone())
                .or_insert(Err(RDKafkaErrorCode::UnknownTopicOrPartition));
        }
        Ok(counts)
    }

    /// How many topic handles are alive.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.handles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// What a metadata response said of each topic asked for: its partition count, or the
/// brokers' error for it (a topic without partitions counts as unknown).
pub(super) type TopicCounts = HashMap<String, Result<i32, RDKafkaErrorCode>>;

/// A metadata response of librdkafka's, freed on drop.
struct LocalMetadata(NonNull<rdsys::rd_kafka_metadata>);

impl LocalMetadata {
    /// One metadata request for the client's local topics (`all_topics = 0`, no single topic).
    fn fetch(client: *mut rdsys::rd_kafka_t, timeout: Duration) -> Result<Self, KafkaError> {
        let mut raw: *const rdsys::rd_kafka_metadata = ptr::null();
        let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `client` is a live client (the caller holds it); librdkafka writes a
        // metadata pointer that is ours to free (with rd_kafka_metadata_destroy) on success.
        let code =
            unsafe { rdsys::rd_kafka_metadata(client, 0, ptr::null_mut(), &mut raw, timeout_ms) };
        if code.is_error() {
            return Err(KafkaError::MetadataFetch(code.into()));
        }
        NonNull::new(raw.cast_mut())
            .map(LocalMetadata)
            .ok_or(KafkaError::MetadataFetch(RDKafkaErrorCode::Fail))
    }

    /// Each topic of the response, by name, with its count or error.
    fn counts(&self) -> Vec<(String, Result<i32, RDKafkaErrorCode>)> {
        // SAFETY: the response is alive (ours until drop) and nothing else writes it.
        let metadata = unsafe { self.0.as_ref() };
        let n = usize::try_from(metadata.topic_cnt).unwrap_or(0);
        if n == 0 || metadata.topics.is_null() {
            return Vec::new();
        }
        // SAFETY: librdkafka filled `topics` with `topic_cnt` entries, alive with the response.
        let topics = unsafe { std::slice::from_raw_parts(metadata.topics, n) };
        topics
            .iter()
            .map(|t| {
                // SAFETY: each topic name is a NUL-terminated string of the response.
                let name = unsafe { CStr::from_ptr(t.topic) };
                let count = if t.err.is_error() {
                    Err(t.err.into())
                } else if t.partition_cnt <= 0 {
                    Err(RDKafkaErrorCode::UnknownTopicOrPartition)
                } else {
                    Ok(t.partition_cnt)
                };
                (name.to_string_lossy().into_owned(), count)
            })
            .collect()
    }
}

impl Drop for LocalMetadata {
    fn drop(&mut self) {
        // SAFETY: the response came from rd_kafka_metadata and is freed once, here.
        unsafe { rdsys::rd_kafka_metadata_destroy(self.0.as_ptr()) }
    }
}

/// One `rd_kafka_topic_t` of ours (an application reference), destroyed on drop.
struct TopicHandle(NonNull<rdsys::rd_kafka_topic_t>);

// SAFETY: librdkafka topic handles are thread safe and reference counted: any thread may
// produce with one, and destroying ours (once, in `Drop`) drops only our reference.
unsafe impl Send for TopicHandle {}
// SAFETY: as for `Send`; nothing is done through a shared `&TopicHandle` but reading the pointer.
unsafe impl Sync for TopicHandle {}

impl TopicHandle {
    fn new(client: *mut rdsys::rd_kafka_t, topic: &str) -> Result<TopicHandle, KafkaError> {
        let name = CString::new(topic)?;
        // SAFETY: `client` is a live producer (the caller holds it) and `name` a C string that
        // librdkafka copies. A NULL configuration means the producer's default topic
        // configuration, as for a record that names its topic.
        let raw = unsafe { rdsys::rd_kafka_topic_new(client, name.as_ptr(), ptr::null_mut()) };
        // NULL: a name librdkafka refuses (over 512 bytes). Producing by name fails so too.
        NonNull::new(raw)
            .map(TopicHandle)
            .ok_or(KafkaError::MessageProduction(
                RDKafkaErrorCode::InvalidArgument,
            ))
    }
}

impl Drop for TopicHandle {
    fn drop(&mut self) {
        // SAFETY: the handle came from `rd_kafka_topic_new` and is destroyed once, here, while
        // its producer is alive (`TopicHandles` outlives its handles' producer reference).
        // Records in flight keep librdkafka's own references to the topic.
        unsafe { rdsys::rd_kafka_topic_destroy(self.0.as_ptr()) }
    }
}

/// A record's headers as librdkafka's own list: ours until producing succeeds, freed on drop.
struct NativeHeaders(NonNull<rdsys::rd_kafka_headers_t>);

impl NativeHeaders {
    /// The record's headers; `None` when it has none (then no list is passed at all).
    fn of(record: &Record) -> Result<Option<NativeHeaders>, KafkaError> {
        if record.headers.is_empty() {
            return Ok(None);
        }
        // SAFETY: a plain allocation; librdkafka aborts rather than return NULL.
        let raw = unsafe { rdsys::rd_kafka_headers_new(record.headers.len()) };
        let headers = NativeHeaders(NonNull::new(raw).expect("librdkafka allocates or aborts"));
        for (name, value) in &record.headers {
            // SAFETY: the list is ours and writable; name and value are given with their
            // lengths (no NUL needed) and copied by librdkafka.
            let code = unsafe {
                rdsys::rd_kafka_header_add(
                    headers.ptr(),
                    name.as_ptr().cast(),
                    name.len() as isize,
                    value.as_ptr().cast(),
                    value.len() as isize,
                )
            };
            if code.is_error() {
                return Err(KafkaError::MessageProduction(code.into()));
            }
        }
        Ok(Some(headers))
    }

    fn ptr(&self) -> *mut rdsys::rd_kafka_headers_t {
        self.0.as_ptr()
    }

    /// librdkafka took the list with a message: it is not ours to free any more.
    fn hand_over(self) {
        std::mem::forget(self);
    }
}

impl Drop for NativeHeaders {
    fn drop(&mut self) {
        // SAFETY: the list is ours (never handed over, or `hand_over` would have skipped this)
        // and freed once, here.
        unsafe { rdsys::rd_kafka_headers_destroy(self.0.as_ptr()) }
    }
}
