//! From a thread pointer to the address of that thread's thread-context
//! variable (`otel_thread_ctx_v1` or `otel_thread_ctx_nodejs_v1`: one code
//! path for every schema's symbol).
//!
//! Two paths exist, and every access model ends in one of them:
//! - static TLS: the variable sits at a fixed offset from every thread's
//!   pointer (initial-exec, local-exec in the executable, and TLSDESC
//!   descriptors that the dynamic linker resolved to static TLS);
//! - the DTV: the variable sits at `dtv[module].pointer + offset`, a block the
//!   dynamic linker allocated for this thread (legacy general-dynamic, and
//!   TLSDESC descriptors resolved dynamically).
//!
//! The module-wide part (which path, which offset or module id) is decided
//! once per process by [`resolve`]; [`locate`] applies it to one thread.

use crate::discovery::DefiningModule;
use crate::elf::AccessModel;
use crate::memory::{Memory, MemoryError};

/// Where the TLS blocks sit relative to the thread pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
pub enum Variant {
    /// Blocks below the thread pointer (x86-64).
    II,
    /// Blocks above a fixed-size TCB at the thread pointer (arm64).
    I { tcb_size: u64 },
}

/// The C library ABI facts a reader needs (glibc layout).
#[derive(Clone, Copy, Debug)]
pub struct Abi {
    pub variant: Variant,
    /// Offset of the `dtv` pointer inside the TCB at the thread pointer.
    pub dtv_pointer_offset: u64,
    /// Machine code of the resolver glibc installs for a descriptor resolved
    /// to static TLS (it returns its argument, the thread-pointer offset).
    pub static_resolver_code: &'static [&'static [u8]],
}

/// x86-64 glibc: `tcbhead_t { void *tcb; dtv_t *dtv; ... }` at `fs_base`;
/// `_dl_tlsdesc_return` is `mov 8(%rax),%rax; ret`, with `endbr64` on CET builds.
pub const X86_64: Abi = Abi {
    variant: Variant::II,
    dtv_pointer_offset: 8,
    static_resolver_code: &[
        &[0x48, 0x8b, 0x40, 0x08, 0xc3],
        &[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8b, 0x40, 0x08, 0xc3],
    ],
};

/// arm64 glibc: `tcbhead_t { dtv_t *dtv; void *private; }` at `tpidr_el0`;
/// `_dl_tlsdesc_return` is `ldr x0, [x0, #8]; ret`, with `bti c` on BTI builds.
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
pub const AARCH64: Abi = Abi {
    variant: Variant::I { tcb_size: 16 },
    dtv_pointer_offset: 0,
    static_resolver_code: &[
        &[0x00, 0x04, 0x40, 0xf9, 0xc0, 0x03, 0x5f, 0xd6],
        &[
            0x5f, 0x24, 0x03, 0xd5, 0x00, 0x04, 0x40, 0xf9, 0xc0, 0x03, 0x5f, 0xd6,
        ],
    ],
};

/// The ABI of the machine the reader runs on (readers are native).
#[cfg(target_arch = "x86_64")]
pub const HOST: Abi = X86_64;
#[cfg(target_arch = "aarch64")]
pub const HOST: Abi = AARCH64;

/// glibc's DTV entry: `{ void *val; void *to_free; }`.
const DTV_ENTRY_SIZE: u64 = 16;
/// glibc's marker for a DTV slot whose block was never allocated.
const DTV_UNALLOCATED: u64 = u64::MAX;
/// No real static TLS area or DTV is anywhere near this large.
const MAX_TP_OFFSET: u64 = 1 << 32;
const MAX_DTV_LEN: u64 = 1 << 16;

/// The module-wide way to find the variable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The variable is at `thread pointer + tp_offset` in every thread.
    Static { tp_offset: i64 },
    /// The variable is at `dtv[module_id].pointer + offset` in each thread.
    Dtv { module_id: u64, offset: u64 },
}

impl Plan {
    /// `static` when the variable sits in the static TLS area (one offset
    /// from every thread pointer), `dynamic` when each thread's block is
    /// reached through its DTV: what decides whether readers that handle
    /// static TLS only can find it.
    pub fn tls_model(&self) -> &'static str {
        match self {
            Plan::Static { .. } => "static",
            Plan::Dtv { .. } => "dynamic",
        }
    }
}

/// A decided plan, with the name of the path taken and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    pub plan: Plan,
    /// `tlsdesc-static`, `tlsdesc-dtv`, `global-dynamic-dtv`,
    /// `initial-exec-static` or `local-exec-static`.
    pub path: &'static str,
    /// The evidence the decision rests on, for humans.
    pub evidence: String,
    /// Runtime address of the GOT slot read, if any.
    pub got_address: Option<u64>,
}

/// Why the variable cannot be found, module-wide or in one thread.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    #[error("GOT slot: {0}")]
    GotSlot(#[source] MemoryError),
    #[error("TLSDESC descriptor at {0:#x} is not relocated yet")]
    DescriptorUnrelocated(u64),
    #[error("descriptor at {got:#x}: unrecognised resolver {resolver:#x} with argument {arg:#x} (neither the static-TLS stub nor a tls_index for offset {value:#x}; a lazily bound or non-glibc descriptor)")]
    UnknownResolver {
        got: u64,
        resolver: u64,
        arg: u64,
        value: u64,
    },
    #[error("tls_index at {got:#x} holds module id {module_id}: not relocated or garbage")]
    BadModuleId { got: u64, module_id: u64 },
    #[error("thread-pointer offset {0:#x} is implausible (not relocated yet, or garbage)")]
    ImplausibleOffset(i64),
    #[error("the executable has no PT_TLS segment")]
    NoTlsSegment,
    #[error("the module reaches the variable with the local-dynamic model, which OTEP 4947 does not support")]
    LocalDynamic,
    #[error(
        "no TLS relocation in the module references the symbol, so its TLS offset cannot be found"
    )]
    Unreferenced,
    #[error("DTV pointer: {0}")]
    DtvPointer(#[source] MemoryError),
    #[error("thread has no DTV")]
    NoDtv,
    #[error("DTV length: {0}")]
    DtvLength(#[source] MemoryError),
    #[error("DTV at {dtv:#x} claims {len} slots: garbage")]
    DtvGarbage { dtv: u64, len: u64 },
    #[error("DTV entry: {0}")]
    DtvEntry(#[source] MemoryError),
}

/// Decides how to find the variable in every thread of the process. Reads
/// only process-wide memory (the GOT, the resolver code), so no thread needs
/// to be stopped.
pub fn resolve(
    module: &DefiningModule,
    mem: &dyn Memory,
    abi: &Abi,
) -> Result<Resolution, TlsError> {
    let def = &module.definition;
    let got_address = module.model.got().map(|g| module.bias.wrapping_add(g));
    let read_pair = |addr: u64| -> Result<(u64, u64), TlsError> {
        let mut b = [0u8; 16];
        mem.read(addr, &mut b).map_err(TlsError::GotSlot)?;
        Ok((
            u64::from_ne_bytes(b[..8].try_into().unwrap()),
            u64::from_ne_bytes(b[8..].try_into().unwrap()),
        ))
    };
    let (plan, path, evidence) = match module.model {
        AccessModel::Tlsdesc { .. } => {
            let got = got_address.unwrap();
            let (resolver, arg) = read_pair(got)?;
            if resolver == 0 {
                return Err(TlsError::DescriptorUnrelocated(got));
            }
            if is_static_resolver(mem, abi, resolver) {
                let tp_offset = plausible_offset(arg, abi)?;
                (
                    Plan::Static { tp_offset },
                    "tlsdesc-static",
                    format!(
                        "descriptor at {got:#x}: resolver {resolver:#x} is the static-TLS return stub, so its argument {tp_offset} is the offset from the thread pointer"
                    ),
                )
            } else {
                match read_pair(arg) {
                    Ok((module_id, offset)) if (1..MAX_DTV_LEN).contains(&module_id) && offset == def.value => (
                        Plan::Dtv { module_id, offset },
                        "tlsdesc-dtv",
                        format!(
                            "descriptor at {got:#x}: resolver {resolver:#x} is a dynamic resolver; its argument {arg:#x} points to tls_index {{module {module_id}, offset {offset:#x}}}"
                        ),
                    ),
                    _ => {
                        return Err(TlsError::UnknownResolver {
                            got,
                            resolver,
                            arg,
                            value: def.value,
                        })
                    }
                }
            }
        }
        AccessModel::GlobalDynamic { .. } => {
            let got = got_address.unwrap();
            let (module_id, offset) = read_pair(got)?;
            if !(1..MAX_DTV_LEN).contains(&module_id) {
                return Err(TlsError::BadModuleId { got, module_id });
            }
            (
                Plan::Dtv { module_id, offset },
                "global-dynamic-dtv",
                format!("tls_index at {got:#x} (DTPMOD64/DTPOFF64): module {module_id}, offset {offset:#x}"),
            )
        }
        AccessModel::InitialExec { .. } => {
            let got = got_address.unwrap();
            let raw = mem.read_u64(got).map_err(TlsError::GotSlot)?;
            let tp_offset = plausible_offset(raw, abi)?;
            (
                Plan::Static { tp_offset },
                "initial-exec-static",
                format!("GOT slot {got:#x} (TPOFF64) holds offset {tp_offset}"),
            )
        }
        AccessModel::LocalExec => {
            let seg = def.tls_segment.ok_or(TlsError::NoTlsSegment)?;
            let tp_offset = executable_tp_offset(abi, seg.vaddr, seg.memsz, seg.align, def.value);
            (
                Plan::Static { tp_offset },
                "local-exec-static",
                format!(
                    "executable's TLS block (module 1, memsz {:#x}, align {}) sits {} the thread pointer; variable at offset {tp_offset}",
                    seg.memsz,
                    seg.align,
                    if matches!(abi.variant, Variant::II) { "right below" } else { "right after the TCB above" }
                ),
            )
        }
        AccessModel::LocalDynamic { .. } => return Err(TlsError::LocalDynamic),
        AccessModel::Unreferenced => return Err(TlsError::Unreferenced),
    };
    Ok(Resolution {
        plan,
        path,
        evidence,
        got_address,
    })
}

fn is_static_resolver(mem: &dyn Memory, abi: &Abi, resolver: u64) -> bool {
    abi.static_resolver_code.iter().any(|code| {
        let mut buf = vec![0u8; code.len()];
        mem.read(resolver, &mut buf).is_ok() && buf == *code
    })
}

/// Checks an offset from the thread pointer read from the target. Static
/// TLS lies below the thread pointer (variant II) or past the TCB above it
/// (variant I); anything else is a slot the dynamic linker has not relocated
/// yet (a program that is still starting) or garbage.
fn plausible_offset(raw: u64, abi: &Abi) -> Result<i64, TlsError> {
    let off = raw as i64;
    let on_the_tls_side = match abi.variant {
        Variant::II => off < 0,
        Variant::I { tcb_size } => off >= tcb_size as i64,
    };
    if off.unsigned_abs() >= MAX_TP_OFFSET || !on_the_tls_side {
        return Err(TlsError::ImplausibleOffset(off));
    }
    Ok(off)
}

/// Offset of a variable of the executable (TLS module 1, laid out first)
/// from the thread pointer, following glibc's static TLS layout.
pub fn executable_tp_offset(abi: &Abi, vaddr: u64, memsz: u64, align: u64, value: u64) -> i64 {
    let align = align.max(1);
    let roundup = |x: u64| x.div_ceil(align) * align;
    // Bytes by which the template's start misses its alignment.
    let firstbyte = (vaddr & (align - 1)).wrapping_neg() & (align - 1);
    match abi.variant {
        Variant::II => {
            let block = roundup(memsz.saturating_sub(firstbyte)) + firstbyte;
            value as i64 - block as i64
        }
        Variant::I { tcb_size } => {
            let mut off = roundup(tcb_size);
            if off - tcb_size < firstbyte {
                off += align;
            }
            (off - firstbyte + value) as i64
        }
    }
}

/// Where one thread's variable is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// The variable's address in this thread.
    At(u64),
    /// This thread has no block for the module yet (it never touched the
    /// variable), so the variable still holds its initial NULL.
    Unallocated(String),
}

/// Applies `plan` to the thread whose thread pointer is `tp`. Must be called
/// while the thread is stopped: its DTV may be reallocated when it runs.
pub fn locate(plan: &Plan, tp: u64, mem: &dyn Memory, abi: &Abi) -> Result<Location, TlsError> {
    if tp == 0 {
        // Set by the C library at startup: a thread without one (a program
        // that has just been executed) has no TLS yet, so no record.
        return Ok(Location::Unallocated(
            "the thread pointer is 0: the thread has no TLS yet".into(),
        ));
    }
    match *plan {
        Plan::Static { tp_offset } => Ok(Location::At(tp.wrapping_add(tp_offset as u64))),
        Plan::Dtv { module_id, offset } => {
            // The thread pointer and the DTV are the target's words: any
            // value, so addresses wrap instead of overflowing.
            let dtv = mem
                .read_u64(tp.wrapping_add(abi.dtv_pointer_offset))
                .map_err(TlsError::DtvPointer)?;
            if dtv == 0 {
                return Err(TlsError::NoDtv);
            }
            // dtv[-1] holds the number of slots, dtv[0] the generation.
            let len = mem
                .read_u64(dtv.wrapping_sub(DTV_ENTRY_SIZE))
                .map_err(TlsError::DtvLength)?;
            if len >= MAX_DTV_LEN {
                return Err(TlsError::DtvGarbage { dtv, len });
            }
            if module_id > len {
                return Ok(Location::Unallocated(format!(
                    "module {module_id} is beyond this thread's DTV ({len} slots): the thread never touched the variable"
                )));
            }
            let block = mem
                .read_u64(dtv.wrapping_add(module_id * DTV_ENTRY_SIZE))
                .map_err(TlsError::DtvEntry)?;
            if block == DTV_UNALLOCATED || block == 0 {
                return Ok(Location::Unallocated(format!(
                    "DTV slot {module_id} is unallocated: the thread never touched the variable"
                )));
            }
            Ok(Location::At(block.wrapping_add(offset)))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::elf::{LoadSegment, TlsDefinition, TlsSegment};
    use crate::memory::fake::FakeMemory;

    pub(crate) fn module(model: AccessModel) -> DefiningModule {
        DefiningModule {
            schema: crate::schema::Schema::Record,
            path: "/lib/x.so".into(),
            is_executable: false,
            bias: 0x7000_0000,
            definition: TlsDefinition {
                machine: object::elf::EM_X86_64,
                file_type: object::elf::ET_DYN,
                value: 0x18,
                size: 8,
                sym_type: object::elf::STT_TLS,
                tls_segment: Some(TlsSegment {
                    vaddr: 0x2000,
                    memsz: 0x40,
                    align: 16,
                }),
                loads: vec![LoadSegment {
                    offset: 0,
                    vaddr: 0,
                }],
                relocations: vec![],
            },
            model,
        }
    }

    fn words(ws: &[u64]) -> Vec<u8> {
        ws.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    #[test]
    fn static_descriptor_yields_the_thread_pointer_offset() {
        let mem = FakeMemory::default();
        mem.put(0x7000_0100, &words(&[0x5000, (-0x88i64) as u64]));
        mem.put(
            0x5000,
            &[0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8b, 0x40, 0x08, 0xc3],
        );
        let r = resolve(&module(AccessModel::Tlsdesc { got: 0x100 }), &mem, &X86_64).unwrap();
        assert_eq!(r.plan, Plan::Static { tp_offset: -0x88 });
        assert_eq!(r.path, "tlsdesc-static");
        assert_eq!(r.plan.tls_model(), "static");
        assert_eq!(
            locate(&r.plan, 0x9000, &mem, &X86_64).unwrap(),
            Location::At(0x9000 - 0x88)
        );
    }

    #[test]
    fn dynamic_descriptor_goes_through_the_dtv() {
        let mem = FakeMemory::default();
        mem.put(0x7000_0100, &words(&[0x5000, 0x6000]));
        mem.put(0x5000, &[0x90; 16]); // some other resolver
        mem.put(0x6000, &words(&[3, 0x18, 7]));
        let r = resolve(&module(AccessModel::Tlsdesc { got: 0x100 }), &mem, &X86_64).unwrap();
        assert_eq!(
            r.plan,
            Plan::Dtv {
                module_id: 3,
                offset: 0x18
            }
        );
        assert_eq!(r.path, "tlsdesc-dtv");
        assert_eq!(r.plan.tls_model(), "dynamic");
        // tcb at 0x9000: dtv pointer at +8 -> 0xa010; dtv[-1] = 4 slots.
        mem.put(0x9000, &words(&[0x9000, 0xa010]));
        mem.put(
            0xa000,
            &words(&[4, 0, 9, 0, 0xb000, 0, 0xc000, 0, 0xd000, 0, u64::MAX, 0]),
        );
        assert_eq!(
            locate(&r.plan, 0x9000, &mem, &X86_64).unwrap(),
            Location::At(0xd018)
        );
        let unalloc = Plan::Dtv {
            module_id: 4,
            offset: 0,
        };
        assert!(matches!(
            locate(&unalloc, 0x9000, &mem, &X86_64).unwrap(),
            Location::Unallocated(_)
        ));
        let beyond = Plan::Dtv {
            module_id: 5,
            offset: 0,
        };
        assert!(matches!(
            locate(&beyond, 0x9000, &mem, &X86_64).unwrap(),
            Location::Unallocated(_)
        ));
    }

    #[test]
    fn unknown_resolver_with_a_non_index_argument_is_an_error() {
        let mem = FakeMemory::default();
        mem.put(0x7000_0100, &words(&[0x5000, 0x6000]));
        mem.put(0x5000, &[0x90; 16]);
        mem.put(0x6000, &words(&[3, 0x999, 7]));
        assert!(resolve(&module(AccessModel::Tlsdesc { got: 0x100 }), &mem, &X86_64).is_err());
    }

    #[test]
    fn legacy_general_dynamic_reads_the_tls_index() {
        let mem = FakeMemory::default();
        mem.put(0x7000_0200, &words(&[2, 0x18]));
        let r = resolve(
            &module(AccessModel::GlobalDynamic { got: 0x200 }),
            &mem,
            &X86_64,
        )
        .unwrap();
        assert_eq!(
            r.plan,
            Plan::Dtv {
                module_id: 2,
                offset: 0x18
            }
        );
        mem.put(0x7000_0300, &words(&[0]));
        assert!(resolve(
            &module(AccessModel::GlobalDynamic { got: 0x300 }),
            &mem,
            &X86_64
        )
        .is_err());
    }

    #[test]
    fn an_offset_on_the_wrong_side_of_the_thread_pointer_is_not_relocated() {
        let mem = FakeMemory::default();
        // An initial-exec slot before relocation holds 0.
        mem.put(0x7000_0400, &words(&[0]));
        let ie = module(AccessModel::InitialExec { got: 0x400 });
        assert!(resolve(&ie, &mem, &X86_64).is_err());
        mem.put(0x7000_0400, &words(&[0x40]));
        assert!(resolve(&ie, &mem, &X86_64).is_err());
        assert!(resolve(&ie, &mem, &AARCH64).is_ok());
        mem.put(0x7000_0400, &words(&[8]));
        assert!(resolve(&ie, &mem, &AARCH64).is_err());
        mem.put(0x7000_0400, &words(&[(-0x40i64) as u64]));
        assert_eq!(
            resolve(&ie, &mem, &X86_64).unwrap().plan,
            Plan::Static { tp_offset: -0x40 }
        );
    }

    #[test]
    fn garbage_dtv_is_an_error_not_a_crash() {
        let mem = FakeMemory::default();
        mem.put(0x9000, &words(&[0x9000, 0xa010]));
        mem.put(0xa000, &words(&[u64::MAX / 2, 0]));
        assert!(locate(
            &Plan::Dtv {
                module_id: 1,
                offset: 0
            },
            0x9000,
            &mem,
            &X86_64
        )
        .is_err());
        assert!(locate(
            &Plan::Dtv {
                module_id: 1,
                offset: 0
            },
            0x1234,
            &mem,
            &X86_64
        )
        .is_err());
    }

    #[test]
    fn executable_layout_matches_the_linkers_local_exec_offsets() {
        // x86-64: block rounded up to its alignment ends at the thread pointer.
        assert_eq!(executable_tp_offset(&X86_64, 0x3000, 0x10, 8, 0x8), -0x8);
        assert_eq!(executable_tp_offset(&X86_64, 0x3000, 0x88, 64, 0x80), -0x40);
        // arm64: block starts after the 16-byte TCB, rounded to its alignment.
        assert_eq!(executable_tp_offset(&AARCH64, 0x3000, 0x10, 8, 0x8), 0x18);
        assert_eq!(executable_tp_offset(&AARCH64, 0x3000, 0x88, 64, 0x80), 0xc0);
    }
}
