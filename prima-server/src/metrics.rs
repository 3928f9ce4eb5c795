//! The server's Prometheus metrics, recorded through the `metrics` facade and rendered
//! by `metrics-exporter-prometheus` at `GET /metrics`.
//!
//! Recording functions work whether or not [`install`] was called (without a recorder
//! they do nothing), so the worker and the ring can record unconditionally.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::board;
use crate::job::{Completion, WorkerError};
use prima_cluster::prp::failover::{FailoverEvent, ResilientRing};
use prima_cluster::prp::DeviceStats;

pub const REQUESTS: &str = "prima_requests_total";
pub const REQUEST_ERRORS: &str = "prima_request_errors_total";
pub const GENERATIONS: &str = "prima_generations_total";
pub const GENERATION_ERRORS: &str = "prima_generation_errors_total";
pub const PROMPT_TOKENS: &str = "prima_prompt_tokens_total";
pub const CACHED_PROMPT_TOKENS: &str = "prima_prompt_tokens_cached_total";
pub const GENERATED_TOKENS: &str = "prima_generated_tokens_total";
pub const TTFT: &str = "prima_time_to_first_token_seconds";
pub const TPOT: &str = "prima_time_per_output_token_seconds";
pub const DEVICE_COMPUTE: &str = "prima_device_compute_microseconds_total";
pub const DEVICE_NETWORK: &str = "prima_device_network_microseconds_total";
pub const DEVICE_WAIT: &str = "prima_device_wait_microseconds_total";
pub const DEVICE_DISK: &str = "prima_device_disk_microseconds_total";
pub const DEVICE_DISK_READ: &str = "prima_device_disk_read_bytes_total";
pub const DEVICE_MAJOR_FAULTS: &str = "prima_device_major_faults_total";
pub const DEVICE_MEMORY_PRESSURE: &str = "prima_device_memory_pressure";
pub const RING_REPLANS: &str = "prima_ring_replans_total";
pub const RING_NO_PLAN: &str = "prima_ring_no_plan_total";
pub const RING_RECOVERY: &str = "prima_ring_recovery_seconds";
pub const RING_DEVICES: &str = "prima_ring_devices";
pub const DRAFT_TOKENS: &str = "prima_draft_tokens_total";
pub const DRAFT_ACCEPTED: &str = "prima_draft_accepted_total";
pub const SLOTS: &str = "prima_slots";
pub const SLOTS_BUSY: &str = "prima_slots_busy";
pub const QUEUE_LENGTH: &str = "prima_queue_length";
pub const BATCH_SEQUENCES: &str = "prima_batch_sequences";
pub const BATCH_TOKENS: &str = "prima_batch_tokens";

/// Seconds: from 5 ms to a minute (a long prompt on a slow ring).
const TTFT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Seconds per token: from 1 ms to 10 s (weights streamed from disk).
const TPOT_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];
/// Sequences per batch: 1 to 64 slots.
const SEQUENCE_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0];
/// Tokens per batch: one decode row to a full prompt batch.
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0,
];

/// Installs the process-wide Prometheus recorder once and returns its handle; later calls
/// return the same handle. `None` when another recorder was installed first.
pub fn install() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Full(TTFT.into()), TTFT_BUCKETS)
                .and_then(|b| b.set_buckets_for_metric(Matcher::Full(TPOT.into()), TPOT_BUCKETS))
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(RING_RECOVERY.into()), TTFT_BUCKETS)
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full(BATCH_SEQUENCES.into()),
                        SEQUENCE_BUCKETS,
                    )
                })
                .and_then(|b| {
                    b.set_buckets_for_metric(Matcher::Full(BATCH_TOKENS.into()), TOKEN_BUCKETS)
                });
            match builder.and_then(|b| b.install_recorder()) {
                Ok(handle) => {
                    describe();
                    Some(handle)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics are off");
                    None
                }
            }
        })
        .clone()
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(REQUESTS, "HTTP requests by endpoint");
    describe_counter!(
        REQUEST_ERRORS,
        "HTTP requests answered with an error, by endpoint and type"
    );
    describe_counter!(
        GENERATIONS,
        "Finished generations by finish reason (cancelled includes those cancelled while queued)"
    );
    describe_counter!(GENERATION_ERRORS, "Generations that failed, by error type");
    describe_counter!(
        PROMPT_TOKENS,
        Unit::Count,
        "Prompt tokens of finished generations"
    );
    describe_counter!(
        CACHED_PROMPT_TOKENS,
        Unit::Count,
        "Prompt tokens reused from the previous request's cache"
    );
    describe_counter!(GENERATED_TOKENS, Unit::Count, "Generated tokens");
    describe_histogram!(
        TTFT,
        Unit::Seconds,
        "Time to first token (prompt processing)"
    );
    describe_histogram!(
        TPOT,
        Unit::Seconds,
        "Mean time per output token after the first"
    );
    describe_counter!(
        DEVICE_COMPUTE,
        Unit::Microseconds,
        "Time each ring device spent computing"
    );
    describe_counter!(
        DEVICE_NETWORK,
        Unit::Microseconds,
        "Time each ring device spent handing activations to the transport"
    );
    describe_counter!(
        DEVICE_WAIT,
        Unit::Microseconds,
        "Time each ring device waited for the previous device's activations"
    );
    describe_counter!(
        DEVICE_DISK,
        Unit::Microseconds,
        "Time each device spent reading weights from disk"
    );
    describe_counter!(
        DEVICE_DISK_READ,
        Unit::Bytes,
        "Bytes each device read from storage"
    );
    describe_counter!(
        DEVICE_MAJOR_FAULTS,
        Unit::Count,
        "Major page faults on each device"
    );
    describe_gauge!(
        DEVICE_MEMORY_PRESSURE,
        "Peak memory pressure of each device, (baseline - MemAvailable) / MemTotal, within its cgroup limit where it has one"
    );
    describe_counter!(
        RING_REPLANS,
        "Times the ring was planned and connected again, by cause (device_lost, device_back)"
    );
    describe_counter!(
        RING_NO_PLAN,
        "Times no ring could be planned over the devices left"
    );
    describe_histogram!(
        RING_RECOVERY,
        Unit::Seconds,
        "From a lost device to the first logits of the new ring (replay included)"
    );
    describe_gauge!(RING_DEVICES, "Devices in the ring now, the head included");
    describe_counter!(
        DRAFT_TOKENS,
        Unit::Count,
        "Tokens the draft model proposed (speculative decoding)"
    );
    describe_counter!(
        DRAFT_ACCEPTED,
        Unit::Count,
        "Drafted tokens the target accepted (acceptance = this / prima_draft_tokens_total)"
    );
    describe_gauge!(
        SLOTS,
        "Parallel slots (--parallel): requests generated at once"
    );
    describe_gauge!(SLOTS_BUSY, "Slots with a request in them now");
    describe_gauge!(QUEUE_LENGTH, "Requests waiting for a free slot");
    describe_histogram!(
        BATCH_SEQUENCES,
        Unit::Count,
        "Requests (slots) evaluated together in one step"
    );
    describe_histogram!(
        BATCH_TOKENS,
        Unit::Count,
        "Tokens evaluated in one step: a decode row per generating slot plus prompt chunks"
    );
}

/// One generation's drafting (speculative decoding).
pub fn record_draft(stats: &prima_core::speculative::DraftStats) {
    counter!(DRAFT_TOKENS).increment(stats.drafted as u64);
    counter!(DRAFT_ACCEPTED).increment(stats.accepted as u64);
}

/// One HTTP request to `endpoint` (e.g. "/v1/chat/completions").
pub fn record_request(endpoint: &'static str) {
    counter!(REQUESTS, "endpoint" => endpoint).increment(1);
}

/// One HTTP request answered with an error of OpenAI type `kind`.
pub fn record_request_error(endpoint: &'static str, kind: &'static str) {
    counter!(REQUEST_ERRORS, "endpoint" => endpoint, "type" => kind).increment(1);
}

pub(crate) fn record_generation(c: &Completion) {
    counter!(GENERATIONS, "finish_reason" => c.finish_reason.as_str()).increment(1);
    counter!(PROMPT_TOKENS).increment(c.usage.prompt_tokens as u64);
    counter!(CACHED_PROMPT_TOKENS).increment(c.cached_prompt_tokens as u64);
    counter!(GENERATED_TOKENS).increment(c.usage.completion_tokens as u64);
    if c.usage.completion_tokens > 0 {
        histogram!(TTFT).record(c.time_to_first_token.as_secs_f64());
    }
    if c.usage.completion_tokens > 1 {
        histogram!(TPOT).record(c.tpot_ms / 1e3);
    }
    board::generation(c.tpot_ms, c.usage.completion_tokens);
}

/// The scheduler's slots, and how many hold a request.
pub(crate) fn record_slots(slots: usize, busy: usize) {
    gauge!(SLOTS).set(slots as f64);
    gauge!(SLOTS_BUSY).set(busy as f64);
}

/// `delta` requests joined (+) or left (−) the queue.
pub(crate) fn record_queued(delta: i32) {
    gauge!(QUEUE_LENGTH).increment(f64::from(delta));
}

/// One step of the scheduler: `sequences` slots, `tokens` rows in all.
pub(crate) fn record_batch(sequences: usize, tokens: usize) {
    histogram!(BATCH_SEQUENCES).record(sequences as f64);
    histogram!(BATCH_TOKENS).record(tokens as f64);
}

/// A job whose client left before it started: a generation cancelled with no tokens.
pub(crate) fn record_cancelled_in_queue() {
    counter!(GENERATIONS, "finish_reason" => "cancelled").increment(1);
}

pub(crate) fn record_generation_error(e: &WorkerError) {
    let kind = if e.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    };
    counter!(GENERATION_ERRORS, "type" => kind).increment(1);
}

/// Records what a resilient ring reported since the last call, and its size now.
pub fn record_failover(events: &[FailoverEvent], devices: usize) {
    for e in events {
        match e {
            FailoverEvent::Replanned { cause, .. } => {
                counter!(RING_REPLANS, "cause" => cause.as_str()).increment(1)
            }
            FailoverEvent::NoPlan => counter!(RING_NO_PLAN).increment(1),
            FailoverEvent::Recovered { after } => {
                histogram!(RING_RECOVERY).record(after.as_secs_f64())
            }
            FailoverEvent::Lost { .. } | FailoverEvent::Back { .. } => {}
        }
    }
    gauge!(RING_DEVICES).set(devices as f64);
}

/// What a server on a resilient ring does between requests (and once before the first):
/// records every device's statistics, plans a lost device that answers again back in,
/// records the failover events, and shows all of it on the cluster board (the ring tells
/// the board each failover event as it happens).
pub fn watch_ring(ring: &mut ResilientRing<'_>) {
    // A loss is shown when it happens, not when its request ends.
    ring.observe(Box::new(board::failover_event));
    let names: Vec<String> = ring.devices().iter().map(|d| d.name.clone()).collect();
    let stats = ring.collect_stats().unwrap_or_default();
    record_ring_stats(&stats, &names);
    // Between requests: a lost device that answers again is planned back in.
    if let Err(e) = ring.readmit() {
        eprintln!("failover: {e}");
    }
    let events = ring.take_events();
    record_failover(&events, ring.devices().len());
    let devices: Vec<String> = ring.devices().iter().map(|d| d.name.clone()).collect();
    let lost: Vec<String> = ring.lost().map(|d| d.name.clone()).collect();
    // After a re-plan the statistics belong to the old ring's device order.
    let stats = if devices == names { stats } else { Vec::new() };
    board::ring_now(&board::RingNow {
        devices: &devices,
        windows: ring.windows(),
        nodes: ring.nodes(),
        lost: &lost,
        k: ring.rounds(),
        stats: &stats,
    });
}

/// What one device spent since the last sample; times and counts are added to counters.
#[derive(Debug, Clone, Default)]
pub struct DeviceSample {
    /// The device's name (from the manifest) or address.
    pub device: String,
    pub compute: Duration,
    /// Sending activations to the next device.
    pub network: Duration,
    /// Waiting for the previous device.
    pub wait: Duration,
    /// Reading weights from storage, where the device measures it.
    pub disk: Duration,
    pub disk_read_bytes: u64,
    pub major_faults: u64,
    /// (baseline − MemAvailable) ÷ MemTotal, the paper's memory pressure (both figures the
    /// cgroup's where the device runs under a memory limit); a gauge.
    pub memory_pressure: Option<f64>,
}

/// Adds one device's sample to the per-device metrics.
pub fn record_device(s: &DeviceSample) {
    let device = s.device.clone();
    add_micros(DEVICE_COMPUTE, &device, s.compute);
    add_micros(DEVICE_NETWORK, &device, s.network);
    add_micros(DEVICE_WAIT, &device, s.wait);
    add_micros(DEVICE_DISK, &device, s.disk);
    counter!(DEVICE_DISK_READ, "device" => device.clone()).increment(s.disk_read_bytes);
    counter!(DEVICE_MAJOR_FAULTS, "device" => device.clone()).increment(s.major_faults);
    if let Some(p) = s.memory_pressure {
        gauge!(DEVICE_MEMORY_PRESSURE, "device" => device).set(p);
    }
}

/// Records what a ring head's `collect_stats` returned (statistics since the previous
/// call), one sample per device, named by `names[device]` where given, else by address.
pub fn record_ring_stats(devices: &[DeviceStats], names: &[String]) {
    for d in devices {
        let mut s = DeviceSample {
            device: names
                .get(d.device)
                .cloned()
                .unwrap_or_else(|| d.addr.clone()),
            memory_pressure: Some(d.peak_memory_pressure),
            ..Default::default()
        };
        let (mut compute, mut send, mut wait) = (0.0, 0.0, 0.0);
        for p in &d.passes {
            compute += p.compute_ms;
            send += p.send_ms;
            wait += p.wait_ms;
            s.disk_read_bytes += p.disk_read_bytes;
            s.major_faults += p.major_faults;
        }
        s.compute = ms(compute);
        s.network = ms(send);
        s.wait = ms(wait);
        record_device(&s);
    }
}

fn ms(v: f64) -> Duration {
    Duration::try_from_secs_f64(v / 1e3).unwrap_or_default()
}

/// `metrics` counters hold integers, so device times are counted in microseconds.
fn add_micros(name: &'static str, device: &str, d: Duration) {
    counter!(name, "device" => device.to_string()).increment(d.as_micros() as u64);
}
