//! One profiled process on the sampling side: its samples since the last
//! export, unwound and tied to their mappings as they arrive (while the
//! process and its maps are there), and what names its threads and its
//! resource.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use otel_thread_ctx_otlp::Resource;

use crate::processes::Found;
use otel_thread_ctx_profiler::kernel::{ItemRead, Sample};
use otel_thread_ctx_profiler::plan::current_process_context;
use otel_thread_ctx_profiler::process_maps::ProcessMaps;
use otel_thread_ctx_profiler::symbolize::Collector;
use otel_thread_ctx_profiler::unwind::{choose, chosen_frame_pointers, StackUnwinder};
use otel_thread_ctx_profiler::v8::JsFrames;
use otel_thread_ctx_profiler::{model, perf_map, threadpool};
use otel_thread_ctx_reader::memory::ProcessMemory;
use otel_thread_ctx_reader::tasks;

pub struct Profiled {
    pub pid: i32,
    pub executable: String,
    pub command: String,
    /// Its maps, shared by the unwinder, V8's naming and the collector
    /// (which is replaced each export): one re-read for an address none
    /// covers serves all three.
    maps: ProcessMaps,
    /// Kept across exports: it caches every module's unwind tables.
    unwinder: StackUnwinder,
    /// Names JIT frames from V8's heap as samples arrive, or why it cannot.
    js_frames: Result<JsFrames, String>,
    collector: Collector,
    /// Its perf map as read so far, shared with the building thread, which
    /// names each interval with it.
    perf_map: Arc<Mutex<perf_map::Follower>>,
    samples: Vec<Sample>,
    /// Pool items read after a GC hid them from their samples: since the
    /// last export, and in the one before (a wait's sample arrives when the
    /// thread wakes, possibly after its item's read went out).
    item_reads: Vec<ItemRead>,
    earlier_item_reads: Vec<ItemRead>,
    thread_names: HashMap<u32, String>,
    /// The latest process context read (resource, key map): an exited
    /// process keeps the last one.
    context: (Option<Resource>, Vec<String>),
    /// Its memory, opened once, for re-reading the process context (none
    /// when it could not be opened: the context stays as first found).
    memory: Option<ProcessMemory>,
    /// The process exited: its last samples go out with the next export.
    pub exited: bool,
}

/// One process's share of an export, handed to the building thread.
pub struct Interval {
    pub pid: i32,
    pub executable: String,
    pub command: String,
    pub samples: Vec<Sample>,
    pub collector: Collector,
    pub perf_map: Arc<Mutex<perf_map::Follower>>,
    pub thread_names: HashMap<u32, String>,
    pub resource: Option<Resource>,
    pub key_map: Vec<String>,
}

impl Profiled {
    pub fn new(found: &Found) -> Profiled {
        let maps = ProcessMaps::new(found.pid, found.maps.clone());
        let mut p = Profiled {
            pid: found.pid,
            executable: found.executable.clone(),
            command: found.command.clone(),
            unwinder: StackUnwinder::new(&maps),
            js_frames: JsFrames::new(found.pid, &found.maps),
            collector: Collector::new(found.pid),
            maps,
            perf_map: Arc::new(Mutex::new(perf_map::Follower::new(found.pid))),
            samples: Vec::new(),
            item_reads: Vec::new(),
            earlier_item_reads: Vec::new(),
            thread_names: HashMap::new(),
            context: (None, Vec::new()),
            memory: otel_thread_ctx_reader::target::open_memory(found.pid)
                .ok()
                .map(|(_, memory)| memory),
            exited: false,
        };
        p.refresh();
        p
    }

    /// Takes one sample: its user stack unwound from the copy where that
    /// gives more, its addresses noted for naming.
    pub fn take(&mut self, mut s: Sample) {
        if let Some(copy) = s.user_stack_copy.take() {
            let unwound = self.unwinder.unwind(&mut self.maps, &copy);
            s.user_stack = choose(&unwound, &s.user_stack);
            if let Ok(js) = &mut self.js_frames {
                let frame_pointers = chosen_frame_pointers(&unwound, &s.user_stack);
                let names = js.name(&mut self.maps, &copy, &s.user_stack, &frame_pointers);
                s.frame_names = names.by_frame;
                for named in names.by_address {
                    self.collector.user_named(named);
                }
            }
        }
        for a in model::addresses_to_name(&s) {
            self.collector.user(&mut self.maps, a);
        }
        for &a in &s.kernel_stack {
            self.collector.kernel(a);
        }
        self.samples.push(s);
    }

    /// How this process's JavaScript frames are named, for the log.
    pub fn js_naming(&self) -> String {
        match &self.js_frames {
            Ok(js) => format!(
                "JavaScript frames named from V8's heap (layout from the metadata of {}){}, else from its perf map",
                js.binary(),
                match js.inlining_unavailable() {
                    None => ", with the functions optimized code inlined".to_string(),
                    Some(reason) => format!(", without the functions optimized code inlined ({reason})"),
                }
            ),
            Err(reason) => format!(
                "V8's heap names no frames ({reason}): JavaScript frames named from the perf map only"
            ),
        }
    }

    /// Takes the span of a pool item that samples of it could not read.
    pub fn take_item_read(&mut self, read: ItemRead) {
        self.item_reads.push(read);
    }

    /// Thread names as /proc shows them, and the process context (its key
    /// map only grows: the latest names every index seen), read from the
    /// maps as they are now: the one read also renews the snapshot the
    /// unwinder, V8's naming and the collector share.
    pub fn refresh(&mut self) {
        if self.exited {
            return;
        }
        for tid in tasks::list(self.pid) {
            let name = tasks::name(self.pid, tid);
            if !name.is_empty() {
                self.thread_names.insert(tid as u32, name);
            }
        }
        match &self.memory {
            Some(memory) => {
                if let Some(found) = current_process_context(&mut self.maps, memory) {
                    self.context = found;
                }
            }
            None => {
                self.maps.reread();
            }
        }
    }

    /// The samples since the last cut, with what names them; `None` when
    /// there are none.
    pub fn cut(&mut self) -> Option<Interval> {
        // Each interval starts from the maps as they are now (refresh()
        // reads them): mappings gone or replaced since would trigger no
        // re-read of their own.
        self.refresh();
        if let Ok(js) = &mut self.js_frames {
            // Objects move and die over a long run: what was read of them
            // is read again each interval.
            js.forget();
        }
        let collector = std::mem::replace(&mut self.collector, Collector::new(self.pid));
        let fresh = std::mem::take(&mut self.item_reads);
        let mut item_reads = std::mem::replace(&mut self.earlier_item_reads, fresh.clone());
        item_reads.extend(fresh);
        if self.samples.is_empty() {
            return None;
        }
        threadpool::fill_from_same_item(&mut self.samples, &item_reads);
        let thread_names = if self.exited {
            std::mem::take(&mut self.thread_names)
        } else {
            // Threads that exited are named no more.
            let live: std::collections::HashSet<u32> = tasks::list(self.pid)
                .into_iter()
                .map(|t| t as u32)
                .collect();
            let names = self.thread_names.clone();
            self.thread_names.retain(|tid, _| live.contains(tid));
            names
        };
        Some(Interval {
            pid: self.pid,
            executable: self.executable.clone(),
            command: self.command.clone(),
            samples: std::mem::take(&mut self.samples),
            collector,
            perf_map: self.perf_map.clone(),
            thread_names,
            resource: self.context.0.clone(),
            key_map: self.context.1.clone(),
        })
    }
}
