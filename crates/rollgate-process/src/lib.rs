//! The process's own metrics, named as every Prometheus client names them
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, …), so
//! the dashboards and alerts teams already have for any process work on
//! rollgate's gateways and controllers too.
//!
//! Read from Linux's `/proc/self` at scrape time (the procfs crate); on a
//! system without it, or when a file cannot be read, the metrics that
//! need it are left out rather than reported as zero.

use procfs::process::{LimitValue, Process};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// A registry as a scraper asked for it: OpenMetrics when its `Accept`
/// names it, the Prometheus text format otherwise (see
/// `rollgate_core::exposition`). Returns the body and its content type; the
/// one place every rollgate `/metrics` endpoint encodes.
pub fn expose(registry: &Registry, accept: Option<&str>) -> (String, &'static str) {
    use rollgate_core::exposition as x;
    let mut om = String::new();
    if prometheus_client::encoding::text::encode(&mut om, registry).is_err() {
        om.clear();
    }
    if x::wants_openmetrics(accept) {
        (om, x::OPENMETRICS_TEXT)
    } else {
        (x::openmetrics_to_prometheus_text(&om), x::PROMETHEUS_TEXT)
    }
}

/// Registers the process metrics in `registry` (read at every scrape).
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(ProcessCollector));
}

/// The process metrics as a collector, read when encoded.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessCollector;

/// One reading of `/proc/self`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    pub cpu_seconds: Option<f64>,
    pub resident_memory_bytes: Option<u64>,
    pub virtual_memory_bytes: Option<u64>,
    pub threads: Option<u64>,
    pub start_time_seconds: Option<f64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
}

impl Reading {
    /// Reads `/proc/self`; what cannot be read is `None`.
    pub fn now() -> Reading {
        let Ok(me) = Process::myself() else {
            return Reading::default();
        };
        let mut r = Reading::default();
        if let Ok(stat) = me.stat() {
            let ticks = procfs::ticks_per_second() as f64;
            r.cpu_seconds = Some((stat.utime + stat.stime) as f64 / ticks);
            r.resident_memory_bytes = Some(stat.rss * procfs::page_size());
            r.virtual_memory_bytes = Some(stat.vsize);
            r.threads = u64::try_from(stat.num_threads).ok();
            r.start_time_seconds = procfs::boot_time_secs()
                .ok()
                .map(|boot| boot as f64 + stat.starttime as f64 / ticks);
        }
        r.open_fds = me.fd_count().ok().map(|n| n as u64);
        r.max_fds = me
            .limits()
            .ok()
            .and_then(|l| match l.max_open_files.soft_limit {
                LimitValue::Value(v) => Some(v),
                LimitValue::Unlimited => None,
            });
        r
    }
}

fn one<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    metric: Option<M>,
) -> Result<(), std::fmt::Error> {
    let Some(metric) = metric else {
        return Ok(());
    };
    let e = enc.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(e)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let r = Reading::now();
        let gauge = |v: Option<u64>| v.and_then(|v| i64::try_from(v).ok()).map(ConstGauge::new);
        one(
            &mut enc,
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            r.cpu_seconds.map(ConstCounter::new),
        )?;
        one(
            &mut enc,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            gauge(r.resident_memory_bytes),
        )?;
        one(
            &mut enc,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            gauge(r.virtual_memory_bytes),
        )?;
        one(
            &mut enc,
            "process_open_fds",
            "Number of open file descriptors.",
            gauge(r.open_fds),
        )?;
        one(
            &mut enc,
            "process_max_fds",
            "Maximum number of open file descriptors.",
            gauge(r.max_fds),
        )?;
        one(
            &mut enc,
            "process_threads",
            "Number of OS threads in the process.",
            gauge(r.threads),
        )?;
        one(
            &mut enc,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            r.start_time_seconds.map(ConstGauge::<f64>::new),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads_as_a_live_process() {
        let r = Reading::now();
        let rss = r.resident_memory_bytes.expect("rss");
        assert!(rss > 1 << 20, "{r:?}");
        assert!(r.virtual_memory_bytes.expect("vsize") >= rss);
        assert!(r.threads.expect("threads") >= 1);
        let open = r.open_fds.expect("fds");
        // 64 more files open show (other tests may open a few of their own).
        let files: Vec<_> = (0..64)
            .map(|_| std::fs::File::open("/proc/self/stat").expect("open"))
            .collect();
        let more = Reading::now().open_fds.expect("fds");
        assert!(more >= open + 60 && more <= open + 70, "{open} then {more}");
        drop(files);
        assert!(r.max_fds.is_none_or(|m| m >= open));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        let started = r.start_time_seconds.expect("start time");
        assert!(
            started <= now + 1.0 && started > now - 86_400.0,
            "{started}"
        );
        // Work until the CPU time moves (it counts in clock ticks), bounded.
        let before = r.cpu_seconds.expect("cpu");
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while Reading::now().cpu_seconds.expect("cpu") <= before {
            for _ in 0..100_000 {
                x = x.wrapping_add(std::hint::black_box(1));
            }
            assert!(
                spin.elapsed() < std::time::Duration::from_secs(30),
                "CPU time never moved"
            );
        }
        assert!(x > 0);
    }

    #[test]
    fn the_metrics_encode_with_their_usual_names() {
        let mut registry = Registry::default();
        register(&mut registry);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encode");
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
            "process_threads ",
        ] {
            assert!(out.contains(name), "{name} missing:\n{out}");
        }
    }
}
