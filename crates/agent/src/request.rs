//! One export: the intervals of every profiled process, each named (ELF
//! symbols, V8's perf map, kallsyms) and merged into a profile under its
//! process's Resource, all in one OTLP request sharing one dictionary.
//! Runs on the building thread: naming takes time the sampling side does
//! not have.

use blazesym::symbolize::Symbolizer;
use otel_thread_ctx_otlp::profiles::ExportProfilesServiceRequest;

use crate::profiled::Interval;
use crate::resource::{self, Process};
use otel_thread_ctx_formats::otlp::RequestBuilder;
use otel_thread_ctx_profiler::model;

/// The time an export covers: CLOCK_MONOTONIC and the wall clock at its
/// start, and its length.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub start_monotonic_ns: u64,
    pub start_unix_ns: u64,
    pub duration_ns: u64,
}

/// Sampling settings shared by every profile.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub hz: u64,
    pub off_cpu: bool,
    pub span_profiles: Option<otel_thread_ctx_formats::otlp::SpanProfiles>,
}

/// The request for these intervals; `None` when none has a sample.
pub fn build(
    intervals: Vec<Interval>,
    window: Window,
    settings: Settings,
    host_name: &str,
    symbolizer: &Symbolizer,
) -> Option<ExportProfilesServiceRequest> {
    let mut builder = RequestBuilder::new(settings.span_profiles);
    for interval in intervals {
        if interval.samples.is_empty() {
            continue;
        }
        // A wait that began before the window (its switch-out) is reported
        // when it ends: the profile starts early enough to hold it.
        let earliest = interval
            .samples
            .iter()
            .map(|s| s.time_ns)
            .min()
            .unwrap_or(window.start_monotonic_ns);
        let back = window.start_monotonic_ns.saturating_sub(earliest);
        let base = model::Profile {
            pid: interval.pid,
            hz: settings.hz,
            off_cpu: settings.off_cpu,
            period_ns: 1_000_000_000 / settings.hz.max(1),
            start_monotonic_ns: window.start_monotonic_ns - back,
            start_unix_ns: window.start_unix_ns.saturating_sub(back),
            duration_ns: window.duration_ns + back,
            entries: Vec::new(),
        };
        let mut perf_map = interval.perf_map.lock().unwrap_or_else(|e| e.into_inner());
        let names = interval
            .collector
            .finish_with(symbolizer, Some(&mut perf_map));
        drop(perf_map);
        let profile = model::build(
            base,
            &interval.samples,
            &names,
            &interval.key_map,
            &interval.thread_names,
        );
        let process = Process {
            pid: interval.pid,
            executable: &interval.executable,
            command: &interval.command,
            host_name,
        };
        builder.add(&profile, resource::resource(interval.resource, &process));
    }
    (!builder.is_empty()).then(|| builder.finish())
}
