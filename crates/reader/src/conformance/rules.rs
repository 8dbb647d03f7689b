//! The conformance rules `inspect` applies: each rule looks at one fact the
//! collection found and records what prevents reading (a problem) or what
//! deviates without preventing it (a warning).

use crate::discovery::DefiningModule;
use crate::elf::AccessModel;
use crate::process_context::Lookup;
use crate::record::{Attributes, Header};
use crate::schema::nodejs::NoSpan;
use crate::schema::Schema;
use crate::thread::ReadError;
use crate::tls::TlsError;

/// What the rules found, in the order they found it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// Why the process is not conformant (empty when it is).
    pub problems: Vec<String>,
    /// Deviations that do not prevent reading.
    pub warnings: Vec<String>,
}

impl Findings {
    fn problem(&mut self, p: impl Into<String>) {
        self.problems.push(p.into());
    }

    fn warning(&mut self, w: impl Into<String>) {
        self.warnings.push(w.into());
    }
}

/// The process context: absent (keys unknown), unreadable, or readable with
/// the deviations its decoder saw.
pub fn process_context(f: &mut Findings, pc: &Lookup) {
    match pc {
        Lookup::Absent => f.warning(
            "no OTEL_CTX process context: threadlocal.schema_version and attribute keys are unknown",
        ),
        Lookup::Invalid { mapping, error, .. } => {
            f.problem(format!("process context in {mapping} is unreadable: {error}"))
        }
        Lookup::Found(d) => {
            if d.schema_version.is_none() {
                f.warning("process context has no threadlocal.schema_version");
            }
            if d.attribute_key_map.is_none() {
                f.warning("process context has no usable threadlocal.attribute_key_map");
            }
            for w in &d.warnings {
                f.warning(format!("process context: {w}"));
            }
        }
    }
}

/// No module defines any schema's symbol: the first problem of all, and the
/// files that could not be examined may be why.
pub fn no_module(f: &mut Findings, discovery_errors: &[String]) {
    f.problems.insert(
        0,
        format!(
            "no module defines {} or {}",
            Schema::Record.symbol(),
            Schema::Nodejs.symbol()
        ),
    );
    for e in discovery_errors {
        f.warning(format!("could not examine {e}"));
    }
}

/// The symbol is a TLS variable of its schema's size (a pointer for the
/// record schema, the 32-byte block for the Node.js schema).
pub fn symbol(f: &mut Findings, module: &DefiningModule) {
    let def = &module.definition;
    let name = module.schema.symbol();
    if def.sym_type != object::elf::STT_TLS {
        f.problem(format!(
            "{name} in {} is not a TLS symbol (st_type {})",
            module.path, def.sym_type
        ));
    }
    let size = module.schema.symbol_size();
    if def.size != size {
        f.problem(format!(
            "{name} has size {} (the schema's is {size} bytes)",
            def.size
        ));
    }
}

/// A shared library should reach the variable through TLSDESC.
pub fn access_model(f: &mut Findings, module: &DefiningModule) {
    if matches!(module.model, AccessModel::GlobalDynamic { .. }) && !module.is_executable {
        f.warning("the module uses legacy general-dynamic TLS; OTEP 4947 prefers TLSDESC and some readers reject the legacy dialect");
    }
}

/// Only one module should define the symbol; only the first is read.
pub fn other_definitions(f: &mut Findings, module: &DefiningModule, others: &[String]) {
    if !others.is_empty() {
        f.warning(format!(
            "{} is also defined in {}; only {} is read",
            module.schema.symbol(),
            others.join(", "),
            module.path
        ));
    }
}

/// The variable must be locatable in every thread.
pub fn resolution(f: &mut Findings, schema: Schema, error: &TlsError) {
    f.problem(format!(
        "cannot resolve {} per thread: {error}",
        schema.symbol()
    ));
}

/// A Node.js walk that ended on memory that is not what the schema
/// describes: a warning (a sample inside GC sees this too), named per thread.
pub fn walk(f: &mut Findings, tid: i32, no_span: &NoSpan) {
    if no_span.reason.is_anomaly() {
        f.warning(format!(
            "thread {tid}: the {} walk: {no_span}",
            Schema::Nodejs
        ));
    }
}

/// A thread whose context could not be read.
pub fn thread_error(f: &mut Findings, tid: i32, error: &ReadError) {
    f.problem(format!("thread {tid}: {error}"));
}

/// The valid byte and the ids of a record. Returns why the record names no
/// span, or `None` when it does; a record marked valid with an all-zero id
/// is a problem (W3C Trace Context makes such an id invalid).
pub fn record(f: &mut Findings, tid: i32, h: &Header) -> Option<String> {
    if h.valid == 0 {
        // What a writer publishes between spans: no error.
        return Some("idle (no span)".into());
    }
    if !h.is_valid() {
        return Some(format!("valid byte is {}", h.valid));
    }
    let zero = h.zero_ids()?;
    f.problem(format!(
        "thread {tid}: {zero}, which W3C Trace Context makes invalid"
    ));
    Some(zero.to_string())
}

/// The name of key index `index` in the key map, if the map has it.
pub fn key_name(key_map: Option<&[String]>, index: u8) -> Option<&String> {
    key_map.and_then(|m| m.get(index as usize))
}

/// The attrs_data of a valid record: whole entries only, and key indexes
/// the key map names.
pub fn attributes(f: &mut Findings, tid: i32, decoded: &Attributes, key_map: Option<&[String]>) {
    if decoded.trailing_bytes > 0 {
        f.warning(format!(
            "thread {tid}: {} trailing attrs_data bytes do not form an entry",
            decoded.trailing_bytes
        ));
    }
    for a in &decoded.entries {
        if key_name(key_map, a.key_index).is_none() {
            f.warning(format!(
                "thread {tid}: attribute key index {} is not in threadlocal.attribute_key_map",
                a.key_index
            ));
        }
    }
}

/// At least one thread must have been read.
pub fn some_thread_read(f: &mut Findings, any_read: bool, process_exited: bool) {
    if !any_read {
        f.problem(if process_exited {
            "the process exited before any thread could be read"
        } else {
            "no thread could be read"
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{fake::FakeMemory, MemoryError};
    use crate::process_context::{
        self, Decoded, Header as PcHeader, LookupError, ReadError as PcReadError,
    };
    use crate::record::{self, decode_attributes, HEADER_SIZE};
    use crate::tls::tests::module;

    fn header(valid: u8, trace: u8, span: u8) -> Header {
        let mut b = [0u8; HEADER_SIZE];
        b[..16].fill(trace);
        b[16..24].fill(span);
        b[24] = valid;
        Header::parse(&b)
    }

    fn decoded(schema: Option<&str>, keys: Option<&[&str]>, warnings: &[&str]) -> Lookup {
        Lookup::Found(Box::new(Decoded {
            mapping: "/memfd:OTEL_CTX".into(),
            address: 0x1000,
            header: PcHeader {
                signature: *b"OTEL_CTX",
                version: 2,
                payload_size: 0,
                published_at_ns: 1,
                payload: 0x2000,
            },
            resource: None,
            attributes: Vec::new(),
            schema_version: schema.map(Into::into),
            attribute_key_map: keys.map(|k| k.iter().map(|s| s.to_string()).collect()),
            v8_layout: None,
            warnings: warnings.iter().map(|w| w.to_string()).collect(),
        }))
    }

    #[test]
    fn a_complete_process_context_finds_nothing() {
        let mut f = Findings::default();
        process_context(&mut f, &decoded(Some("tlsdesc_v1_dev"), Some(&["k"]), &[]));
        assert_eq!(f, Findings::default());
    }

    #[test]
    fn missing_keys_and_decoder_deviations_are_warnings() {
        let mut f = Findings::default();
        process_context(&mut f, &decoded(None, None, &["odd"]));
        assert!(f.problems.is_empty());
        assert_eq!(
            f.warnings,
            [
                "process context has no threadlocal.schema_version",
                "process context has no usable threadlocal.attribute_key_map",
                "process context: odd",
            ]
        );
        let mut f = Findings::default();
        process_context(&mut f, &Lookup::Absent);
        assert!(f.problems.is_empty());
        assert!(f.warnings[0].starts_with("no OTEL_CTX process context"));
    }

    #[test]
    fn an_unreadable_process_context_is_a_problem() {
        let mut f = Findings::default();
        let lookup = Lookup::Invalid {
            mapping: "[anon:OTEL_CTX]".into(),
            address: 0x1000,
            error: LookupError::Read(PcReadError::Version(9)),
        };
        process_context(&mut f, &lookup);
        assert_eq!(
            f.problems,
            ["process context in [anon:OTEL_CTX] is unreadable: unsupported version 9 (supported: 2)"]
        );
        // The same through the reader, from fake memory.
        let mem = FakeMemory::default();
        let mapping = crate::maps::Mapping {
            start: 0x1000,
            end: 0x2000,
            perms: "rw-p".into(),
            offset: 0,
            inode: 1,
            path: "[anon:OTEL_CTX]".into(),
        };
        mem.put(0x1000, &[0; 32]);
        let mut g = Findings::default();
        process_context(&mut g, &process_context::lookup(&[mapping], &mem));
        assert_eq!(g.problems.len(), 1);
        assert!(g.problems[0].contains("is not OTEL_CTX"), "{g:?}");
    }

    #[test]
    fn no_module_is_the_first_problem() {
        let mut f = Findings::default();
        f.problem("earlier");
        no_module(&mut f, &["/x.so: cannot open".into()]);
        assert_eq!(
            f.problems,
            [
                "no module defines otel_thread_ctx_v1 or otel_thread_ctx_nodejs_v1",
                "earlier"
            ]
        );
        assert_eq!(f.warnings, ["could not examine /x.so: cannot open"]);
    }

    #[test]
    fn the_symbol_is_an_8_byte_tls_variable() {
        let mut m = module(AccessModel::Tlsdesc { got: 0x100 });
        let mut f = Findings::default();
        symbol(&mut f, &m);
        assert!(f.problems.is_empty());
        m.definition.sym_type = object::elf::STT_OBJECT;
        m.definition.size = 4;
        symbol(&mut f, &m);
        assert_eq!(
            f.problems,
            [
                "otel_thread_ctx_v1 in /lib/x.so is not a TLS symbol (st_type 1)",
                "otel_thread_ctx_v1 has size 4 (the schema's is 8 bytes)",
            ]
        );
    }

    #[test]
    fn legacy_dynamic_tls_in_a_library_is_a_warning() {
        let mut f = Findings::default();
        access_model(&mut f, &module(AccessModel::Tlsdesc { got: 0x100 }));
        assert!(f.warnings.is_empty());
        let mut gd = module(AccessModel::GlobalDynamic { got: 0x100 });
        access_model(&mut f, &gd);
        assert_eq!(f.warnings.len(), 1);
        gd.is_executable = true;
        access_model(&mut f, &gd);
        assert_eq!(f.warnings.len(), 1);
        assert!(f.problems.is_empty());
    }

    #[test]
    fn other_definitions_are_named() {
        let m = module(AccessModel::Tlsdesc { got: 0x100 });
        let mut f = Findings::default();
        other_definitions(&mut f, &m, &[]);
        assert!(f.warnings.is_empty());
        other_definitions(&mut f, &m, &["/a.so".into(), "/b.so".into()]);
        assert_eq!(
            f.warnings,
            ["otel_thread_ctx_v1 is also defined in /a.so, /b.so; only /lib/x.so is read"]
        );
    }

    #[test]
    fn unresolvable_variables_and_unreadable_threads_are_problems() {
        let mut f = Findings::default();
        resolution(&mut f, Schema::Record, &TlsError::NoDtv);
        let mem = FakeMemory::default();
        let err = record::read(&mem, 0x1001, true).unwrap_err();
        thread_error(&mut f, 7, &ReadError::Record(err));
        thread_error(
            &mut f,
            8,
            &ReadError::Variable(MemoryError {
                addr: 0x10,
                len: 8,
                reason: "unmapped".into(),
            }),
        );
        assert_eq!(
            f.problems,
            [
                "cannot resolve otel_thread_ctx_v1 per thread: thread has no DTV",
                "thread 7: record pointer 0x1001 is not 2-byte aligned",
                "thread 8: otel_thread_ctx_v1: cannot read 8 bytes at 0x10: unmapped",
            ]
        );
    }

    #[test]
    fn the_valid_byte_and_zero_ids_decide_the_record() {
        let mut f = Findings::default();
        assert_eq!(record(&mut f, 1, &header(1, 0xaa, 0xbb)), None);
        assert_eq!(
            record(&mut f, 1, &header(0, 0xaa, 0xbb)).as_deref(),
            Some("idle (no span)")
        );
        assert_eq!(
            record(&mut f, 1, &header(2, 0, 0)).as_deref(),
            Some("valid byte is 2")
        );
        assert!(f.problems.is_empty(), "an invalid record is no problem");
        assert_eq!(
            record(&mut f, 3, &header(1, 0, 0xbb)).as_deref(),
            Some("valid is 1 but trace_id is all zero")
        );
        assert_eq!(
            record(&mut f, 4, &header(1, 0xaa, 0)).as_deref(),
            Some("valid is 1 but span_id is all zero")
        );
        assert_eq!(
            f.problems,
            [
                "thread 3: valid is 1 but trace_id is all zero, which W3C Trace Context makes invalid",
                "thread 4: valid is 1 but span_id is all zero, which W3C Trace Context makes invalid",
            ]
        );
    }

    #[test]
    fn attributes_need_whole_entries_and_mapped_keys() {
        let keys = ["http.route".to_string()];
        let mut f = Findings::default();
        attributes(&mut f, 5, &decode_attributes(&[0, 1, b'x']), Some(&keys));
        assert_eq!(f, Findings::default());
        attributes(
            &mut f,
            5,
            &decode_attributes(&[0, 1, b'x', 3, 0, 9]),
            Some(&keys),
        );
        assert_eq!(
            f.warnings,
            [
                "thread 5: 1 trailing attrs_data bytes do not form an entry",
                "thread 5: attribute key index 3 is not in threadlocal.attribute_key_map",
            ]
        );
        let mut f = Findings::default();
        attributes(&mut f, 6, &decode_attributes(&[0, 0]), None);
        assert_eq!(
            f.warnings,
            ["thread 6: attribute key index 0 is not in threadlocal.attribute_key_map"]
        );
        assert_eq!(
            key_name(Some(&keys), 0).map(String::as_str),
            Some("http.route")
        );
        assert_eq!(key_name(Some(&keys), 1), None);
    }

    #[test]
    fn some_thread_must_be_read() {
        let mut f = Findings::default();
        some_thread_read(&mut f, true, true);
        assert!(f.problems.is_empty());
        some_thread_read(&mut f, false, false);
        some_thread_read(&mut f, false, true);
        assert_eq!(
            f.problems,
            [
                "no thread could be read",
                "the process exited before any thread could be read",
            ]
        );
    }
}
