//! Report building: the collected facts, judged by the conformance rules,
//! as the report `inspect` prints (as JSON or as text).

use std::fmt;

use serde::Serialize;
use serde_json::{Map, Value};

use super::collect::{Collected, ReadThread, Threads};
use super::rules::{self, Findings};
use crate::discovery::DefiningModule;
use crate::elf::TlsRelocKind;
use crate::process_context::{self, Lookup};
use crate::record::{decode_attributes, Record};
use crate::schema::nodejs::Trail;
use crate::schema::Schema;
use crate::target::Target;
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
    /// Every module that defines a schema's symbol, with its schema.
    pub modules: Vec<ModuleInfo>,
    /// The `otel_thread_ctx_v1` read (record schema), if any.
    pub symbol: Option<SymbolInfo>,
    /// The `otel_thread_ctx_nodejs_v1` read (Node.js schema), if any.
    pub nodejs_symbol: Option<SymbolInfo>,
    pub process_context: ProcessContextInfo,
    pub threads: Vec<ThreadInfo>,
}

/// One module defining one schema's symbol.
#[derive(Serialize, Debug)]
pub struct ModuleInfo {
    pub path: String,
    /// `tlsdesc_v1_dev` (OTEP 4947 record) or `nodejs_v1_dev`.
    pub schema: Schema,
    pub symbol: &'static str,
    pub access_model: &'static str,
    /// False for a second definition of the record schema (not read);
    /// every definition of the Node.js schema is read.
    pub read: bool,
}

/// Where a schema's symbol is defined and how it is reached.
#[derive(Serialize, Debug)]
pub struct SymbolInfo {
    pub schema: Schema,
    pub name: &'static str,
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
    /// The schema the thread's answer comes from (null when none was read).
    pub schema: Option<Schema>,
    /// Why there is no record, or what went wrong.
    pub reason: Option<String>,
    /// The Node.js walk's reason for "no span" (`not-published`,
    /// `no-frame`, `store-absent`, `store-undefined`, `chain-too-long`,
    /// `wrong-object`, `unreadable`, `record-invalid`).
    pub no_span_reason: Option<&'static str>,
    pub tls: Option<ThreadTls>,
    /// The Node.js walk, as far as it got.
    pub walk: Option<WalkInfo>,
    pub record: Option<RecordInfo>,
}

/// Every address the Node.js walk followed (hex; tagged values as read).
#[derive(Serialize, Debug)]
pub struct WalkInfo {
    /// This thread's `otel_thread_ctx_nodejs_v1`.
    pub variable_address: String,
    pub cped_slot: Option<String>,
    pub als_handle: Option<String>,
    pub als_identity_hash: Option<i32>,
    pub undefined: Option<String>,
    pub frame: Option<String>,
    pub table: Option<String>,
    pub bucket_count: Option<u64>,
    /// Chain entries looked at.
    pub hops: usize,
    pub wrapper: Option<String>,
    pub record: Option<String>,
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
    /// A record is there with valid = 0: the thread runs no span now.
    Idle,
    /// A record is there, but valid is neither 0 nor 1, or an id is all zero.
    Invalid,
    /// No record: the pointer is NULL, the thread has no TLS block, or the
    /// process publishes no thread context.
    NoRecord,
    /// The Node.js walk found no span (`no_span_reason` says why).
    NoSpan,
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
            ThreadStatus::Idle => "idle",
            ThreadStatus::Invalid => "invalid",
            ThreadStatus::NoRecord => "no-record",
            ThreadStatus::NoSpan => "no-span",
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
    rules::process_context(&mut f, &c.process_context);
    let key_map = match &c.process_context {
        Lookup::Found(d) => d.attribute_key_map.clone(),
        _ => None,
    };
    let process_context = process_context_info(c.process_context);
    let modules = module_infos(&c.target);
    if c.target.module.is_none() && c.target.nodejs.is_empty() {
        rules::no_module(&mut f, &c.target.discovery.errors);
        let Threads::Listed(listed) = c.threads else {
            unreachable!("threads are read only with a resolution")
        };
        let threads = listed
            .into_iter()
            .map(|(tid, name)| ThreadInfo {
                tid,
                name,
                status: ThreadStatus::NoRecord,
                schema: None,
                reason: Some("the process does not publish thread context".into()),
                no_span_reason: None,
                tls: None,
                walk: None,
                record: None,
            })
            .collect();
        return finish(c.pid, f, modules, [None, None], process_context, threads);
    }
    let symbols = Schema::ALL.map(|schema| {
        c.target
            .schema(schema)
            .map(|(module, resolution)| judge_symbol(&mut f, &c.target, module, resolution))
    });
    let Threads::Read {
        threads,
        process_exited,
    } = c.threads
    else {
        // No schema's variable can be located: the problems say why.
        return finish(c.pid, f, modules, symbols, process_context, Vec::new());
    };
    let threads: Vec<ThreadInfo> = threads
        .into_iter()
        .map(|t| thread_info(&mut f, t, &c.target, key_map.as_deref()))
        .collect();
    rules::some_thread_read(
        &mut f,
        threads.iter().any(|t| t.tls.is_some()),
        process_exited,
    );
    finish(c.pid, f, modules, symbols, process_context, threads)
}

fn module_infos(target: &Target) -> Vec<ModuleInfo> {
    // The record schema's first definition is read; every definition of
    // the Node.js schema's variable is (see `Target::nodejs`).
    let read = |m: &DefiningModule| match m.schema {
        Schema::Record => target
            .schema(m.schema)
            .is_some_and(|(r, _)| r.path == m.path),
        Schema::Nodejs => target.nodejs.iter().any(|(r, _)| r.path == m.path),
    };
    target
        .discovery
        .modules
        .iter()
        .map(|m| ModuleInfo {
            path: m.path.clone(),
            schema: m.schema,
            symbol: m.schema.symbol(),
            access_model: m.model.name(),
            read: read(m),
        })
        .collect()
}

/// The rules about one schema's symbol, and what the report says of it.
fn judge_symbol(
    f: &mut Findings,
    target: &Target,
    module: &DefiningModule,
    resolution: &Result<Resolution, TlsError>,
) -> SymbolInfo {
    rules::symbol(f, module);
    rules::access_model(f, module);
    let others: Vec<String> = target
        .discovery
        .of(module.schema)
        .skip(1)
        .map(|m| m.path.clone())
        .collect();
    rules::other_definitions(f, module, &others);
    if let Err(e) = resolution {
        rules::resolution(f, module.schema, e);
    }
    symbol_info(module, resolution, others)
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
        schema: module.schema,
        name: module.schema.symbol(),
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
    target: &Target,
    key_map: Option<&[String]>,
) -> ThreadInfo {
    let ReadThread { tid, name, read } = t;
    // The TLS facts shown are those of the schema the answer comes from.
    let schema = read.schema;
    let resolution = schema
        .and_then(|s| target.schema(s))
        .and_then(|(_, r)| r.as_ref().ok());
    let (variable, pointer) = match (schema, &read.nodejs) {
        (Some(Schema::Nodejs), Some((var, _))) => (Some(*var), None),
        _ => (read.variable, read.pointer),
    };
    let tls = read
        .thread_pointer
        .zip(resolution)
        .map(|(tp, r)| ThreadTls {
            path: r.path,
            tls_model: r.plan.tls_model(),
            thread_pointer: hex_addr(tp),
            variable_address: variable.map(hex_addr),
            tp_offset: tp_offset(&r.plan),
            pointer: pointer.map(hex_addr),
        });
    let walk = read
        .nodejs
        .as_ref()
        .map(|(var, trail)| walk_info(*var, trail));
    let mut no_span_reason = None;
    let (status, reason, record) = match read.outcome {
        Outcome::Gone | Outcome::AddressSpaceGone => (
            ThreadStatus::Exited,
            Some("the thread has exited".to_string()),
            None,
        ),
        Outcome::NoRecord(why) => (ThreadStatus::NoRecord, Some(why), None),
        Outcome::NoSpan(n) => {
            rules::walk(f, tid, &n);
            no_span_reason = Some(n.reason.as_str());
            (ThreadStatus::NoSpan, Some(n.to_string()), None)
        }
        Outcome::Error(e) => {
            rules::thread_error(f, tid, &e);
            (ThreadStatus::Error, Some(e.to_string()), None)
        }
        Outcome::Record(rec) => {
            let reason = rules::record(f, tid, &rec.header);
            let status = match reason {
                None => ThreadStatus::Valid,
                Some(_) if rec.header.valid == 0 => ThreadStatus::Idle,
                Some(_) => ThreadStatus::Invalid,
            };
            (status, reason, Some(record_info(f, tid, &rec, key_map)))
        }
    };
    ThreadInfo {
        tid,
        name,
        status,
        schema: read.thread_pointer.and(schema),
        reason,
        no_span_reason,
        tls,
        walk,
        record,
    }
}

fn walk_info(variable: u64, t: &Trail) -> WalkInfo {
    WalkInfo {
        variable_address: hex_addr(variable),
        cped_slot: t.block.map(|b| hex_addr(b.cped_slot)),
        als_handle: t.block.map(|b| hex_addr(b.als_handle)),
        als_identity_hash: t.block.map(|b| b.als_identity_hash),
        undefined: t.block.map(|b| hex_addr(b.undefined_addr)),
        frame: t.frame.map(hex_addr),
        table: t.table.map(hex_addr),
        bucket_count: t.bucket_count,
        hops: t.hops,
        wrapper: t.wrapper.map(hex_addr),
        record: t.record.map(hex_addr),
    }
}

fn record_info(f: &mut Findings, tid: i32, rec: &Record, key_map: Option<&[String]>) -> RecordInfo {
    let h = rec.header;
    let valid = h.is_valid();
    let mut attributes = Vec::new();
    if valid {
        let decoded = decode_attributes(&rec.attrs_data);
        rules::attributes(f, tid, &decoded, key_map);
        attributes = decoded
            .entries
            .into_iter()
            .map(|a| AttributeInfo {
                key_index: a.key_index,
                key: rules::key_name(key_map, a.key_index).cloned(),
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
    modules: Vec<ModuleInfo>,
    [symbol, nodejs_symbol]: [Option<SymbolInfo>; 2],
    process_context: ProcessContextInfo,
    threads: Vec<ThreadInfo>,
) -> Report {
    Report {
        modules,
        nodejs_symbol,
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
