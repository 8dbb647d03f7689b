//! Finds the modules (executable, shared libraries, dlopen'ed addons) that
//! define a thread-context symbol of any [`Schema`] (`otel_thread_ctx_v1`,
//! `otel_thread_ctx_nodejs_v1`, or both), from `/proc/<pid>/maps` and the
//! ELF files behind those mappings.

use std::collections::HashSet;
use std::fs::{self, File};

use crate::elf::{self, AccessModel, MappedFile, TlsDefinition};
use crate::maps::Mapping;
use crate::schema::Schema;

/// A loaded module that defines the symbol of one schema (a module that
/// defines both appears twice).
#[derive(Clone, Debug)]
pub struct DefiningModule {
    pub schema: Schema,
    /// Path as `/proc/<pid>/maps` shows it.
    pub path: String,
    /// True for the process's main program.
    pub is_executable: bool,
    /// Runtime address minus link-time address.
    pub bias: u64,
    pub definition: TlsDefinition,
    pub model: AccessModel,
}

/// The outcome of scanning every mapped ELF file.
#[derive(Debug, Default)]
pub struct Discovery {
    /// Defining modules, the executable first, then in address order
    /// (schemas mixed: see [`Discovery::of`]).
    pub modules: Vec<DefiningModule>,
    /// Number of distinct mapped files looked at.
    pub scanned: usize,
    /// Files that could not be opened or parsed (`path: reason`).
    pub errors: Vec<String>,
}

/// Scans the ELF files mapped into `pid`.
pub fn discover(pid: i32, maps: &[Mapping]) -> Discovery {
    let exe = fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    let mut seen = HashSet::new();
    let mut out = Discovery::default();
    for m in maps.iter().filter(|m| m.is_file_backed()) {
        // The first mapping of a file (lowest address) carries the ELF header.
        if !seen.insert((m.inode, m.path.clone())) {
            continue;
        }
        out.scanned += 1;
        let Some(file) = open_mapped(pid, m) else {
            out.errors.push(format!("{}: cannot open", m.path));
            continue;
        };
        let Ok(image) = MappedFile::map(&file) else {
            continue;
        };
        if !image.bytes().starts_with(b"\x7fELF") {
            continue;
        }
        for schema in Schema::ALL {
            let definition = match elf::analyze(image.bytes(), schema.symbol()) {
                Ok(Some(d)) => d,
                Ok(None) => continue,
                Err(e) => {
                    out.errors.push(format!("{}: {e}", m.path));
                    break;
                }
            };
            let Some(bias) = definition.load_bias(m.start, m.offset) else {
                out.errors.push(format!(
                    "{}: no PT_LOAD segment matches file offset {:#x}",
                    m.path, m.offset
                ));
                break;
            };
            let is_executable = exe.as_deref() == Some(m.path.as_str());
            let model = definition.access_model(is_executable);
            out.modules.push(DefiningModule {
                schema,
                path: m.path.clone(),
                is_executable,
                bias,
                definition,
                model,
            });
        }
    }
    out.modules.sort_by_key(|m| !m.is_executable);
    out
}

impl Discovery {
    /// The modules that define `schema`'s symbol, the executable first.
    pub fn of(&self, schema: Schema) -> impl Iterator<Item = &DefiningModule> {
        self.modules.iter().filter(move |m| m.schema == schema)
    }
}

/// Opens the file behind a mapping: through `map_files` (works for deleted
/// and container files), else through the target's root directory.
pub fn open_mapped(pid: i32, m: &Mapping) -> Option<File> {
    File::open(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))
        .or_else(|_| File::open(format!("/proc/{pid}/root{}", m.name())))
        .ok()
}
