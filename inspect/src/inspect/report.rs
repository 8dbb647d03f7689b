//! Report building: the collected facts, judged by the conformance rules,
//! as the report `inspect` prints (as JSON or as text).

use std::fmt;

use serde::Serialize;
use serde_json::{Map, Value};

use super::collect::{Collected, ReadThread, Threads};
use super::conformance::{self, Findings};
use crate::discovery::DefiningModule;
use crate::elf::TlsRelocKind;
use crate::process_context::{self, Lookup};
use crate::record::{decode_attributes, Record};
use crate::thread::Outcome;
use crate::tls::{Plan, Resolution, TlsError};

/// Layout version of the JSON report; bumped only on incompatible changes.
pub const SCHEMA: &str = "otel-thread-ctx.inspect/v1";

/// The whole report (`--json` prints exactly this).
#[derive(Serialize, Debug)]
pub struct Report {
    pub schema: &'static str,
    pub pid: i32,
    /// True when the process publishes conformant thread context.
    pub conformant: bool,
    /// Why it is not conformant (empty when it is).
    pub problems: Vec<String>,
    /// Deviations that do not prevent reading.
    pub warnings: Vec<String>,
    pub symbol: Option<SymbolInfo>,
    pub process_context: ProcessContextInfo,
    pub threads: Vec<ThreadInfo>,
}

/// Where `otel_thread_ctx_v1` is defined and how it is reached.
#[derive(Serialize, Debug)]
pub struct SymbolInfo {
    pub module: String,
    pub executable: bool,
    /// Hex address: runtime minus link-time addresses of the module.
    pub load_bias: String,
    /// `st_value`: offset of the variable inside the module's TLS block.
    pub st_value: u64,
    pub st_size: u64,
    /// `tlsdesc`, `global-dynamic`, `initial-exec`, `local-exec`,
    /// `local-dynamic` or `unreferenced`.
    pub access_model: &'static str,
    pub relocations: Vec<RelocationInfo>,
    /// How every thread's variable is found; null with `resolution_error`.
    pub resolution: Option<ResolutionInfo>,
    pub resolution_error: Option<String>,
    /// Other modules that also define the symbol (not read).
    pub other_definitions: Vec<String>,
}

#[derive(Serialize, Debug)]
pub struct RelocationInfo {
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Hex runtime address of the GOT slot.
    pub got_address: String,
}

#[derive(Serialize, Debug)]
pub struct ResolutionInfo {
    /// `tlsdesc-static`, `tlsdesc-dtv`, `global-dynamic-dtv`,
    /// `initial-exec-static` or `local-exec-static`.
    pub path: &'static str,
    /// `static` (the static TLS area: one offset from every thread pointer)
    /// or `dynamic` (each thread's block through its DTV).
    pub tls_model: &'static str,
    pub evidence: String,
    /// Static paths: variable address = thread pointer + tp_offset, the same
    /// in every thread (what an eBPF sampler adds to `fsbase`).
    pub tp_offset: Option<i64>,
    /// DTV paths: the module id and offset in its block.
    pub module_id: Option<u64>,
    pub module_offset: Option<u64>,
}

/// The process context, tagged by `status`.
#[derive(Serialize, Debug)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum ProcessContextInfo {
    Absent,
    Invalid {
        mapping: String,
        address: String,
        error: String,
    },
    Ok {
        mapping: String,
        address: String,
        version: u32,
        published_at_ns: u64,
        payload_size: u32,
        resource: Map<String, Value>,
        attributes: Map<String, Value>,
        schema_version: Option<String>,
        attribute_key_map: Option<Vec<String>>,
        warnings: Vec<String>,
    },
}

/// One thread of the target.
#[derive(Serialize, Debug)]
pub struct ThreadInfo {
    pub tid: i32,
    pub name: String,
    pub status: ThreadStatus,
    /// Why there is no record, or what went wrong.
    pub reason: Option<String>,
    pub tls: Option<ThreadTls>,
    pub record: Option<RecordInfo>,
}

/// The resolved TLS facts of one thread.
#[derive(Serialize, Debug)]
pub struct ThreadTls {
    /// Resolution path (as in `symbol.resolution.path`).
    pub path: &'static str,
    /// `static` or `dynamic` (as in `symbol.resolution.tls_model`).
    pub tls_model: &'static str,
    /// Hex thread pointer (`fs_base` on x86-64, `tpidr_el0` on arm64).
    pub thread_pointer: String,
    /// Hex address of this thread's `otel_thread_ctx_v1`.
    pub variable_address: Option<String>,
    /// variable_address - thread_pointer, for static paths.
    pub tp_offset: Option<i64>,
    /// Hex value of the variable (the record pointer).
    pub pointer: Option<String>,
}

/// A record that the pointer leads to.
#[derive(Serialize, Debug)]
pub struct RecordInfo {
    pub address: String,
    /// The raw valid byte (1 = valid).
    pub valid: u8,
    /// Lowercase hex; null unless the valid byte is 1.
    pub trace_id: Option<String>,
    pub span_id: Option<String>,
    pub trace_flags: Option<u8>,
    pub attrs_data_size: u16,
    /// Decoded attrs_data entries (last occurrence of a key wins).
    pub attributes: Vec<AttributeInfo>,
}

#[derive(Serialize, Debug)]
pub struct AttributeInfo {
    pub key_index: u8,
    /// From `threadlocal.attribute_key_map`; null when the index is not in it
    /// (such entries must be ignored by consumers).
    pub key: Option<String>,
    /// UTF-8 value (invalid bytes replaced).
    pub value: String,
}

/// What was found for one thread.
#[derive(Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum ThreadStatus {
    /// The record names a span.
    Valid,
    /// A record is there, but valid != 1 or an id is all zero.
    Invalid,
    /// No record: the pointer is NULL, the thread has no TLS block, or the
    /// process publishes no thread context.
    NoRecord,
    /// The thread could not be read.
    Error,
    /// The thread exited before it was read.
    Exited,
}

impl ThreadStatus {
    /// The name the JSON report uses.
    pub fn as_str(self) -> &'static str {
        match self {
            ThreadStatus::Valid => "valid",
            ThreadStatus::Invalid => "invalid",
            ThreadStatus::NoRecord => "no-record",
            ThreadStatus::Error => "error",
            ThreadStatus::Exited => "exited",
        }
    }
}

impl fmt::Display for ThreadStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

fn hex_addr(a: u64) -> String {
    format!("{a:#x}")
}

/// Judges what was collected and builds the report.
pub fn build(c: Collected) -> Report {
    let mut f = Findings::default();
    conformance::process_context(&mut f, &c.process_context);
    let key_map = match &c.process_context {
        Lookup::Found(d) => d.attribute_key_map.clone(),
        _ => None,
    };
    let process_context = process_context_info(c.process_context);
    let listed = |threads: Threads| match threads {
        Threads::Listed(t) => t,
        Threads::Read { .. } => unreachable!("threads are read only with a resolution"),
    };
    let Some(module) = &c.target.module else {
        conformance::no_module(&mut f, &c.target.discovery.errors);
        let threads = listed(c.threads)
            .into_iter()
            .map(|(tid, name)| ThreadInfo {
                tid,
                name,
                status: ThreadStatus::NoRecord,
                reason: Some("the process does not publish thread context".into()),
                tls: None,
                record: None,
            })
            .collect();
        return finish(c.pid, f, None, process_context, threads);
    };
    conformance::symbol(&mut f, module);
    conformance::access_model(&mut f, module);
    let others: Vec<String> = c
        .target
        .discovery
        .modules
        .iter()
        .skip(1)
        .map(|m| m.path.clone())
        .collect();
    conformance::other_definitions(&mut f, module, &others);
    let resolution = c
        .target
        .resolution
        .as_ref()
        .expect("a module implies a resolution attempt");
    let symbol = symbol_info(module, resolution, others);
    let resolution = match resolution {
        Ok(r) => r,
        Err(e) => {
            conformance::resolution(&mut f, e);
            return finish(c.pid, f, Some(symbol), process_context, Vec::new());
        }
    };
    let Threads::Read {
        threads,
        process_exited,
    } = c.threads
    else {
        unreachable!("a resolution means the threads were read")
    };
    let threads: Vec<ThreadInfo> = threads
        .into_iter()
        .map(|t| thread_info(&mut f, t, resolution, key_map.as_deref()))
        .collect();
    conformance::some_thread_read(
        &mut f,
        threads.iter().any(|t| t.tls.is_some()),
        process_exited,
    );
    finish(c.pid, f, Some(symbol), process_context, threads)
}

fn process_context_info(pc: Lookup) -> ProcessContextInfo {
    match pc {
        Lookup::Absent => ProcessContextInfo::Absent,
        Lookup::Invalid {
            mapping,
            address,
            error,
        } => ProcessContextInfo::Invalid {
            mapping,
            address: hex_addr(address),
            error: error.to_string(),
        },
        Lookup::Found(d) => ProcessContextInfo::Ok {
            address: hex_addr(d.address),
            version: d.header.version,
            published_at_ns: d.header.published_at_ns,
            payload_size: d.header.payload_size,
            resource: process_context::json::object(
                d.resource.as_ref().map_or(&[], |r| r.attributes.as_slice()),
            ),
            attributes: process_context::json::object(&d.attributes),
            mapping: d.mapping,
            schema_version: d.schema_version,
            attribute_key_map: d.attribute_key_map,
            warnings: d.warnings,
        },
    }
}

fn tp_offset(plan: &Plan) -> Option<i64> {
    match *plan {
        Plan::Static { tp_offset } => Some(tp_offset),
        Plan::Dtv { .. } => None,
    }
}

fn symbol_info(
    module: &DefiningModule,
    resolution: &Result<Resolution, TlsError>,
    others: Vec<String>,
) -> SymbolInfo {
    let def = &module.definition;
    SymbolInfo {
        module: module.path.clone(),
        executable: module.is_executable,
        load_bias: hex_addr(module.bias),
        st_value: def.value,
        st_size: def.size,
        access_model: module.model.name(),
        relocations: def
            .relocations
            .iter()
            .filter(|r| r.by_symbol || r.kind != TlsRelocKind::DtpMod)
            .map(|r| RelocationInfo {
                kind: r.type_name,
                got_address: hex_addr(module.bias.wrapping_add(r.got)),
            })
            .collect(),
        resolution: resolution.as_ref().ok().map(|r| ResolutionInfo {
            path: r.path,
            tls_model: r.plan.tls_model(),
            evidence: r.evidence.clone(),
            tp_offset: tp_offset(&r.plan),
            module_id: match r.plan {
                Plan::Dtv { module_id, .. } => Some(module_id),
                Plan::Static { .. } => None,
            },
            module_offset: match r.plan {
                Plan::Dtv { offset, .. } => Some(offset),
                Plan::Static { .. } => None,
            },
        }),
        resolution_error: resolution.as_ref().err().map(ToString::to_string),
        other_definitions: others,
    }
}

fn thread_info(
    f: &mut Findings,
    t: ReadThread,
    resolution: &Resolution,
    key_map: Option<&[String]>,
) -> ThreadInfo {
    let ReadThread { tid, name, read } = t;
    let tls = read.thread_pointer.map(|tp| ThreadTls {
        path: resolution.path,
        tls_model: resolution.plan.tls_model(),
        thread_pointer: hex_addr(tp),
        variable_address: read.variable.map(hex_addr),
        tp_offset: tp_offset(&resolution.plan),
        pointer: read.pointer.map(hex_addr),
    });
    let (status, reason, record) = match read.outcome {
        Outcome::Gone | Outcome::AddressSpaceGone => (
            ThreadStatus::Exited,
            Some("the thread has exited".to_string()),
            None,
        ),
        Outcome::NoRecord(why) => (ThreadStatus::NoRecord, Some(why), None),
        Outcome::Error(e) => {
            conformance::thread_error(f, tid, &e);
            (ThreadStatus::Error, Some(e.to_string()), None)
        }
        Outcome::Record(rec) => {
            let reason = conformance::record(f, tid, &rec.header);
            let status = match reason {
                None => ThreadStatus::Valid,
                Some(_) => ThreadStatus::Invalid,
            };
            (status, reason, Some(record_info(f, tid, &rec, key_map)))
        }
    };
    ThreadInfo {
        tid,
        name,
        status,
        reason,
        tls,
        record,
    }
}

fn record_info(f: &mut Findings, tid: i32, rec: &Record, key_map: Option<&[String]>) -> RecordInfo {
    let h = rec.header;
    let valid = h.is_valid();
    let mut attributes = Vec::new();
    if valid {
        let decoded = decode_attributes(&rec.attrs_data);
        conformance::attributes(f, tid, &decoded, key_map);
        attributes = decoded
            .entries
            .into_iter()
            .map(|a| AttributeInfo {
                key_index: a.key_index,
                key: conformance::key_name(key_map, a.key_index).cloned(),
                value: String::from_utf8_lossy(&a.value).into_owned(),
            })
            .collect();
    }
    RecordInfo {
        address: hex_addr(rec.address),
        valid: h.valid,
        trace_id: valid.then(|| h.trace_id.to_string()),
        span_id: valid.then(|| h.span_id.to_string()),
        trace_flags: valid.then_some(h.trace_flags.to_u8()),
        attrs_data_size: h.attrs_data_size,
        attributes,
    }
}

fn finish(
    pid: i32,
    findings: Findings,
    symbol: Option<SymbolInfo>,
    process_context: ProcessContextInfo,
    threads: Vec<ThreadInfo>,
) -> Report {
    Report {
        schema: SCHEMA,
        pid,
        conformant: findings.problems.is_empty(),
        problems: findings.problems,
        warnings: findings.warnings,
        symbol,
        process_context,
        threads,
    }
}
