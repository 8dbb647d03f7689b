//! Names the addresses of the samples' stacks.
//!
//! User addresses are tied to a mapping as they arrive, while the process is
//! alive (a process that exits mid-profile takes its maps with it), and named
//! at the end: file-backed ones from the file's ELF symbols (blazesym),
//! anonymous ones (JIT code) from V8's heap as the samples arrive
//! ([`crate::v8`]) or else from V8's perf map, kernel ones from kallsyms.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use blazesym::symbolize::source::{Elf, Kernel, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use blazesym::MaybeDefault;

use crate::perf_map;
use crate::process_maps::ProcessMaps;
use otel_thread_ctx_reader::maps::Mapping;

/// A stack frame's name and the module it is in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub name: String,
    /// The file, `[kernel]`, `[jit]` (JIT code V8 or its perf map named)
    /// or `[anon]`.
    pub module: String,
    /// The line the frame was at in its script (1-based), where V8 says
    /// (JavaScript frames of optimized code and the functions it inlined).
    pub line: Option<u32>,
}

/// One JIT frame named from V8's heap ([`crate::v8`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedFrame {
    /// The frame's lookup address (a return address moved back into its
    /// call, as [`crate::model::lookup_address`] does).
    pub address: u64,
    pub frame: Frame,
    /// Not the stack's innermost frame: its frame pointer is its own for
    /// sure. The innermost frame may be in its function's first or last
    /// instructions, where the frame pointer is still its caller's.
    pub settled: bool,
}

#[derive(Clone, Debug)]
enum Place {
    File { path: String, offset: u64 },
    Anonymous,
    Special(String),
    Unmapped,
}

/// Collects addresses during the run; names them in [`Collector::finish`].
pub struct Collector {
    pid: i32,
    user: HashMap<u64, Place>,
    /// JIT addresses V8 named, and whether from a settled frame.
    named_by_v8: HashMap<u64, (Frame, bool)>,
    kernel: HashSet<u64>,
}

impl Collector {
    pub fn new(pid: i32) -> Collector {
        Collector {
            pid,
            user: HashMap::new(),
            named_by_v8: HashMap::new(),
            kernel: HashSet::new(),
        }
    }

    /// Names a JIT address from V8's heap: that name wins over the perf
    /// map's. One address keeps one name; a settled frame's name replaces
    /// one taken from an innermost frame (whose frame pointer may still
    /// have been its caller's).
    pub fn user_named(&mut self, named: NamedFrame) {
        use std::collections::hash_map::Entry;
        match self.named_by_v8.entry(named.address) {
            Entry::Vacant(v) => {
                v.insert((named.frame, named.settled));
            }
            Entry::Occupied(mut o) => {
                if named.settled && !o.get().1 {
                    o.insert((named.frame, true));
                }
            }
        }
    }

    /// Records a user-space address to name later (a lookup address: return
    /// addresses already moved back into their call instruction), tied to
    /// the mapping of `maps` (the process's) that covers it; the maps are
    /// re-read (as [`ProcessMaps::reread_for`] allows) when none does.
    pub fn user(&mut self, maps: &mut ProcessMaps, addr: u64) {
        if self.user.contains_key(&addr) {
            return;
        }
        let place = place_of(maps.find_or_reread(addr), addr);
        self.user.insert(addr, place);
    }

    pub fn kernel(&mut self, addr: u64) {
        self.kernel.insert(addr);
    }

    /// Names every address seen.
    pub fn finish(self) -> Names {
        self.finish_with(&Symbolizer::new(), None)
    }

    /// Names every address seen with `symbolizer`, which keeps what it
    /// parsed (ELF symbol tables, kallsyms) for the next call, and with
    /// `perf_map` following the process's perf map (else the map is read
    /// whole): the agent names every interval of a process with the same
    /// two.
    pub fn finish_with(
        self,
        symbolizer: &Symbolizer,
        perf_map: Option<&mut perf_map::Follower>,
    ) -> Names {
        let mut names = Names::default();
        let mut by_file: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
        let mut anonymous = Vec::new();
        for (&addr, place) in &self.user {
            match place {
                Place::File { path, offset } => {
                    by_file.entry(path).or_default().push((addr, *offset))
                }
                Place::Anonymous => anonymous.push(addr),
                Place::Special(name) => {
                    names.user.insert(
                        addr,
                        Frame {
                            name: name.clone(),
                            module: name.clone(),
                            line: None,
                        },
                    );
                }
                Place::Unmapped => {
                    names.user.insert(
                        addr,
                        Frame {
                            name: format!("[unknown] {addr:#x}"),
                            module: "[unknown]".into(),
                            line: None,
                        },
                    );
                }
            }
        }
        for (path, addrs) in by_file {
            let offsets: Vec<u64> = addrs.iter().map(|&(_, o)| o).collect();
            let mut elf = Elf::new(path);
            elf.debug_syms = false;
            let src = Source::Elf(elf);
            let results = symbolizer
                .symbolize(&src, Input::FileOffset(&offsets))
                .unwrap_or_default();
            let base = Path::new(path)
                .file_name()
                .map_or(path.to_string(), |f| f.to_string_lossy().into_owned());
            for (i, &(addr, offset)) in addrs.iter().enumerate() {
                let name = match results.get(i) {
                    Some(Symbolized::Sym(sym)) => sym.name.to_string(),
                    _ => format!("[{base}+{offset:#x}]"),
                };
                names.user.insert(
                    addr,
                    Frame {
                        name,
                        module: path.to_string(),
                        line: None,
                    },
                );
            }
        }
        // What V8 named needs no perf map.
        let mut named_by_v8 = self.named_by_v8;
        anonymous.retain(|addr| match named_by_v8.remove(addr) {
            Some((frame, _)) => {
                names.user.insert(*addr, frame);
                names.v8_named += 1;
                false
            }
            None => true,
        });
        let map_path = perf_map::path(self.pid);
        let resolved = match perf_map {
            Some(follower) => follower.resolve(&anonymous),
            // Read as it streams: the map grows for the life of the target.
            None => std::fs::File::open(&map_path).and_then(|f| {
                perf_map::resolve(std::io::BufReader::with_capacity(1 << 16, f), &anonymous)
            }),
        };
        match resolved {
            Ok(found) => {
                names.perf_map = Some(map_path.to_string_lossy().into_owned());
                let mut found = found.names;
                for &addr in &anonymous {
                    let frame = match found.remove(&addr) {
                        Some(name) => {
                            names.perf_map_named += 1;
                            Frame {
                                name,
                                module: "[jit]".into(),
                                line: None,
                            }
                        }
                        None => Frame {
                            name: format!("[anon] {addr:#x}"),
                            module: "[anon]".into(),
                            line: None,
                        },
                    };
                    names.user.insert(addr, frame);
                }
            }
            Err(_) => {
                for &addr in &anonymous {
                    names.user.insert(
                        addr,
                        Frame {
                            name: "[unnamed JIT code]".into(),
                            module: "[anon]".into(),
                            line: None,
                        },
                    );
                }
            }
        }
        names.anonymous_frames = anonymous.len() + names.v8_named;
        let kernel: Vec<u64> = self.kernel.into_iter().collect();
        if !kernel.is_empty() {
            let src = Source::Kernel(Kernel {
                kallsyms: MaybeDefault::Default,
                vmlinux: MaybeDefault::None,
                debug_syms: false,
                ..Default::default()
            });
            let results = symbolizer
                .symbolize(&src, Input::AbsAddr(&kernel))
                .unwrap_or_default();
            for (i, &addr) in kernel.iter().enumerate() {
                let name = match results.get(i) {
                    Some(Symbolized::Sym(sym)) => sym.name.to_string(),
                    _ => format!("[kernel] {addr:#x}"),
                };
                names.kernel.insert(
                    addr,
                    Frame {
                        name,
                        module: "[kernel]".into(),
                        line: None,
                    },
                );
            }
        }
        names
    }
}

/// Where `addr` is, in `mapping` (the one that covers it, if any).
fn place_of(mapping: Option<&Mapping>, addr: u64) -> Place {
    let Some(m) = mapping else {
        return Place::Unmapped;
    };
    if m.is_file_backed() {
        Place::File {
            path: m.name().to_string(),
            offset: addr - m.start + m.offset,
        }
    } else if m.path.starts_with('[') && !m.path.starts_with("[anon") {
        // [vdso], [vsyscall], [stack], [heap]
        Place::Special(m.path.clone())
    } else {
        Place::Anonymous
    }
}

/// Names of the addresses a run saw.
#[derive(Debug, Default)]
pub struct Names {
    pub user: HashMap<u64, Frame>,
    pub kernel: HashMap<u64, Frame>,
    /// The perf map read, if one existed.
    pub perf_map: Option<String>,
    /// Distinct addresses in anonymous (JIT) memory.
    pub anonymous_frames: usize,
    /// Of those, the ones V8's heap named, and the ones the perf map named.
    pub v8_named: usize,
    pub perf_map_named: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(start: u64, end: u64, offset: u64, inode: u64, path: &str) -> Mapping {
        Mapping {
            start,
            end,
            perms: "r-xp".into(),
            offset,
            inode,
            path: path.into(),
        }
    }

    #[test]
    fn addresses_are_tied_to_their_mapping() {
        let maps = ProcessMaps::fixed(vec![
            mapping(0x1000, 0x3000, 0x2000, 5, "/usr/bin/node"),
            mapping(0x4000, 0x5000, 0, 0, ""),
            mapping(0x6000, 0x7000, 0, 0, "[vdso]"),
        ]);
        let place = |addr| place_of(maps.find(addr), addr);
        assert!(
            matches!(place(0x1010), Place::File { ref path, offset: 0x2010 } if path == "/usr/bin/node")
        );
        assert!(matches!(place(0x4100), Place::Anonymous));
        assert!(matches!(place(0x6100), Place::Special(ref s) if s == "[vdso]"));
        assert!(matches!(place(0x9000), Place::Unmapped));
    }

    #[test]
    fn own_executable_symbols_are_found() {
        // This test binary's own code, named through its ELF symbols.
        let pid = std::process::id() as i32;
        let mut maps = ProcessMaps::new(pid, otel_thread_ctx_reader::maps::read(pid).unwrap());
        let addr = own_executable_symbols_are_found as *const () as usize as u64;
        let mut c = Collector::new(pid);
        c.user(&mut maps, addr);
        let names = c.finish();
        let frame = &names.user[&addr];
        assert!(
            frame.name.contains("own_executable_symbols_are_found"),
            "{frame:?}"
        );
    }

    #[test]
    fn names_from_v8_win_and_settled_frames_win_over_innermost_ones() {
        let mut maps = ProcessMaps::fixed(vec![mapping(0x4000, 0x5000, 0, 0, "")]);
        // This process writes no perf map: what V8 did not name is unnamed.
        let mut c = Collector::new(std::process::id() as i32);
        let named = |name: &str, settled| NamedFrame {
            address: 0x4010,
            frame: Frame {
                name: name.into(),
                module: "[jit]".into(),
                line: None,
            },
            settled,
        };
        c.user(&mut maps, 0x4010);
        c.user(&mut maps, 0x4020);
        c.user_named(named("JS:caller /a.js:1:1", false));
        c.user_named(named("JS:callee /a.js:5:1", true));
        c.user_named(named("JS:other /a.js:9:1", false));
        let names = c.finish();
        assert_eq!(names.user[&0x4010].name, "JS:callee /a.js:5:1");
        assert_eq!(names.user[&0x4020].name, "[unnamed JIT code]");
        assert_eq!((names.v8_named, names.anonymous_frames), (1, 2));
    }
}
