//! ELF facts about one module: does it define a thread-context symbol
//! (`otel_thread_ctx_v1`, `otel_thread_ctx_nodejs_v1`), where is its TLS
//! template, and how does its code reach the variable (which relocations
//! reference it, hence which TLS access model applies).

use std::fs::File;
use std::os::fd::AsRawFd;

use object::elf;
use object::read::elf::{ElfFile64, FileHeader, ProgramHeader, Rela, SectionHeader, Sym};
use object::{Endianness, SectionIndex};

/// A read-only private mapping of a whole file. Only the pages the ELF parser
/// touches are read from disk, which matters for 100 MB executables.
pub struct MappedFile {
    ptr: *mut libc::c_void,
    len: usize,
}

impl MappedFile {
    /// Maps `file` read-only. Empty files are refused (they are not ELF).
    pub fn map(file: &File) -> std::io::Result<MappedFile> {
        let len = file.metadata()?.len() as usize;
        if len == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "empty file",
            ));
        }
        // SAFETY: a fresh PROT_READ/MAP_PRIVATE mapping of a file we hold open;
        // the kernel picks the address, so no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(MappedFile { ptr, len })
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is a live read-only mapping owned by self.
        // (A file truncated by someone else while mapped would fault; modules
        // loaded by a running process are not truncated in practice.)
        unsafe { std::slice::from_raw_parts(self.ptr.cast(), self.len) }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `map`, once.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// The module's `PT_TLS` segment: the TLS template glibc lays out per thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TlsSegment {
    pub vaddr: u64,
    pub memsz: u64,
    pub align: u64,
}

/// A `PT_LOAD` segment, used to turn a mapping address into the load bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub offset: u64,
    pub vaddr: u64,
}

/// Which TLS relocation a dynamic relocation entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsRelocKind {
    /// `R_*_TLSDESC`: a two-word descriptor `{resolver, argument}`.
    Tlsdesc,
    /// `R_*_DTPMOD64`: the module id half of a `tls_index`.
    DtpMod,
    /// `R_*_DTPOFF64`: the offset half of a `tls_index`.
    DtpOff,
    /// `R_*_TPOFF64`: a thread-pointer offset (initial-exec).
    TpOff,
}

/// One dynamic relocation that reaches the variable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsReloc {
    pub kind: TlsRelocKind,
    /// The relocation's name, e.g. `R_X86_64_TLSDESC`.
    pub type_name: &'static str,
    /// Link-time address of the GOT slot (add the load bias for the runtime address).
    pub got: u64,
    pub addend: i64,
    /// False when the entry names no symbol (local-dynamic or `-Bsymbolic` style).
    pub by_symbol: bool,
}

/// How the module's code reaches `otel_thread_ctx_v1`, which decides how a
/// reader finds the variable of a given thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessModel {
    /// TLSDESC descriptor at `got` (two words).
    Tlsdesc { got: u64 },
    /// Legacy general-dynamic `tls_index {module, offset}` at `got`.
    GlobalDynamic { got: u64 },
    /// Initial-exec: the thread-pointer offset is stored at `got`.
    InitialExec { got: u64 },
    /// Local-exec in the executable: the offset is fixed by the TLS layout.
    LocalExec,
    /// Local-dynamic: not supported by OTEP 4947.
    LocalDynamic { got: u64 },
    /// The module defines the symbol but no relocation reaches it.
    Unreferenced,
}

impl AccessModel {
    /// A stable name for reports.
    pub fn name(&self) -> &'static str {
        match self {
            AccessModel::Tlsdesc { .. } => "tlsdesc",
            AccessModel::GlobalDynamic { .. } => "global-dynamic",
            AccessModel::InitialExec { .. } => "initial-exec",
            AccessModel::LocalExec => "local-exec",
            AccessModel::LocalDynamic { .. } => "local-dynamic",
            AccessModel::Unreferenced => "unreferenced",
        }
    }

    /// Link-time GOT address the model reads, if any.
    pub fn got(&self) -> Option<u64> {
        match *self {
            AccessModel::Tlsdesc { got }
            | AccessModel::GlobalDynamic { got }
            | AccessModel::InitialExec { got }
            | AccessModel::LocalDynamic { got } => Some(got),
            _ => None,
        }
    }
}

/// What a module that defines `otel_thread_ctx_v1` says about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsDefinition {
    /// `e_machine` of the module.
    pub machine: u16,
    /// `e_type` of the module (`ET_EXEC` or `ET_DYN`).
    pub file_type: u16,
    /// `st_value`: offset of the variable inside the module's TLS block.
    pub value: u64,
    /// `st_size`: 8 for a pointer on 64-bit targets.
    pub size: u64,
    /// `st_info` type; `STT_TLS` for a conforming writer.
    pub sym_type: u8,
    pub tls_segment: Option<TlsSegment>,
    pub loads: Vec<LoadSegment>,
    /// Every TLS relocation that reaches the variable.
    pub relocations: Vec<TlsReloc>,
}

impl TlsDefinition {
    /// Classifies the access model. `is_executable` is true for the
    /// process's main program, where the linker relaxes accesses to
    /// local-exec and leaves no relocation.
    pub fn access_model(&self, is_executable: bool) -> AccessModel {
        let find = |kind: TlsRelocKind, by_symbol: bool| {
            self.relocations
                .iter()
                .find(|r| {
                    r.kind == kind
                        && r.by_symbol == by_symbol
                        && (by_symbol || r.addend as u64 == self.value)
                })
                .map(|r| r.got)
        };
        if let Some(got) = find(TlsRelocKind::Tlsdesc, true) {
            AccessModel::Tlsdesc { got }
        } else if let Some(got) = find(TlsRelocKind::DtpMod, true) {
            AccessModel::GlobalDynamic { got }
        } else if let Some(got) = find(TlsRelocKind::TpOff, true) {
            AccessModel::InitialExec { got }
        } else if is_executable {
            AccessModel::LocalExec
        } else if let Some(got) = find(TlsRelocKind::Tlsdesc, false) {
            AccessModel::Tlsdesc { got }
        } else if let Some(got) = find(TlsRelocKind::TpOff, false) {
            AccessModel::InitialExec { got }
        } else if let Some(r) = self
            .relocations
            .iter()
            .find(|r| r.kind == TlsRelocKind::DtpMod)
        {
            AccessModel::LocalDynamic { got: r.got }
        } else {
            AccessModel::Unreferenced
        }
    }

    /// The load bias of a module whose file offset `offset` is mapped at
    /// `start`, from the `PT_LOAD` segment covering that offset.
    pub fn load_bias(&self, start: u64, offset: u64) -> Option<u64> {
        let page = |x: u64| x & !0xfff;
        self.loads
            .iter()
            .find(|l| page(l.offset) == offset)
            .map(|l| start.wrapping_sub(page(l.vaddr)))
    }
}

struct RelocTypes {
    tlsdesc: u32,
    dtpmod: u32,
    dtpoff: u32,
    tpoff: u32,
    names: [&'static str; 4],
}

fn reloc_types(machine: u16) -> Option<RelocTypes> {
    match machine {
        elf::EM_X86_64 => Some(RelocTypes {
            tlsdesc: elf::R_X86_64_TLSDESC,
            dtpmod: elf::R_X86_64_DTPMOD64,
            dtpoff: elf::R_X86_64_DTPOFF64,
            tpoff: elf::R_X86_64_TPOFF64,
            names: [
                "R_X86_64_TLSDESC",
                "R_X86_64_DTPMOD64",
                "R_X86_64_DTPOFF64",
                "R_X86_64_TPOFF64",
            ],
        }),
        elf::EM_AARCH64 => Some(RelocTypes {
            tlsdesc: elf::R_AARCH64_TLSDESC,
            dtpmod: elf::R_AARCH64_TLS_DTPMOD,
            dtpoff: elf::R_AARCH64_TLS_DTPREL,
            tpoff: elf::R_AARCH64_TLS_TPREL,
            names: [
                "R_AARCH64_TLSDESC",
                "R_AARCH64_TLS_DTPMOD",
                "R_AARCH64_TLS_DTPREL",
                "R_AARCH64_TLS_TPREL",
            ],
        }),
        _ => None,
    }
}

/// Why a mapped file could not be analysed.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("not a readable 64-bit ELF: {0}")]
    Unreadable(#[source] object::read::Error),
}

/// Looks `symbol` up in the `.dynsym` of the ELF image `data`.
/// `Ok(None)`: the module does not define it (or has no TLS at all).
/// `Err`: the file is not a 64-bit ELF the reader can parse.
pub fn analyze(data: &[u8], symbol: &str) -> Result<Option<TlsDefinition>, ElfError> {
    let file = ElfFile64::<Endianness>::parse(data).map_err(ElfError::Unreadable)?;
    let endian = file.endian();
    let header = file.elf_header();
    let mut tls_segment = None;
    let mut loads = Vec::new();
    for ph in file.elf_program_headers() {
        match ph.p_type(endian) {
            elf::PT_TLS => {
                tls_segment = Some(TlsSegment {
                    vaddr: ph.p_vaddr(endian),
                    memsz: ph.p_memsz(endian),
                    align: ph.p_align(endian).max(1),
                })
            }
            elf::PT_LOAD => loads.push(LoadSegment {
                offset: ph.p_offset(endian),
                vaddr: ph.p_vaddr(endian),
            }),
            _ => {}
        }
    }
    // Without a TLS segment the module cannot define a TLS variable; skipping
    // it avoids walking the symbol tables of most libraries.
    if tls_segment.is_none() {
        return Ok(None);
    }
    let dynsym = file.elf_dynamic_symbol_table();
    let strings = dynsym.strings();
    let Some((index, sym)) = dynsym.enumerate().find(|(_, s)| {
        s.st_shndx(endian) != elf::SHN_UNDEF
            && s.name(endian, strings)
                .is_ok_and(|n| n == symbol.as_bytes())
    }) else {
        return Ok(None);
    };
    let machine = header.e_machine(endian);
    let mut relocations = Vec::new();
    if let Some(types) = reloc_types(machine) {
        for section in file.elf_section_table().iter() {
            let Ok(Some((relas, link))) = section.rela(endian, data) else {
                continue;
            };
            if link != dynsym.section() || link == SectionIndex(0) {
                continue;
            }
            for rela in relas {
                let r_type = rela.r_type(endian, false);
                let (kind, name) = if r_type == types.tlsdesc {
                    (TlsRelocKind::Tlsdesc, types.names[0])
                } else if r_type == types.dtpmod {
                    (TlsRelocKind::DtpMod, types.names[1])
                } else if r_type == types.dtpoff {
                    (TlsRelocKind::DtpOff, types.names[2])
                } else if r_type == types.tpoff {
                    (TlsRelocKind::TpOff, types.names[3])
                } else {
                    continue;
                };
                let r_sym = rela.r_sym(endian, false) as usize;
                let addend = rela.r_addend(endian);
                // Entries naming no symbol reach "this module's block at
                // addend": ours only when the addend is our offset (module-id
                // slots of local-dynamic code are kept to recognise it).
                let ours = if r_sym == 0 {
                    kind == TlsRelocKind::DtpMod || addend as u64 == sym.st_value(endian)
                } else {
                    r_sym == index.0
                };
                if !ours {
                    continue;
                }
                relocations.push(TlsReloc {
                    kind,
                    type_name: name,
                    got: rela.r_offset(endian),
                    addend,
                    by_symbol: r_sym != 0,
                });
            }
        }
    }
    Ok(Some(TlsDefinition {
        machine,
        file_type: header.e_type(endian),
        value: sym.st_value(endian),
        size: sym.st_size(endian),
        sym_type: sym.st_type(),
        tls_segment,
        loads,
        relocations,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(relocations: Vec<TlsReloc>) -> TlsDefinition {
        TlsDefinition {
            machine: elf::EM_X86_64,
            file_type: elf::ET_DYN,
            value: 0x10,
            size: 8,
            sym_type: elf::STT_TLS,
            tls_segment: Some(TlsSegment {
                vaddr: 0x1000,
                memsz: 0x18,
                align: 8,
            }),
            loads: vec![
                LoadSegment {
                    offset: 0,
                    vaddr: 0,
                },
                LoadSegment {
                    offset: 0x1000,
                    vaddr: 0x1000,
                },
            ],
            relocations,
        }
    }

    fn reloc(kind: TlsRelocKind, got: u64, by_symbol: bool, addend: i64) -> TlsReloc {
        TlsReloc {
            kind,
            type_name: "",
            got,
            addend,
            by_symbol,
        }
    }

    #[test]
    fn tlsdesc_wins_over_legacy_and_initial_exec() {
        let d = def(vec![
            reloc(TlsRelocKind::TpOff, 0x30, true, 0),
            reloc(TlsRelocKind::DtpMod, 0x20, true, 0),
            reloc(TlsRelocKind::Tlsdesc, 0x40, true, 0),
        ]);
        assert_eq!(d.access_model(false), AccessModel::Tlsdesc { got: 0x40 });
        let d = def(vec![
            reloc(TlsRelocKind::TpOff, 0x30, true, 0),
            reloc(TlsRelocKind::DtpMod, 0x20, true, 0),
        ]);
        assert_eq!(
            d.access_model(false),
            AccessModel::GlobalDynamic { got: 0x20 }
        );
        let d = def(vec![reloc(TlsRelocKind::TpOff, 0x30, true, 0)]);
        assert_eq!(
            d.access_model(false),
            AccessModel::InitialExec { got: 0x30 }
        );
    }

    #[test]
    fn executable_without_relocation_is_local_exec() {
        assert_eq!(def(vec![]).access_model(true), AccessModel::LocalExec);
        assert_eq!(def(vec![]).access_model(false), AccessModel::Unreferenced);
    }

    #[test]
    fn symbol_less_entries_count_only_when_they_name_our_offset() {
        let d = def(vec![reloc(TlsRelocKind::Tlsdesc, 0x40, false, 0x8)]);
        assert_eq!(d.access_model(false), AccessModel::Unreferenced);
        let d = def(vec![reloc(TlsRelocKind::Tlsdesc, 0x40, false, 0x10)]);
        assert_eq!(d.access_model(false), AccessModel::Tlsdesc { got: 0x40 });
        let d = def(vec![reloc(TlsRelocKind::DtpMod, 0x50, false, 0)]);
        assert_eq!(
            d.access_model(false),
            AccessModel::LocalDynamic { got: 0x50 }
        );
    }

    #[test]
    fn load_bias_uses_the_segment_of_the_mapped_offset() {
        let d = def(vec![]);
        assert_eq!(d.load_bias(0x7f00_0000_0000, 0), Some(0x7f00_0000_0000));
        assert_eq!(
            d.load_bias(0x7f00_0000_1000, 0x1000),
            Some(0x7f00_0000_0000)
        );
        assert_eq!(d.load_bias(0x7f00_0000_1000, 0x5000), None);
    }

    #[test]
    fn non_elf_is_an_error() {
        assert!(analyze(b"definitely not an ELF file", "otel_thread_ctx_v1").is_err());
    }
}
