//! `otel-thread-ctx inspect`: a conformance report for one process.

use std::time::Duration;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::elf::AccessModel;
use crate::error::Fatal;
use crate::process_context::{self, Lookup};
use crate::ptrace::Tracer;
use crate::record::decode_attributes;
use crate::signals;
use crate::target::Target;
use crate::thread::{self, Outcome};
use crate::tls::{self, Plan};

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
    /// `valid`, `invalid` (record present, but valid != 1 or an id is all
    /// zero), `no-record`, `error` or `exited`.
    pub status: &'static str,
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

fn hex_addr(a: u64) -> String {
    format!("{a:#x}")
}

/// How many times a process that executes a new program while it is read
/// is read again from the start.
const ATTEMPTS: usize = 3;

/// Builds the report. `Err` is a usage/permission failure (exit 2).
pub fn run(pid: i32, stop_timeout: Duration) -> Result<Report, Fatal> {
    for _ in 0..ATTEMPTS {
        if let Some(report) = attempt(pid, stop_timeout)? {
            return Ok(report);
        }
    }
    Err(Fatal::ExecutedEveryTime {
        pid,
        attempts: ATTEMPTS,
    })
}

/// One reading of the process; `None` when it executed a new program
/// meanwhile, which makes everything found before stale.
fn attempt(pid: i32, stop_timeout: Duration) -> Result<Option<Report>, Fatal> {
    let target = Target::open(pid)?;
    let mut problems = Vec::new();
    let mut warnings = Vec::new();

    let pc = process_context::lookup(&target.maps, &target.memory);
    let key_map = match &pc {
        Lookup::Found(d) => d.attribute_key_map.clone(),
        _ => None,
    };
    let process_context = match pc {
        Lookup::Absent => {
            warnings.push("no OTEL_CTX process context: threadlocal.schema_version and attribute keys are unknown".into());
            ProcessContextInfo::Absent
        }
        Lookup::Invalid {
            mapping,
            address,
            error,
        } => {
            problems.push(format!(
                "process context in {mapping} is unreadable: {error}"
            ));
            ProcessContextInfo::Invalid {
                mapping,
                address: hex_addr(address),
                error: error.to_string(),
            }
        }
        Lookup::Found(d) => {
            if d.schema_version.is_none() {
                warnings.push("process context has no threadlocal.schema_version".into());
            }
            if d.attribute_key_map.is_none() {
                warnings.push("process context has no usable threadlocal.attribute_key_map".into());
            }
            warnings.extend(d.warnings.iter().map(|w| format!("process context: {w}")));
            ProcessContextInfo::Ok {
                mapping: d.mapping,
                address: hex_addr(d.address),
                version: d.header.version,
                published_at_ns: d.header.published_at_ns,
                payload_size: d.header.payload_size,
                resource: process_context::json::object(
                    d.resource.as_ref().map_or(&[], |r| r.attributes.as_slice()),
                ),
                attributes: process_context::json::object(&d.attributes),
                schema_version: d.schema_version,
                attribute_key_map: d.attribute_key_map,
                warnings: d.warnings,
            }
        }
    };

    let Some(module) = target.module.clone() else {
        problems.insert(0, "no module defines otel_thread_ctx_v1".into());
        for e in &target.discovery.errors {
            warnings.push(format!("could not examine {e}"));
        }
        let threads = thread::list(pid)
            .into_iter()
            .map(|tid| ThreadInfo {
                tid,
                name: thread::name(pid, tid),
                status: "no-record",
                reason: Some("the process does not publish thread context".into()),
                tls: None,
                record: None,
            })
            .collect();
        return Ok(Some(finish(
            pid,
            problems,
            warnings,
            None,
            process_context,
            threads,
        )));
    };

    let def = &module.definition;
    if def.sym_type != object::elf::STT_TLS {
        problems.push(format!(
            "otel_thread_ctx_v1 in {} is not a TLS symbol (st_type {})",
            module.path, def.sym_type
        ));
    }
    if def.size != 8 {
        problems.push(format!(
            "otel_thread_ctx_v1 has size {} (a pointer is 8 bytes)",
            def.size
        ));
    }
    match module.model {
        AccessModel::GlobalDynamic { .. } if !module.is_executable => warnings.push(
            "the module uses legacy general-dynamic TLS; OTEP 4947 prefers TLSDESC and some readers reject the legacy dialect".into(),
        ),
        _ => {}
    }
    let others: Vec<String> = target
        .discovery
        .modules
        .iter()
        .skip(1)
        .map(|m| m.path.clone())
        .collect();
    if !others.is_empty() {
        warnings.push(format!(
            "otel_thread_ctx_v1 is also defined in {}; only {} is read",
            others.join(", "),
            module.path
        ));
    }
    let resolution = target
        .resolution
        .clone()
        .expect("a module implies a resolution attempt");
    let symbol = SymbolInfo {
        module: module.path.clone(),
        executable: module.is_executable,
        load_bias: hex_addr(module.bias),
        st_value: def.value,
        st_size: def.size,
        access_model: module.model.name(),
        relocations: def
            .relocations
            .iter()
            .filter(|r| r.by_symbol || r.kind != crate::elf::TlsRelocKind::DtpMod)
            .map(|r| RelocationInfo {
                kind: r.type_name,
                got_address: hex_addr(module.bias.wrapping_add(r.got)),
            })
            .collect(),
        resolution: resolution.as_ref().ok().map(|r| ResolutionInfo {
            path: r.path,
            evidence: r.evidence.clone(),
            tp_offset: match r.plan {
                Plan::Static { tp_offset } => Some(tp_offset),
                _ => None,
            },
            module_id: match r.plan {
                Plan::Dtv { module_id, .. } => Some(module_id),
                _ => None,
            },
            module_offset: match r.plan {
                Plan::Dtv { offset, .. } => Some(offset),
                _ => None,
            },
        }),
        resolution_error: resolution.as_ref().err().map(ToString::to_string),
        other_definitions: others,
    };
    let resolution = match resolution {
        Ok(r) => r,
        Err(e) => {
            problems.push(format!("cannot resolve otel_thread_ctx_v1 per thread: {e}"));
            return Ok(Some(finish(
                pid,
                problems,
                warnings,
                Some(symbol),
                process_context,
                Vec::new(),
            )));
        }
    };

    let mut tracer = Tracer::new(pid, stop_timeout);
    let mut threads = Vec::new();
    for tid in thread::list(pid) {
        if let Some(sig) = signals::requested() {
            return Err(Fatal::Interrupted(sig));
        }
        let read = thread::read(
            &mut tracer,
            tid,
            &resolution.plan,
            &target.memory,
            &tls::HOST,
            true,
        )
        .map_err(Fatal::Denied)?;
        let tls = read.thread_pointer.map(|tp| ThreadTls {
            path: resolution.path,
            thread_pointer: hex_addr(tp),
            variable_address: read.variable.map(hex_addr),
            tp_offset: match resolution.plan {
                Plan::Static { tp_offset } => Some(tp_offset),
                _ => None,
            },
            pointer: read.pointer.map(hex_addr),
        });
        let (status, reason, record) = match read.outcome {
            Outcome::AddressSpaceGone if !thread::process_exited(pid) => return Ok(None),
            Outcome::Gone | Outcome::AddressSpaceGone => {
                ("exited", Some("the thread has exited".to_string()), None)
            }
            Outcome::NoRecord(why) => ("no-record", Some(why), None),
            Outcome::Error(e) => {
                problems.push(format!("thread {tid}: {e}"));
                ("error", Some(e.to_string()), None)
            }
            Outcome::Record(rec) => {
                let h = rec.header;
                let valid = h.is_valid();
                let mut attributes = Vec::new();
                let zero_ids = if valid { h.zero_ids() } else { None };
                if let Some(zero) = zero_ids {
                    problems.push(format!(
                        "thread {tid}: {zero}, which W3C Trace Context makes invalid"
                    ));
                }
                if valid {
                    let decoded = decode_attributes(&rec.attrs_data);
                    if decoded.trailing_bytes > 0 {
                        warnings.push(format!(
                            "thread {tid}: {} trailing attrs_data bytes do not form an entry",
                            decoded.trailing_bytes
                        ));
                    }
                    for a in decoded.entries {
                        let key = key_map
                            .as_ref()
                            .and_then(|m| m.get(a.key_index as usize))
                            .cloned();
                        if key.is_none() {
                            warnings.push(format!("thread {tid}: attribute key index {} is not in threadlocal.attribute_key_map", a.key_index));
                        }
                        attributes.push(AttributeInfo {
                            key_index: a.key_index,
                            key,
                            value: String::from_utf8_lossy(&a.value).into_owned(),
                        });
                    }
                }
                let info = RecordInfo {
                    address: hex_addr(rec.address),
                    valid: h.valid,
                    trace_id: valid.then(|| h.trace_id.to_string()),
                    span_id: valid.then(|| h.span_id.to_string()),
                    trace_flags: valid.then_some(h.trace_flags.to_u8()),
                    attrs_data_size: h.attrs_data_size,
                    attributes,
                };
                let (status, reason) = match zero_ids {
                    _ if !valid => ("invalid", Some(format!("valid byte is {}", h.valid))),
                    Some(zero) => ("invalid", Some(zero.to_string())),
                    None => ("valid", None),
                };
                (status, reason, Some(info))
            }
        };
        threads.push(ThreadInfo {
            tid,
            name: thread::name(pid, tid),
            status,
            reason,
            tls,
            record,
        });
    }
    drop(tracer);
    if !threads.iter().any(|t| t.tls.is_some()) {
        problems.push(if thread::process_exited(pid) {
            "the process exited before any thread could be read".into()
        } else {
            "no thread could be read".into()
        });
    }
    Ok(Some(finish(
        pid,
        problems,
        warnings,
        Some(symbol),
        process_context,
        threads,
    )))
}

fn finish(
    pid: i32,
    problems: Vec<String>,
    warnings: Vec<String>,
    symbol: Option<SymbolInfo>,
    process_context: ProcessContextInfo,
    threads: Vec<ThreadInfo>,
) -> Report {
    Report {
        schema: SCHEMA,
        pid,
        conformant: problems.is_empty(),
        problems,
        warnings,
        symbol,
        process_context,
        threads,
    }
}
